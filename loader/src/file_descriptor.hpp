// A file descriptor closed on scope exit, and the one way the loader opens a file it reads.
// Private to the loader.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string_view>
#include <utility>

#include "backplane/core/status.hpp"

namespace backplane::loader {

// Move-only.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { Reset(); }

  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }

 private:
  void Reset() {
    if (fd_ >= 0)
      close(std::exchange(fd_, -1));
  }
  int fd_ = -1;
};

// Which symlinks OpenRegularFile follows at the file's own name.
enum class FinalSymlink {
  kRefuse,  // a path already resolved: a symlink there now was put in its place since
  kFollow,  // a path an operator gave (a Kubernetes ConfigMap mounts every file as a symlink)
};

// Opens `file` for reading, as a regular file, without ever blocking in open(): with O_NONBLOCK,
// a FIFO opens at once and a device is never waited on; then fstat refuses anything but a regular
// file (kNotRegular naming `what` and what it is instead). The descriptor returned is blocking
// again, close-on-exec, and `*st` holds its fstat. kIoError with errno's text when it cannot be
// opened; kNotRegular for a symlink refused by `symlinks`.
Result<FileDescriptor> OpenRegularFile(const std::filesystem::path& file, std::string_view what,
                                       FinalSymlink symlinks, struct ::stat* st);

}  // namespace backplane::loader
