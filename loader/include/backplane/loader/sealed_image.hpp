// The bytes of one backend file, read once into a sealed memfd (docs/loading-rules.md rule 1,
// docs/operators.md "Securing the backend directory").
//
// Whatever is judged must be exactly what runs. A path can be renamed over, and a file written,
// by anyone with the rights of the directory it is in, including the private directory of the
// server's own user. So the loader opens the published file once, copies it into an anonymous
// memory file and seals it (no write, no shrink, no grow, no further seals): from then on no one,
// this process included, can change those bytes. The digest, the trust decision, the ELF checks
// and dlopen (through /proc/self/fd/N) all read that one descriptor; no path is opened again.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "backplane/core/status.hpp"
#include "backplane/loader/backend_file.hpp"

namespace backplane::loader {

// Whether any process holds a file open for writing (docs/loading-rules.md rule 7: the lease
// probe), asked of an open fd of it. kUnknown where leases are not available (another owner without
// CAP_LEASE, file systems without lease support).
enum class WriterProbe { kNoWriter, kWriting, kUnknown };
WriterProbe HasWriters(int fd);

// A read-only mapping of a sealed image, unmapped on destruction. Move-only.
class ImageBytes {
 public:
  ImageBytes() = default;
  ImageBytes(ImageBytes&& other) noexcept;
  ImageBytes& operator=(ImageBytes&& other) noexcept;
  ImageBytes(const ImageBytes&) = delete;
  ImageBytes& operator=(const ImageBytes&) = delete;
  ~ImageBytes();

  std::span<const std::byte> span() const { return {data_, size_}; }

 private:
  friend class SealedImage;
  ImageBytes(const std::byte* data, std::size_t size) : data_(data), size_(size) {}
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// One file's content, sealed. Move-only; thread-safe once made (nothing about it can change).
//
// Trap: dlopen finds an already-loaded library by the *name* it was opened with before it looks
// at the file. While a library loaded from "/proc/self/fd/N" is mapped, descriptor N must stay
// open, or a later image given the same number would be answered with the old library. The
// Generation keeps its image for its whole life, and one that glibc keeps mapped after dlclose
// (leaked) keeps its descriptor for the rest of the process (Abandon).
class SealedImage {
 public:
  // The largest backend file read by default: larger than any real backend (oneDNN with every
  // kernel is tens of MiB), small enough that a sparse or endless file costs a bounded read.
  static constexpr uint64_t kDefaultMaxBytes = uint64_t{1} << 30;
  // How long a read may take before it is given up: a gigabyte from a slow disk, with room.
  static constexpr std::chrono::milliseconds kDefaultReadTimeout{30'000};

  // Reads `source` (a path whose symlinks are already resolved: a symlink found in its place is
  // refused, never followed) through one descriptor opened without blocking, and seals the copy,
  // labelled `label` (at most 200 bytes kept) for /proc/<pid>/maps. Errors, each naming the file:
  //  - kNotRegular: not a regular file (a FIFO, device, socket or directory put in its place);
  //  - kTooLarge: larger than `max_bytes`;
  //  - kFileBusy: a process holds it open for writing (the lease probe, rule 7);
  //  - kFileChanged: its identity differs before and after the copy (a writer at work);
  //  - kIoError: it cannot be opened or read, or no memory file can be made, or the open and the
  //    read together took longer than `timeout` (a stalled network or FUSE file system: the read
  //    is abandoned on a thread of its own, and the caller's locks are not held by it).
  static Result<SealedImage> Read(const std::filesystem::path& source, std::string_view label,
                                  uint64_t max_bytes = kDefaultMaxBytes,
                                  std::chrono::milliseconds timeout = kDefaultReadTimeout);

  SealedImage(SealedImage&& other) noexcept;
  SealedImage& operator=(SealedImage&& other) noexcept;
  SealedImage(const SealedImage&) = delete;
  SealedImage& operator=(const SealedImage&) = delete;
  ~SealedImage();

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  // The identity of the source when it was read (identical before and after).
  const FileIdentity& source_identity() const { return source_identity_; }
  // "/proc/self/fd/N": the name dlopen opens it by, and asks about with RTLD_NOLOAD.
  std::filesystem::path ProcPath() const;
  // How /proc/<pid>/maps names its mappings (before " (deleted)"): "/memfd:<label>".
  const std::string& maps_name() const { return maps_name_; }
  // The content, mapped read-only for as long as the result lives. kIoError when it cannot be
  // mapped.
  Result<ImageBytes> Map() const;
  // Writes the content to a new file `target` (mode 0700); kIoError naming it on failure.
  Status WriteTo(const std::filesystem::path& target) const;

  // Gives up the descriptor without closing it, for the rest of the process: for an image whose
  // library glibc kept mapped (see the trap above).
  void Abandon();

 private:
  static Result<SealedImage> ReadNow(const std::filesystem::path& source, const std::string& label,
                                     uint64_t max_bytes);
  SealedImage(int fd, uint64_t size, FileIdentity identity, std::string maps_name)
      : fd_(fd), size_(size), source_identity_(identity), maps_name_(std::move(maps_name)) {}
  int fd_ = -1;
  uint64_t size_ = 0;
  FileIdentity source_identity_;
  std::string maps_name_;
};

}  // namespace backplane::loader
