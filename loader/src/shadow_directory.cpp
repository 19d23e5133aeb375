#include "backplane/loader/shadow_directory.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "backplane/core/thread_annotations.hpp"
#include "loader_log.hpp"

namespace backplane::loader {
namespace fs = std::filesystem;

namespace {

fs::path DefaultRoot() {
  for (const char* variable : {"BACKPLANE_SHADOW_DIR", "TMPDIR"}) {
    const char* value = std::getenv(variable);
    if (value != nullptr && *value != '\0')
      return value;
  }
  return "/tmp";
}

// Creates `path` as a directory only we can use, or accepts an existing one that already is.
// Refuses one that someone else could have planted (a symlink, another owner, open mode).
Status MakePrivateDirectory(const fs::path& path) {
  if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return Internal("cannot create shadow directory " + path.string() + ": " +
                    std::strerror(errno));
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    return Internal("cannot stat shadow directory " + path.string() + ": " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    return FailedPrecondition("shadow directory " + path.string() +
                              " is not a private directory of this user (a symlink, another "
                              "owner, or mode not 0700); remove it or set BACKPLANE_SHADOW_DIR");
  }
  return Status::Ok();
}

bool ProcessExists(pid_t pid) {
  return kill(pid, 0) == 0 || errno != ESRCH;
}

}  // namespace

Result<std::shared_ptr<ShadowDirectory>> ShadowDirectory::Create(fs::path root) {
  if (root.empty())
    root = DefaultRoot();
  const fs::path base = root / ("backplane-" + std::to_string(geteuid()));
  BACKPLANE_RETURN_IF_ERROR(MakePrivateDirectory(base));

  // Shadows of processes that died without cleaning up, and of an earlier process with our pid.
  // Once per process and root: a second loader must not delete the first one's live shadows.
  static Mutex mutex;
  static std::set<fs::path> cleaned_bases BACKPLANE_GUARDED_BY(mutex);
  MutexLock lock(mutex);
  if (cleaned_bases.insert(base).second) {
    std::error_code error;
    const std::string own_pid = std::to_string(getpid());
    for (fs::directory_iterator it(base, error), end; !error && it != end; it.increment(error)) {
      const std::string name = it->path().filename().string();
      char* name_end = nullptr;
      const long pid = std::strtol(name.c_str(), &name_end, 10);
      if (name_end == name.c_str() || *name_end != '\0')
        continue;
      if (name == own_pid || !ProcessExists(static_cast<pid_t>(pid))) {
        std::error_code remove_error;
        const auto removed = fs::remove_all(it->path(), remove_error);
        Log().debug("removed {} stale shadow entries in {}", removed, it->path().string());
      }
    }
  }
  const fs::path path = base / std::to_string(getpid());
  BACKPLANE_RETURN_IF_ERROR(MakePrivateDirectory(path));
  return std::shared_ptr<ShadowDirectory>(new ShadowDirectory(path));
}

ShadowDirectory::~ShadowDirectory() {
  std::error_code error;
  fs::remove(path_, error);  // only succeeds when empty: a leaked generation keeps its shadow
}

}  // namespace backplane::loader
