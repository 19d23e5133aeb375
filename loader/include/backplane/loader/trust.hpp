// Which backend content may run in this process. Whoever can write a backend directory otherwise
// gets their code run inside the server; a trust policy is asked about the sealed copy the loader
// made (sealed_image.hpp), after it is made and before anything of it is mapped, so no code of an
// untrusted file runs, not even its static constructors, and nothing swapped in after the copy
// can pass: the bytes judged are the bytes mapped (docs/operators.md, "Securing the backend
// directory").
//
// The loader knows no configuration: the layer above (the registry, from the server's config)
// owns the policy and hands it to Loader::Load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/loader/backend_file.hpp"

namespace backplane::loader {

// One backend file's content, as the loader copied it.
struct TrustSubject {
  std::filesystem::path file;          // as deployed or given: what messages name
  std::span<const std::byte> content;  // the sealed copy: exactly the bytes that would be mapped
  std::string sha256;                  // of `content`, 64 lowercase hex digits
  // The real file the content was copied from (symlinks followed): where a detached signature
  // sits. Empty when unknown (then `file`).
  std::filesystem::path real_path;
};

// What a trust policy holds now, for the server's metrics: an alert must hear of a list that
// trusts nothing because it could not be read.
struct TrustHealth {
  uint64_t digests = 0;           // digests on allowlists
  uint64_t keys = 0;              // public keys of signature policies
  uint64_t list_files = 0;        // allowlists read from a file
  uint64_t unreadable_lists = 0;  // of them, unreadable or malformed when last read (trust none)
};

// Thread-safe: one policy serves every load of a registry, and registries load concurrently.
class TrustPolicy {
 public:
  virtual ~TrustPolicy() = default;
  // Ok when `subject` may be loaded; otherwise a status with reason kUntrusted that names the
  // file, its digest and why.
  virtual Status Check(const TrustSubject& subject) const = 0;
  // A number that changes whenever Check's answers may have changed (an allowlist file
  // rewritten), after re-reading what changed. The registry reports an untrusted file once, and
  // looks at it again only when the file or this number changes.
  virtual uint64_t Revision() const = 0;
  // What the policy trusts, for `check` and logs ("3 digests from /etc/backplane/trusted").
  virtual std::string Describe() const = 0;
  // What the policy trusts now: a list file that changed is re-read first, as Check would, so
  // that a list broken between two loads is seen before the next deploy fails on it.
  virtual TrustHealth Health() const { return {}; }
};

// `text` as a SHA-256 digest: 64 hex digits, returned in lowercase (sha256sum's format).
// kInvalidArgument saying what is wrong with it otherwise.
Result<std::string> ParseSha256(std::string_view text);

// The digests of a file in `sha256sum`'s output format: one "<hex>  <name>" (or "<hex> *<name>",
// or a bare "<hex>") per line; blank lines and lines starting with '#' are ignored. What follows
// the digest is a name for people, never compared: trust is in the content, wherever it is
// published. kInvalidArgument naming `source`, the line number and the line otherwise.
Result<std::set<std::string>> ParseDigestList(std::string_view text, std::string_view source);

// The line sha256sum prints for content with digest `sha256` named `name`: "<hex>  <name>".
// ParseDigestList reads it back.
std::string DigestLine(std::string_view sha256, const std::filesystem::path& name);

// Trusts the content whose SHA-256 is on a list: given once, or read from a file in sha256sum
// format. Thread-safe.
//
// The file is re-read when it changes: its identity (device, inode, size, mtime, ctime) is
// compared at every Check and Revision, i.e. at each load attempt and each registry rescan (the
// watcher's, and the periodic one), so an edit in place and a rename over it are both seen, with
// no watch of its own to re-arm. A file that cannot be read or parsed after a change trusts
// nothing until it is fixed (fails closed), said once per change.
class DigestAllowlist final : public TrustPolicy {
 public:
  // kInvalidArgument naming the first malformed entry (by position) when one is not a digest.
  static Result<std::shared_ptr<DigestAllowlist>> FromDigests(
      const std::vector<std::string>& digests);
  // Reads `file` now: a missing, unreadable or malformed file is an error here (a start with a
  // broken allowlist fails), unlike later, when it fails closed. So is a list that others could
  // rewrite: held to the rule of backend files (CheckOwnership), itself and its folder.
  static Result<std::shared_ptr<DigestAllowlist>> FromFile(std::filesystem::path file);

