#include "durable_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace backplane::registry_detail {
namespace fs = std::filesystem;

namespace {

Status IoFailure(const std::string& what, const fs::path& file) {
  return {LoadReason::kIoError,
          "cannot " + what + " " + file.string() + ": " + std::strerror(errno)};
}

// fsync of a path opened read-only: enough for a directory entry and for data already written.
Status SyncPath(const fs::path& path, bool directory) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0)
    return IoFailure("open", path);
  const int synced = fsync(fd);
  Status status = synced == 0 ? Status::Ok() : IoFailure("fsync", path);
  close(fd);
  return status;
}

fs::path DirectoryOf(const fs::path& file) {
  return file.has_parent_path() ? file.parent_path() : fs::path(".");
}

}  // namespace

Status WriteFileDurably(const fs::path& file, std::string_view text) {
  const fs::path temporary = file.string() + ".tmp";
  const int fd =
      open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return IoFailure("create", temporary);
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      Status failed = IoFailure("write", temporary);
      close(fd);
      unlink(temporary.c_str());
      return failed;
    }
    done += static_cast<std::size_t>(n);
  }
  if (fsync(fd) != 0) {
    Status failed = IoFailure("fsync", temporary);
    close(fd);
    unlink(temporary.c_str());
    return failed;
  }
  close(fd);
  if (rename(temporary.c_str(), file.c_str()) != 0) {
    Status failed = IoFailure("rename " + temporary.string() + " over", file);
    unlink(temporary.c_str());
    return failed;
  }
  return SyncPath(DirectoryOf(file), /*directory=*/true);
}

Status SyncFileAndDirectory(const fs::path& file) {
  BACKPLANE_RETURN_IF_ERROR(SyncPath(file, /*directory=*/false));
  return SyncPath(DirectoryOf(file), /*directory=*/true);
}

}  // namespace backplane::registry_detail
