#include "backplane/loader/trust.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include "backplane/core/quoted.hpp"
#include "file_descriptor.hpp"
#include "loader_log.hpp"
#include "read_deadline.hpp"

namespace backplane::loader {
namespace fs = std::filesystem;

namespace {

constexpr std::size_t kSha256HexDigits = 64;
// An allowlist is a few lines per trusted build; anything this large is not one.
constexpr std::size_t kMaxListBytes = 16u << 20;

bool IsHexDigit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

struct ReadList {
  std::set<std::string> digests;
  FileIdentity identity;
};

// Reads `fd` to its end, or until more than `limit` bytes are read (the caller then refuses the
// file by its size); nullopt with errno set when a read fails.
std::optional<std::string> ReadAtMost(int fd, std::size_t limit) {
  std::string bytes;
  char buffer[1 << 16];
  while (bytes.size() <= limit) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n == 0)
      break;
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return std::nullopt;
    }
    bytes.append(buffer, static_cast<std::size_t>(n));
  }
  return bytes;
}

// Reads identity and content through one descriptor, so that what is recorded as read is what
// was read even when the file is replaced meanwhile.
Result<ReadList> ReadListFile(const fs::path& file) {
  auto io_error = [&](const char* what) {
    return Status{StatusCode::kInvalidArgument, std::string("cannot ") + what +
                                                    " trusted backend list " + file.string() +
                                                    ": " + std::strerror(errno)};
  };
  // Followed through symlinks (a ConfigMap mounts every file as one), but never blocked on.
  struct ::stat st {};
  auto opened = OpenRegularFile(file, "trusted backend list", FinalSymlink::kFollow, &st);
  if (!opened.ok())
    return Status{StatusCode::kInvalidArgument, opened.error().message()};
  const FileDescriptor fd = std::move(opened).value();
  // Whoever can write the list can trust their own build: the list is held to the rule backend
  // files are (owner root or this user, not writable by group or others), and so is its folder.
  const FilePolicy strict;
  if (auto unsafe = CheckOwnership(file, st.st_uid, st.st_mode, strict))
    return InvalidArgument("trusted backend list: " + unsafe->message());
  struct ::stat folder {};
  const fs::path directory = fs::absolute(file).parent_path();
  if (stat(directory.c_str(), &folder) == 0) {
    if (auto unsafe = CheckOwnership(directory, folder.st_uid, folder.st_mode, strict))
      return InvalidArgument("trusted backend list " + file.string() + ": " + unsafe->message());
  }
  if (static_cast<std::size_t>(st.st_size) > kMaxListBytes) {
    return InvalidArgument("trusted backend list " + file.string() + " is larger than " +
                           std::to_string(kMaxListBytes) + " bytes");
  }
  const auto text = ReadAtMost(fd.get(), kMaxListBytes);
  if (!text)
    return io_error("read");
  if (text->size() > kMaxListBytes) {
    return InvalidArgument("trusted backend list " + file.string() + " is larger than " +
                           std::to_string(kMaxListBytes) + " bytes");
  }
  auto digests = ParseDigestList(*text, file.string());
  if (!digests.ok())
    return std::move(digests).error();
  return ReadList{std::move(digests).value(), IdentityOf(st)};
}

}  // namespace

Result<std::string> ParseSha256(std::string_view text) {
  if (text.size() != kSha256HexDigits) {
    return InvalidArgument(Quoted(text) + " is not a SHA-256 digest: it has " +
                           std::to_string(text.size()) + " characters, a digest 64 hex digits");
  }
  std::string digest(text);
  for (char& c : digest) {
    if (!IsHexDigit(c)) {
      return InvalidArgument(Quoted(text) +
                             " is not a SHA-256 digest: it has a character that is no hex "
                             "digit (" +
                             Quoted(std::string_view(&c, 1)) + ")");
    }
    if (c >= 'A' && c <= 'F')
      c = static_cast<char>(c - 'A' + 'a');
  }
  return digest;
}