  Status Check(const TrustSubject& subject) const override BACKPLANE_EXCLUDES(mutex_);
  uint64_t Revision() const override BACKPLANE_EXCLUDES(mutex_);
  std::string Describe() const override BACKPLANE_EXCLUDES(mutex_);
  TrustHealth Health() const override BACKPLANE_EXCLUDES(mutex_);

  // Whether `sha256` (hex, any case) is on the list now.
  bool Contains(std::string_view sha256) const BACKPLANE_EXCLUDES(mutex_);

 private:
  DigestAllowlist(std::set<std::string> digests, std::optional<std::filesystem::path> file,
                  std::optional<FileIdentity> identity);
  // Re-reads the file when its identity changed since it was read.
  void RefreshLocked() const BACKPLANE_REQUIRES(mutex_);
  std::string DescribeLocked() const BACKPLANE_REQUIRES(mutex_);

  const std::optional<std::filesystem::path> file_;  // nullopt: a fixed list
  mutable Mutex mutex_;
  mutable std::set<std::string> digests_ BACKPLANE_GUARDED_BY(mutex_);
  // The file's identity when last read (nullopt: it could not be stat'ed then).
  mutable std::optional<FileIdentity> identity_ BACKPLANE_GUARDED_BY(mutex_);
  mutable Status broken_
      BACKPLANE_GUARDED_BY(mutex_);  // why the file trusts nothing now; ok when usable
  mutable uint64_t revision_ BACKPLANE_GUARDED_BY(mutex_) = 1;
};

// Trusts content with a detached Ed25519 signature beside the file it was copied from
// (`<real file>.sig`, the 64 raw signature bytes, as `openssl pkeyutl -sign -rawin` writes them)
// that verifies, over the content's bytes (the sealed copy, whole: Ed25519 signs a message, not a
// digest), with one of the public keys given (PEM). Thread-safe.
//
// The signature file is opened without blocking and must be a regular file, not a symlink: it
// sits in the backend directory, where anyone who can publish could put a FIFO or a link to a
// device in its place.
//
// A digest whose signature verified once stays trusted for the life of the policy, so the
// private copy a rollback loads (which has no signature beside it) passes as the signed content
// it is. The keys are read once: rotating them is a restart. The signature files of refused
// content are remembered, and Revision grows when one of them appears or changes: a signature
// published after its library is seen at the next rescan, not only at the library's next change.
class SignaturePolicy final : public TrustPolicy {
 public:
  // kInvalidArgument naming the file when one cannot be read or is no Ed25519 public key.
  static Result<std::shared_ptr<SignaturePolicy>> FromKeyFiles(
      const std::vector<std::filesystem::path>& key_files);
  ~SignaturePolicy() override;

  Status Check(const TrustSubject& subject) const override BACKPLANE_EXCLUDES(mutex_);
  uint64_t Revision() const override BACKPLANE_EXCLUDES(mutex_);
  std::string Describe() const override;
  TrustHealth Health() const override;

 private:
  struct Key;
  explicit SignaturePolicy(std::vector<Key> keys);
  Status CheckSignatureFile(const TrustSubject& subject,
                            const std::filesystem::path& signature_file) const;
  void RememberRefused(const std::filesystem::path& signature_file) const
      BACKPLANE_EXCLUDES(mutex_);

  std::vector<Key> keys_;
  mutable Mutex mutex_;
  mutable std::set<std::string> verified_ BACKPLANE_GUARDED_BY(mutex_);  // digests signed by a key
  // Signature files looked at for refused content, with their identity then (nullopt: absent).
  mutable std::map<std::filesystem::path, std::optional<FileIdentity>> refused_signatures_
      BACKPLANE_GUARDED_BY(mutex_);
  mutable uint64_t revision_ BACKPLANE_GUARDED_BY(mutex_) = 1;
};

// Trusts what any of its policies trusts (a digest on the list, or a valid signature).
class AnyOfTrust final : public TrustPolicy {
 public:
  explicit AnyOfTrust(std::vector<std::shared_ptr<const TrustPolicy>> policies);
  Status Check(const TrustSubject& subject) const override;
  uint64_t Revision() const override;
  std::string Describe() const override;
  TrustHealth Health() const override;  // the sum of its policies'

 private:
  const std::vector<std::shared_ptr<const TrustPolicy>> policies_;
};

}  // namespace backplane::loader
