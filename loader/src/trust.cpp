#include "backplane/loader/trust.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "backplane/core/quoted.hpp"
#include "file_descriptor.hpp"
#include "loader_log.hpp"

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

// Reads identity and content through one descriptor, so that what is recorded as read is what
// was read even when the file is replaced meanwhile.
Result<ReadList> ReadListFile(const fs::path& file) {
  auto io_error = [&](const char* what) {
    return Status{StatusCode::kInvalidArgument, std::string("cannot ") + what +
                                                    " trusted backend list " + file.string() +
                                                    ": " + std::strerror(errno)};
  };
  const FileDescriptor fd(open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (fd.get() < 0)
    return io_error("open");
  struct ::stat st {};
  if (fstat(fd.get(), &st) != 0)
    return io_error("stat");
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument("trusted backend list " + file.string() + " is not a regular file");
  }
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
  std::string text;
  char buffer[1 << 14];
  for (;;) {
    const ssize_t n = read(fd.get(), buffer, sizeof buffer);
    if (n == 0)
      break;
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return io_error("read");
    }
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > kMaxListBytes) {
      return InvalidArgument("trusted backend list " + file.string() + " is larger than " +
                             std::to_string(kMaxListBytes) + " bytes");
    }
  }
  auto digests = ParseDigestList(text, file.string());
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

bool DigestAllowlist::Contains(std::string_view sha256) const {
  auto digest = ParseSha256(sha256);  // in any case, as the list itself is read
  if (!digest.ok())
    return false;
  MutexLock lock(mutex_);
  RefreshLocked();
  return digests_.count(digest.value()) != 0;
}

}  // namespace backplane::loader
