#include "backplane/loader/sealed_image.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "file_descriptor.hpp"
#include "read_deadline.hpp"

namespace backplane::loader {
namespace fs = std::filesystem;

namespace {

// Kernels since 6.3 ask memory files to say whether they may be mapped executable; older kernels
// refuse the flag as unknown (EINVAL), and map any memory file executable.
#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U
#endif

std::string_view KindOf(mode_t mode) {
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISLNK(mode))
    return "a symlink";
  return "not a regular file";
}

std::string FormatSeconds(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", static_cast<double>(duration.count()) / 1000.0);
  return text;
}

Status IoError(const std::string& what) {
  return {LoadReason::kIoError, what + ": " + std::strerror(errno)};
}

FileDescriptor MakeMemoryFile(const std::string& label) {
  int fd = memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_EXEC);
  if (fd < 0 && errno == EINVAL)
    fd = memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  return FileDescriptor(fd);
}

// Copies all of `in` (from its start) to `out`; the number of bytes copied, or -1 with errno set.
// Stops after `limit` + 1 bytes, so that a file that grows past the limit meanwhile is caught.
off_t CopyAll(int in, int out, uint64_t limit) {
  off_t copied = 0;
  while (static_cast<uint64_t>(copied) <= limit) {
    // copy_file_range does not cross into a memory file on every kernel: plain read/write.
    char buffer[1 << 16];
    const ssize_t n = read(in, buffer, sizeof buffer);
    if (n == 0)
      break;
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    for (ssize_t written = 0; written < n;) {
      const ssize_t w = write(out, buffer + written, static_cast<std::size_t>(n - written));
      if (w < 0) {
        if (errno == EINTR)
          continue;
        return -1;
      }
      written += w;
    }
    copied += n;
  }
  return copied;
}

}  // namespace

