#include "backplane/loader/backend_file.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "loader_log.hpp"

namespace backplane::loader {
namespace fs = std::filesystem;

namespace {

bool IsAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// Consumes [A-Za-z0-9]+ from `text` at `pos`; false when there is none.
bool ConsumeWord(std::string_view text, std::size_t& pos) {
  const std::size_t start = pos;
  while (pos < text.size() && IsAlnum(text[pos]))
    ++pos;
  return pos > start;
}

std::string ModeString(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

}  // namespace

FileIdentity IdentityOf(const struct ::stat& st) {
  return {st.st_dev, st.st_ino, st.st_size,
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
          static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec};
}

std::optional<FileIdentity> ReadFileIdentity(const fs::path& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0)
    return std::nullopt;
  return IdentityOf(st);
}

// ^[a-zA-Z0-9]+_[a-zA-Z0-9]+_backend\.so(\.[0-9]+)*$, written out: std::regex is slow and this
// runs on every file event.
bool IsBackendFileName(std::string_view name) {
  std::size_t pos = 0;
  if (!ConsumeWord(name, pos) || pos >= name.size() || name[pos++] != '_')
    return false;
  if (!ConsumeWord(name, pos))
    return false;
  constexpr std::string_view kSuffix = "_backend.so";
  if (name.substr(pos, kSuffix.size()) != kSuffix)
    return false;
  pos += kSuffix.size();
  while (pos < name.size()) {
    if (name[pos++] != '.')
      return false;
    const std::size_t digits = pos;
    while (pos < name.size() && name[pos] >= '0' && name[pos] <= '9')
      ++pos;
    if (pos == digits)
      return false;
  }
  return true;
}

std::vector<uint64_t> BackendFileVersion(std::string_view name) {
  std::vector<uint64_t> version;
  const auto so = name.find("_backend.so");
  if (so == std::string_view::npos)
    return version;
  std::string_view suffix = name.substr(so + std::string_view("_backend.so").size());
  while (!suffix.empty() && suffix.front() == '.') {
    suffix.remove_prefix(1);
    uint64_t number = 0;
    while (!suffix.empty() && suffix.front() >= '0' && suffix.front() <= '9') {
      // Saturates: a crafted name with 30 digits must not wrap below a real version.
      const auto digit = static_cast<uint64_t>(suffix.front() - '0');
      number = number > (UINT64_MAX - digit) / 10 ? UINT64_MAX : number * 10 + digit;
      suffix.remove_prefix(1);
    }
    version.push_back(number);
  }
  return version;
}

fs::path BackendFamily(const fs::path& path) {
  const std::string name = path.filename().string();
  const auto so = name.find("_backend.so");
  if (so == std::string::npos)
    return path;
  return path.parent_path() / name.substr(0, so + std::string_view("_backend.so").size());
}

std::optional<Status> CheckOwnership(const fs::path& what, uid_t owner, mode_t mode,
                                     const FilePolicy& policy) {
  if (policy.allow_unsafe_permissions)
    return std::nullopt;
  if ((mode & S_ISVTX) && (mode & S_IWOTH)) {
    return Status{LoadReason::kUnsafePermissions,
                  what.string() + " is a shared directory (mode " + ModeString(mode) +
                      ") where anyone can create files: keep backends in a directory that "
                      "only their owner can write"};
  }
  if (mode & (S_IWGRP | S_IWOTH)) {
    return Status{LoadReason::kUnsafePermissions,
                  what.string() + " is writable by " + ((mode & S_IWOTH) ? "others" : "its group") +
                      " (mode " + ModeString(mode) +
                      "): anyone who can write it can run code in this process; chmod go-w "
                      "it, or allow unsafe permissions explicitly"};
  }
  if (owner != 0 && owner != geteuid()) {
    return Status{LoadReason::kUnsafePermissions,
                  what.string() + " is owned by uid " + std::to_string(owner) +
                      ", neither root nor this process's user (uid " + std::to_string(geteuid()) +
                      "); chown it, or allow unsafe permissions explicitly"};
  }
  return std::nullopt;
}

Result<BackendFile> ResolveBackendFile(const fs::path& path, const FilePolicy& policy) {
  struct stat link_stat {};
  if (lstat(path.c_str(), &link_stat) != 0) {
    return Status{LoadReason::kNotFound,
                  path.string() + " does not exist (" + std::strerror(errno) + ")"};
  }
  if (!IsBackendFileName(path.filename().string())) {
    return Status{LoadReason::kNameScheme,
                  path.string() +
                      " is not named <vendor>_<name>_backend.so[.N...] (vendor "
                      "and name letters and digits only)"};
  }
  std::error_code error;
  fs::path real_path = fs::canonical(path, error);
  if (error) {
    return Status{LoadReason::kNotFound,
                  path.string() + " is a dangling symlink (" + error.message() + ")"};
  }
  struct stat file_stat {};
  if (stat(real_path.c_str(), &file_stat) != 0) {
    return Status{LoadReason::kNotFound,
                  real_path.string() + " cannot be read (" + std::strerror(errno) + ")"};
  }
  if (!S_ISREG(file_stat.st_mode)) {
    return Status{LoadReason::kNotRegular,
                  path.string() +
                      (S_ISDIR(file_stat.st_mode) ? " is a directory" : " is not a regular file") +
                      ", not a shared object"};
  }
  if (auto unsafe = CheckOwnership(real_path, file_stat.st_uid, file_stat.st_mode, policy)) {
    return *std::move(unsafe);
  }
  // The directories matter too: whoever can write them can replace the file.
  std::set<fs::path> directories{real_path.parent_path(), fs::absolute(path, error).parent_path()};
  for (const auto& directory : directories) {
    struct stat dir_stat {};
    if (directory.empty() || stat(directory.c_str(), &dir_stat) != 0)
      continue;
    if (auto unsafe = CheckOwnership(directory, dir_stat.st_uid, dir_stat.st_mode, policy)) {
      return *std::move(unsafe);
    }
  }
  return BackendFile{path, std::move(real_path)};
}

namespace {

// The resolution rule (docs/hot-reload.md): the least specific name speaks for its family — the
// unversioned name, else the name with the fewest version components (the SONAME-style link
// ldconfig maintains), ties to the highest version. Trap: comparing versions alone makes a
// leftover `.so.1.0.0` outrank the `.so.1` link that operators re-point, so the file they just
// pointed away from would serve.
bool Speaks(const fs::path& a, const fs::path& b) {
  const auto version_a = BackendFileVersion(a.filename().string());
  const auto version_b = BackendFileVersion(b.filename().string());
  if (version_a.size() != version_b.size())
    return version_a.size() < version_b.size();
  return version_a > version_b;
}

}  // namespace

std::optional<std::filesystem::path> SpeakingName(std::span<const fs::path> family_names) {
  if (family_names.empty())
    return std::nullopt;
  // Names arrive sorted, so an exact tie (".so.1" and ".so.01") goes to the first in name order.
  fs::path speaking = family_names.front();
  for (const auto& name : family_names.subspan(1)) {
    if (Speaks(name, speaking))
      speaking = name;
  }
  return speaking;
}

std::string MisnamedReason() {
  return "not named <vendor>_<name>_backend.so[.N...] (vendor and name letters and digits only, "
         "e.g. Acme_Fast_backend.so)";
}

Discovery DiscoverBackendFiles(std::span<const fs::path> directories, const FilePolicy& policy) {
  Discovery discovery;
  std::set<fs::path> seen_real_paths;
  for (const auto& directory : directories) {
    std::error_code error;
    std::vector<fs::path> names;
    for (fs::directory_iterator it(directory, error), end; !error && it != end;
         it.increment(error)) {
      names.push_back(it->path());
    }
    if (error) {
      Log().warn("cannot list backend directory {}: {}", directory.string(), error.message());
      continue;
    }
    std::sort(names.begin(), names.end());
    // Every name of the scheme, by family (a map: families in name order).
    std::map<fs::path, std::vector<fs::path>> families;
    for (const auto& path : names) {
      const std::string name = path.filename().string();
      if (IsBackendFileName(name)) {
        families[BackendFamily(path)].push_back(path);
        continue;
      }
      Log().debug("ignoring {}: {}", path.string(), MisnamedReason());
      std::error_code ignored;
      if (!name.starts_with('.') && !fs::is_directory(path, ignored))
        discovery.misnamed.push_back(path);
    }
    for (const auto& [family, family_names] : families) {
      // The speaking name is chosen before anything is resolved: a leftover that happens to be
      // the link's target, or a usable leftover beside a broken speaking name, never serves.
      const fs::path speaking = *SpeakingName(family_names);
      for (const auto& name : family_names) {
        if (name != speaking) {
          Log().debug("ignoring {}: {} speaks for that backend", name.string(), speaking.string());
          discovery.superseded.push_back({name, speaking});
        }
      }
      auto file = ResolveBackendFile(speaking, policy);
      if (!file.ok()) {
        discovery.rejected.push_back({speaking, std::move(file).error()});
        continue;
      }
      if (!seen_real_paths.insert(file->real_path).second) {
        Log().debug("ignoring {}: same file as an earlier backend name ({})", speaking.string(),
                    file->real_path.string());
        continue;
      }
      discovery.files.push_back(*std::move(file));
    }
  }
  return discovery;
}

std::vector<fs::path> ValidBackendDirectories(std::span<const fs::path> paths) {
  std::vector<fs::path> valid;
  for (const auto& path : paths) {
    std::error_code error;
    if (!fs::exists(path, error)) {
      Log().warn("backend path {} dropped: it does not exist", path.string());
    } else if (!fs::is_directory(path, error)) {
      Log().warn("backend path {} dropped: it is not a directory", path.string());
    } else if (access(path.c_str(), R_OK | X_OK) != 0) {
      Log().warn("backend path {} dropped: it is not readable ({})", path.string(),
                 std::strerror(errno));
    } else {
      valid.push_back(path);
    }
  }
  return valid;
}

std::vector<fs::path> SplitPathList(std::string_view list) {
  std::vector<fs::path> paths;
  while (!list.empty()) {
    const auto colon = list.find(':');
    const auto element = list.substr(0, colon);
    if (!element.empty())
      paths.emplace_back(element);
    if (colon == std::string_view::npos)
      break;
    list.remove_prefix(colon + 1);
  }
  return paths;
}

}  // namespace backplane::loader
