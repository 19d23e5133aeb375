#include "backplane/loader/shadow_directory.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "backplane/core/thread_annotations.hpp"
#include "file_descriptor.hpp"
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

WriterProbe HasWriters(int fd) {
  // A read lease is granted only while no process has the file open for writing (fcntl(2)).
  // Trap: if a writer opens the file while we hold the lease, the kernel signals us (SIGIO by
  // default, which terminates the process). So the break signal is made SIGURG, whose default
  // action is to ignore it, and the lease is dropped at once.
  if (fcntl(fd, F_SETSIG, SIGURG) != 0)
    return WriterProbe::kUnknown;
  if (fcntl(fd, F_SETLEASE, F_RDLCK) != 0) {
    // EAGAIN: a writer holds it. EACCES/EPERM (not our file, no CAP_LEASE) and EINVAL (file
    // systems without leases): the probe cannot tell; the fstat and ELF checks still apply.
    return errno == EAGAIN ? WriterProbe::kWriting : WriterProbe::kUnknown;
  }
  fcntl(fd, F_SETLEASE, F_UNLCK);
  return WriterProbe::kNoWriter;
}

Result<ShadowCopy> ShadowDirectory::Copy(const fs::path& source, uint64_t generation) const {
  const fs::path target = path_ / (std::to_string(generation) + "-" + source.filename().string());
  // Another loader of this process may have removed the directory when it was last empty.
  if (Status made = MakePrivateDirectory(path_); !made.ok()) {
    return Status{LoadReason::kIoError, made.message()};
  }
  auto io_error = [&](const std::string& what) {
    return Status{LoadReason::kIoError, what + ": " + std::strerror(errno)};
  };

  // One fd for the whole copy: a rename over the path during the copy cannot mix two files.
  FileDescriptor in(open(source.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (in.get() < 0)
    return io_error("cannot open " + source.string());
  struct stat before {};
  if (fstat(in.get(), &before) != 0)
    return io_error("cannot stat " + source.string());
  if (HasWriters(in.get()) == WriterProbe::kWriting) {
    return Status{LoadReason::kFileBusy,
                  source.string() +
                      " is open for writing by a process; it is loaded once its writer closes "
                      "it (publish with write-temp + fsync + rename to avoid the wait)"};
  }

  FileDescriptor out(open(target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0700));
  if (out.get() < 0)
    return io_error("cannot create shadow copy " + target.string());
  auto fail = [&](Status error) {
    unlink(target.c_str());
    return error;
  };

  off_t copied = 0;
  for (;;) {
    const ssize_t n = copy_file_range(in.get(), nullptr, out.get(), nullptr, 1 << 20, 0);
    if (n > 0) {
      copied += n;
      continue;
    }
    if (n == 0)
      break;
    if (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP) {
      // Old kernels and some file systems: plain read/write from where we are.
      char buffer[1 << 16];
      ssize_t r;
      while ((r = read(in.get(), buffer, sizeof buffer)) > 0) {
        for (ssize_t written = 0; written < r;) {
          const ssize_t w = write(out.get(), buffer + written, r - written);
          if (w < 0)
            return fail(io_error("cannot write shadow copy " + target.string()));
          written += w;
        }
        copied += r;
      }
      if (r < 0)
        return fail(io_error("cannot read " + source.string()));
      break;
    }
    return fail(io_error("cannot copy " + source.string() + " to " + target.string()));
  }

  struct stat after {};
  if (fstat(in.get(), &after) != 0)
    return fail(io_error("cannot stat " + source.string()));
  if (IdentityOf(before) != IdentityOf(after) || copied != after.st_size) {
    return fail(Status{LoadReason::kFileChanged,
                       source.string() + " changed while it was being copied (" +
                           std::to_string(before.st_size) + " -> " + std::to_string(after.st_size) +
                           " bytes): a writer is still at work; publish with write-temp + "
                           "fsync + rename"});
  }
  return ShadowCopy{target, IdentityOf(after)};
}

}  // namespace backplane::loader