Result<FileDescriptor> OpenRegularFile(const fs::path& file, std::string_view what,
                                       FinalSymlink symlinks, struct ::stat* st) {
  int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
  if (symlinks == FinalSymlink::kRefuse)
    flags |= O_NOFOLLOW;
  FileDescriptor fd(open(file.c_str(), flags));
  if (fd.get() < 0) {
    if (errno == ELOOP && symlinks == FinalSymlink::kRefuse) {
      return Status{LoadReason::kNotRegular,
                    std::string(what) + " " + file.string() +
                        " is a symlink, not a regular file (not followed: it could name anything)"};
    }
    return IoError("cannot open " + std::string(what) + " " + file.string());
  }
  if (fstat(fd.get(), st) != 0)
    return IoError("cannot stat " + std::string(what) + " " + file.string());
  if (!S_ISREG(st->st_mode)) {
    return Status{LoadReason::kNotRegular, std::string(what) + " " + file.string() + " is " +
                                               std::string(KindOf(st->st_mode)) +
                                               ", not a regular file"};
  }
  // Regular files never block on open, but reads of one on a network or FUSE file system honour
  // O_NONBLOCK in their own ways: read as every other reader does.
  const int status_flags = fcntl(fd.get(), F_GETFL);
  if (status_flags < 0 || fcntl(fd.get(), F_SETFL, status_flags & ~O_NONBLOCK) != 0)
    return IoError("cannot read " + std::string(what) + " " + file.string());
  return fd;
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

ImageBytes::ImageBytes(ImageBytes&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

ImageBytes& ImageBytes::operator=(ImageBytes&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr)
      munmap(const_cast<std::byte*>(data_), size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

ImageBytes::~ImageBytes() {
  if (data_ != nullptr)
    munmap(const_cast<std::byte*>(data_), size_);
}

Result<SealedImage> SealedImage::Read(const fs::path& source, std::string_view label,
                                      uint64_t max_bytes, std::chrono::milliseconds timeout) {
  const std::string kept_label(label.substr(0, 200));  // the kernel keeps 249 bytes of it
  auto read = ReadWithDeadline(
      timeout, [source, kept_label, max_bytes] { return ReadNow(source, kept_label, max_bytes); });
  if (!read) {
    return Status{LoadReason::kIoError,
                  source.string() + " was not read within " + FormatSeconds(timeout) +
                      " (a stalled network or FUSE file system?): the read is abandoned and the "
                      "load refused"};
  }
  return std::move(*read);
}

Result<SealedImage> SealedImage::ReadNow(const fs::path& source, const std::string& kept_label,
                                         uint64_t max_bytes) {
  // One descriptor for the whole read: a rename over the path meanwhile cannot mix two files.
  struct ::stat before {};
  auto in = OpenRegularFile(source, "backend file", FinalSymlink::kRefuse, &before);
  if (!in.ok())
    return std::move(in).error();
  const int in_fd = in->get();
  auto too_large = [&](uint64_t size) {
    return Status{LoadReason::kTooLarge, source.string() + " is " + std::to_string(size) +
                                             " bytes, more than the largest backend file loaded (" +
                                             std::to_string(max_bytes) + " bytes)"};
  };
  if (static_cast<uint64_t>(before.st_size) > max_bytes)
    return too_large(static_cast<uint64_t>(before.st_size));
  if (HasWriters(in_fd) == WriterProbe::kWriting) {
    return Status{LoadReason::kFileBusy,
                  source.string() +
                      " is open for writing by a process; it is loaded once its writer closes "
                      "it (publish with write-temp + fsync + rename to avoid the wait)"};
  }

  FileDescriptor memory = MakeMemoryFile(kept_label);
  if (memory.get() < 0) {
    const bool forbidden = errno == EACCES;
    Status error = IoError("cannot make a memory file for " + source.string());
    if (!forbidden)
      return error;
    return Status{LoadReason::kIoError,
                  error.message() +
                      " (the kernel forbids executable memory files: is the sysctl "
                      "vm.memfd_noexec 2? backends are mapped from one; set it to 0 or 1)"};
  }
  const off_t copied = CopyAll(in_fd, memory.get(), max_bytes);
  if (copied < 0)
    return IoError("cannot read " + source.string());
  if (static_cast<uint64_t>(copied) > max_bytes)
    return too_large(static_cast<uint64_t>(copied));

  struct ::stat after {};
  if (fstat(in_fd, &after) != 0)
    return IoError("cannot stat " + source.string());
  if (IdentityOf(before) != IdentityOf(after) || copied != after.st_size) {
    return Status{LoadReason::kFileChanged,
                  source.string() + " changed while it was being copied (" +
                      std::to_string(before.st_size) + " -> " + std::to_string(after.st_size) +
                      " bytes): a writer is still at work; publish with write-temp + fsync + "
                      "rename"};
  }
  // Trap: F_SEAL_WRITE fails with EBUSY while the kernel still counts a transient reference to a
  // page of the copy (seen once in thousands of loads under load: a page not yet off another
  // CPU's LRU batch). The kernel waits ~150 ms for it itself; a few more tries cover the rest.
  constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;
  int sealed = -1;
  for (int attempt = 0; attempt < 5; ++attempt) {
    sealed = fcntl(memory.get(), F_ADD_SEALS, kSeals);
    if (sealed == 0 || errno != EBUSY)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20 << attempt));
  }
  if (sealed != 0)
    return IoError("cannot seal the memory copy of " + source.string());
  return SealedImage(memory.Release(), static_cast<uint64_t>(copied), IdentityOf(after),
                     "/memfd:" + kept_label);
}

SealedImage::SealedImage(SealedImage&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      size_(std::exchange(other.size_, 0)),
      source_identity_(other.source_identity_),
      maps_name_(std::move(other.maps_name_)) {}

SealedImage& SealedImage::operator=(SealedImage&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0)
      close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = std::exchange(other.size_, 0);
    source_identity_ = other.source_identity_;
    maps_name_ = std::move(other.maps_name_);
  }
  return *this;
}

SealedImage::~SealedImage() {
  if (fd_ >= 0)
    close(fd_);
}

fs::path SealedImage::ProcPath() const {
  std::string path = "/proc/self/fd/";
  path += std::to_string(fd_);
  return path;
}

Result<ImageBytes> SealedImage::Map() const {
  if (size_ == 0)
    return ImageBytes();
  void* data = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
  if (data == MAP_FAILED)
    return IoError("cannot map the sealed copy " + ProcPath().string());
  return ImageBytes(static_cast<const std::byte*>(data), size_);
}

Status SealedImage::WriteTo(const fs::path& target) const {
  FileDescriptor out(
      open(target.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0700));
  if (out.get() < 0)
    return IoError("cannot create " + target.string());
  for (off_t offset = 0; static_cast<uint64_t>(offset) < size_;) {
    char buffer[1 << 16];
    const ssize_t n = pread(fd_, buffer, sizeof buffer, offset);
    if (n <= 0) {
      if (n < 0 && errno == EINTR)
        continue;
      return IoError("cannot read the sealed copy for " + target.string());
    }
    for (ssize_t written = 0; written < n;) {
      const ssize_t w = write(out.get(), buffer + written, static_cast<std::size_t>(n - written));
      if (w < 0) {
        if (errno == EINTR)
          continue;
        return IoError("cannot write " + target.string());
      }
      written += w;
    }
    offset += n;
  }
  return Status::Ok();
}

void SealedImage::Abandon() {
  fd_ = -1;
}

}  // namespace backplane::loader