Result<std::set<std::string>> ParseDigestList(std::string_view text, std::string_view source) {
  std::set<std::string> digests;
  std::size_t number = 0;
  while (!text.empty()) {
    const auto end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    ++number;
    if (!line.empty() && line.back() == '\r')
      line.remove_suffix(1);
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos || line[first] == '#')
      continue;
    line.remove_prefix(first);
    // sha256sum writes "\<hex>  <name>" when the name has a backslash or a newline in it.
    if (line.front() == '\\')
      line.remove_prefix(1);
    const auto digest_end = line.find_first_of(" \t");
    const std::string_view digest_text = line.substr(0, digest_end);
    auto digest = ParseSha256(digest_text);
    if (!digest.ok()) {
      return InvalidArgument(std::string(source) + " line " + std::to_string(number) + ": " +
                             digest.error().message() +
                             " (expected sha256sum's format: '<64 hex digits>  <name>')");
    }
    digests.insert(std::move(digest).value());
  }
  return digests;
}

std::string DigestLine(std::string_view sha256, const fs::path& name) {
  return std::string(sha256) + "  " + name.string();
}

Result<std::shared_ptr<DigestAllowlist>> DigestAllowlist::FromDigests(
    const std::vector<std::string>& digests) {
  std::set<std::string> parsed;
  for (std::size_t i = 0; i < digests.size(); ++i) {
    auto digest = ParseSha256(digests[i]);
    if (!digest.ok()) {
      return InvalidArgument("entry " + std::to_string(i) + ": " + digest.error().message());
    }
    parsed.insert(std::move(digest).value());
  }
  return std::shared_ptr<DigestAllowlist>(
      new DigestAllowlist(std::move(parsed), std::nullopt, std::nullopt));
}

Result<std::shared_ptr<DigestAllowlist>> DigestAllowlist::FromFile(fs::path file) {
  auto read = ReadListFile(file);
  if (!read.ok())
    return std::move(read).error();
  return std::shared_ptr<DigestAllowlist>(
      new DigestAllowlist(std::move(read->digests), std::move(file), read->identity));
}

DigestAllowlist::DigestAllowlist(std::set<std::string> digests, std::optional<fs::path> file,
                                 std::optional<FileIdentity> identity)
    : file_(std::move(file)), digests_(std::move(digests)), identity_(identity) {}

void DigestAllowlist::RefreshLocked() const {
  if (!file_)
    return;
  const auto identity = ReadFileIdentity(*file_);
  if (identity == identity_)
    return;
  // Changed (or gone, or back): whatever is read now is a new revision, and is said once.
  ++revision_;
  auto read = ReadListFile(*file_);
  if (!read.ok()) {
    identity_ = identity;
    digests_.clear();
    broken_ = std::move(read).error();
    Log().error("{}; no backend file is trusted until it is fixed", broken_.message());
    return;
  }
  identity_ = read->identity;
  digests_ = std::move(read->digests);
  broken_ = Status::Ok();
  Log().info("trusted backend list {} re-read: {} digest(s)", file_->string(), digests_.size());
}

Status DigestAllowlist::Check(const TrustSubject& subject) const {
  MutexLock lock(mutex_);
  RefreshLocked();
  if (digests_.count(subject.sha256) != 0)
    return Status::Ok();
  const std::string why =
      broken_.ok() ? "is not on the trusted backend list (" + DescribeLocked() + ")"
                   : "cannot be checked: " + broken_.message() + ", so nothing is trusted";
  return {LoadReason::kUntrusted,
          subject.file.string() + ": its content (sha256 " + subject.sha256 + ") " + why +
              "; if this build is trusted, add the line `backplane check --digest FILE` prints "
              "for it to the trusted list"};
}

uint64_t DigestAllowlist::Revision() const {
  MutexLock lock(mutex_);
  RefreshLocked();
  return revision_;
}

std::string DigestAllowlist::Describe() const {
  MutexLock lock(mutex_);
  RefreshLocked();
  return DescribeLocked();
}

std::string DigestAllowlist::DescribeLocked() const {
  const std::string count = std::to_string(digests_.size()) + " digest(s)";
  return file_ ? count + " from " + file_->string() : count + " given at start";
}

TrustHealth DigestAllowlist::Health() const {
  MutexLock lock(mutex_);
  RefreshLocked();
  return {.digests = digests_.size(),
          .list_files = file_ ? 1u : 0u,
          .unreadable_lists = file_ && !broken_.ok() ? 1u : 0u};
}

