// Backend files on disk: the naming scheme, the permission policy, file identity, discovery.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/status.hpp"

namespace backplane::loader {

// ArmNN's scheme: <vendor>_<name>_backend.so with optional numeric suffixes (.so.1, .so.1.2.3).
// Vendor and name are letters and digits only.
bool IsBackendFileName(std::string_view file_name);
// The version suffix of a backend file name as numbers (.so.1.2 -> {1, 2}; none -> {}), which
// compare as versions do.
std::vector<uint64_t> BackendFileVersion(std::string_view file_name);
// The family a backend file belongs to: its path without the version suffix
// (dir/Acme_Fast_backend.so.1.2 -> dir/Acme_Fast_backend.so). Every versioned name of a backend
// is one backend.
std::filesystem::path BackendFamily(const std::filesystem::path& path);

// What makes two looks at a file "the same file, unchanged" (rule 7: compare before and after the
// shadow copy; the watcher compares it with what is loaded).
struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;

  friend bool operator==(const FileIdentity&, const FileIdentity&) = default;
};

FileIdentity IdentityOf(const struct ::stat& st);
// The identity of the file `path` resolves to; nullopt when it cannot be stat'ed.
std::optional<FileIdentity> ReadFileIdentity(const std::filesystem::path& path);

struct FilePolicy {
  // Accept files and directories writable by group/others or owned by another user. Off by
  // default: a backend file is code the server runs, so whoever can write it owns the process.
  bool allow_unsafe_permissions = false;
};

// A backend file that passed the checks that need no opening: it exists, its name follows the
// scheme, it is a regular file (after symlinks) and its permissions are safe.
struct BackendFile {
  std::filesystem::path path;       // as found or given (maybe a symlink)
  std::filesystem::path real_path;  // what it resolves to; the identity of the file
};

// NOT_FOUND, NAME_SCHEME, NOT_REGULAR or UNSAFE_PERMISSIONS, in that order.
Result<BackendFile> ResolveBackendFile(const std::filesystem::path& path, const FilePolicy& policy);

// UNSAFE_PERMISSIONS when `what` (a file or directory, with this owner and mode) is writable by
// group or others or owned by neither root nor this process's user; nullopt when it is safe.
std::optional<Status> CheckOwnership(const std::filesystem::path& what, uid_t owner, mode_t mode,
                                     const FilePolicy& policy);

struct RejectedFile {
  std::filesystem::path file;
  Status error;            // why; its reason() is set
  std::string backend_id;  // when the file got far enough to name it, or replaced a known one
  std::filesystem::path resolved_file;  // the real file `file` resolved to; empty when unknown
};

// A name left out because another name of its family speaks for the backend.
struct SupersededFile {
  std::filesystem::path file;
  std::filesystem::path speaking;  // the family's chosen name
};

struct Discovery {
  // One entry per backend family, in directory order, then name order: the name that speaks for
  // it, usable (files) or not (rejected: dangling, unsafe, not a regular file...).
  std::vector<BackendFile> files;
  std::vector<RejectedFile> rejected;
  std::vector<SupersededFile> superseded;  // the family's other versions
  // Entries that are not directories and not named like a backend, hidden names (".x.tmp", the
  // documented temporary name of a deploy) excepted: likely a backend under the wrong name.
  std::vector<std::filesystem::path> misnamed;
};

// Why `file` is not taken for a backend, with the scheme, for people: "not named
// <vendor>_<name>_backend.so[.N...] (vendor and name letters and digits only)".
std::string MisnamedReason();

// The name that speaks for one family, given all of its names present in one directory (sorted):
// the least specific name — the unversioned name, else the name with the fewest version
// components (the SONAME-style link), ties to the highest version. Every other name is a
// leftover that never serves on its own. nullopt for no names.
std::optional<std::filesystem::path> SpeakingName(
    std::span<const std::filesystem::path> family_names);

// Lists the backend files of `directories`, in order. Files not named like a backend are ignored
// (said at debug level). Every versioned name of a backend in one directory (X_backend.so, .so.2,
// .so.2.0.1) is one backend, its family, and SpeakingName() chooses the name that speaks for it
// before anything is resolved; that name is then followed through its symlinks, and a dangling
// or unusable one is rejected (the family's leftovers are not tried instead). A real file reached
// by the speaking names of several families appears once, under the first.
Discovery DiscoverBackendFiles(std::span<const std::filesystem::path> directories,
                               const FilePolicy& policy);

// The directories of `paths` that exist and are directories, in order; the others are dropped
// with a warning naming them and why.
std::vector<std::filesystem::path> ValidBackendDirectories(
    std::span<const std::filesystem::path> paths);

// Splits "a:b:c" (as in $BACKPLANE_BACKEND_PATHS and the compile-time default) into paths,
// skipping empty elements.
std::vector<std::filesystem::path> SplitPathList(std::string_view list);

}  // namespace backplane::loader