bool DigestAllowlist::Contains(std::string_view sha256) const {
  auto digest = ParseSha256(sha256);  // in any case, as the list itself is read
  if (!digest.ok())
    return false;
  MutexLock lock(mutex_);
  RefreshLocked();
  return digests_.count(digest.value()) != 0;
}

}  // namespace backplane::loader

// ---- Signatures ---------------------------------------------------------------------------------

namespace backplane::loader {

namespace {

constexpr std::size_t kEd25519SignatureBytes = 64;
// A signature sits in the backend directory, which may be on a file system that stalls.
constexpr std::chrono::milliseconds kSignatureReadTimeout{10'000};

using PublicKey = std::unique_ptr<EVP_PKEY, void (*)(EVP_PKEY*)>;

// Reads at most `limit` bytes of the regular file `file`, opened without blocking (`what` names it
// in errors).
Result<std::string> ReadAtMost(const fs::path& file, std::string_view what, FinalSymlink symlinks,
                               std::size_t limit) {
  struct ::stat st {};
  auto fd = OpenRegularFile(file, what, symlinks, &st);
  if (!fd.ok())
    return std::move(fd).error();
  auto bytes = ReadAtMost(fd->get(), limit);
  if (!bytes) {
    return Status{LoadReason::kIoError, "cannot read " + std::string(what) + " " + file.string() +
                                            ": " + std::strerror(errno)};
  }
  return std::move(*bytes);
}

bool Verifies(EVP_PKEY* key, const std::string& signature, std::span<const std::byte> message) {
  const std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> context(EVP_MD_CTX_new(),
                                                                   EVP_MD_CTX_free);
  if (context == nullptr ||
      EVP_DigestVerifyInit(context.get(), nullptr, nullptr, nullptr, key) != 1) {
    return false;
  }
  return EVP_DigestVerify(context.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                          signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                          message.size()) == 1;
}

}  // namespace

struct SignaturePolicy::Key {
  fs::path file;
  PublicKey key;
};

Result<std::shared_ptr<SignaturePolicy>> SignaturePolicy::FromKeyFiles(
    const std::vector<fs::path>& key_files) {
  std::vector<Key> keys;
  for (const fs::path& file : key_files) {
    // Whoever can replace a key can sign their own build: held to the backend files' rule.
    struct ::stat st {};
    if (stat(file.c_str(), &st) == 0) {
      if (auto unsafe = CheckOwnership(file, st.st_uid, st.st_mode, FilePolicy{}))
        return InvalidArgument("signing key: " + unsafe->message());
    }
    const auto pem = ReadAtMost(file, "signing key", FinalSymlink::kFollow, 1 << 16);
    if (!pem.ok())
      return InvalidArgument(pem.error().message());
    const std::unique_ptr<BIO, int (*)(BIO*)> bio(
        BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size())), BIO_free);
    PublicKey key(bio ? PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr) : nullptr,
                  EVP_PKEY_free);
    if (key == nullptr) {
      return InvalidArgument("signing key " + file.string() +
                             " is not a PEM public key ('-----BEGIN PUBLIC KEY-----'; make one "
                             "with: openssl pkey -in private.pem -pubout)");
    }
    if (EVP_PKEY_id(key.get()) != EVP_PKEY_ED25519) {
      return InvalidArgument("signing key " + file.string() +
                             " is not an Ed25519 key (make one with: openssl genpkey -algorithm "
                             "ed25519)");
    }
    keys.push_back({file, std::move(key)});
  }
  if (keys.empty())
    return InvalidArgument("no signing key given: nothing could ever be trusted");
  return std::shared_ptr<SignaturePolicy>(new SignaturePolicy(std::move(keys)));
}

SignaturePolicy::SignaturePolicy(std::vector<Key> keys) : keys_(std::move(keys)) {}
SignaturePolicy::~SignaturePolicy() = default;

Status SignaturePolicy::Check(const TrustSubject& subject) const {
  {
    MutexLock lock(mutex_);
    if (verified_.count(subject.sha256) != 0)
      return Status::Ok();
  }
  const fs::path signed_file = subject.real_path.empty() ? subject.file : subject.real_path;
  const fs::path signature_file = signed_file.string() + ".sig";
  Status verdict = CheckSignatureFile(subject, signature_file);
  if (verdict.ok()) {
    MutexLock lock(mutex_);
    verified_.insert(subject.sha256);
    refused_signatures_.erase(signature_file);
  } else {
    RememberRefused(signature_file);  // (re)publishing it may mend this
  }
  return verdict;
}

Status SignaturePolicy::CheckSignatureFile(const TrustSubject& subject,
                                           const fs::path& signature_file) const {
  const std::string what = subject.file.string() + ": its content (sha256 " + subject.sha256 + ") ";
  auto read = ReadWithDeadline(kSignatureReadTimeout, [signature_file] {
    return ReadAtMost(signature_file, "signature", FinalSymlink::kRefuse, kEd25519SignatureBytes);
  });
  const Result<std::string> signature =
      read ? std::move(*read)
           : Status{LoadReason::kIoError, "signature " + signature_file.string() +
                                              " was not read within 10 s (a stalled file system?)"};
  if (!signature.ok()) {
    return {LoadReason::kUntrusted,
            what + "has no signature: " + signature.error().message() +
                "; publish the signature, a regular file, before the library (openssl pkeyutl "
                "-sign -rawin -inkey KEY -in FILE -out FILE.sig)"};
  }
  if (signature->size() != kEd25519SignatureBytes) {
    return {LoadReason::kUntrusted, what + "has no valid signature: " + signature_file.string() +
                                        " is not an Ed25519 signature (64 bytes)"};
  }
  // The bytes that would be mapped, never the published file, which may have changed since.
  for (const Key& key : keys_) {
    if (Verifies(key.key.get(), *signature, subject.content))
      return Status::Ok();
  }
  return {LoadReason::kUntrusted, what + "has a signature, " + signature_file.string() +
                                      ", that no trusted signing key verifies (" + Describe() +
                                      "): signed by another key, for other content, or damaged"};
}

void SignaturePolicy::RememberRefused(const fs::path& signature_file) const {
  // Bounded: a directory churning through names cannot grow it without end. Forgetting only
  // delays a late signature until its library changes, as before this was remembered.
  constexpr std::size_t kMaxRemembered = 4096;
  std::optional<FileIdentity> identity = ReadFileIdentity(signature_file);
  MutexLock lock(mutex_);
  if (refused_signatures_.size() >= kMaxRemembered && !refused_signatures_.contains(signature_file))
    refused_signatures_.clear();
  refused_signatures_[signature_file] = identity;
}

// A stat per remembered signature file, at each rescan: as cheap as the rescan's own stats of
// the libraries.
uint64_t SignaturePolicy::Revision() const {
  MutexLock lock(mutex_);
  for (auto& [file, identity] : refused_signatures_) {
    std::optional<FileIdentity> now = ReadFileIdentity(file);
    if (now != identity) {
      identity = now;
      ++revision_;
    }
  }
  return revision_;
}

std::string SignaturePolicy::Describe() const {
  std::string files;
  for (const Key& key : keys_)
    files += (files.empty() ? "" : ", ") + key.file.string();
  return std::to_string(keys_.size()) + " signing key(s): " + files;
}

TrustHealth SignaturePolicy::Health() const {
  return {.keys = keys_.size()};
}

AnyOfTrust::AnyOfTrust(std::vector<std::shared_ptr<const TrustPolicy>> policies)
    : policies_(std::move(policies)) {}

Status AnyOfTrust::Check(const TrustSubject& subject) const {
  std::string why;
  for (const auto& policy : policies_) {
    Status verdict = policy->Check(subject);
    if (verdict.ok())
      return verdict;
    why += (why.empty() ? "" : "; nor: ") + verdict.message();
  }
  return {LoadReason::kUntrusted, why};
}

uint64_t AnyOfTrust::Revision() const {
  uint64_t revision = 0;
  for (const auto& policy : policies_)
    revision += policy->Revision();  // each only grows
  return revision;
}

std::string AnyOfTrust::Describe() const {
  std::string described;
  for (const auto& policy : policies_)
    described += (described.empty() ? "" : " or ") + policy->Describe();
  return described;
}

TrustHealth AnyOfTrust::Health() const {
  TrustHealth sum;
  for (const auto& policy : policies_) {
    const TrustHealth health = policy->Health();
    sum.digests += health.digests;
    sum.keys += health.keys;
    sum.list_files += health.list_files;
    sum.unreadable_lists += health.unreadable_lists;
  }
  return sum;
}

}  // namespace backplane::loader
