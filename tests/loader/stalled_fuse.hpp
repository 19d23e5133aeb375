// A FUSE file system, served over /dev/fuse by the test itself, whose one file never answers a
// read: a file on a stalled network or FUSE mount. Needs root (mount) and /dev/fuse.
#pragma once

#include <fcntl.h>
#include <linux/fuse.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "test_util.hpp"

namespace backplane::testing {

// Mounts at a fresh directory a file system with one regular file, `name`, of `size` bytes
// (owned by root, mode 0644): lookups, attributes and opens are answered, reads never are.
// The destructor unmounts and closes the device: the kernel then ends every request still
// waiting (ENOTCONN). Thread-compatible.
class StalledFuse {
 public:
  StalledFuse(std::string name, uint64_t size) : name_(std::move(name)), size_(size) {
    device_ = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (device_ < 0) {
      why_not_ = std::string("cannot open /dev/fuse: ") + std::strerror(errno);
      return;
    }
    const std::string options =
        "fd=" + std::to_string(device_) + ",rootmode=40000,user_id=0,group_id=0,allow_other";
    if (mount("backplane-stalled", mount_point_.path().c_str(), "fuse", MS_NOSUID | MS_NODEV,
              options.c_str()) != 0) {
      why_not_ = std::string("cannot mount a FUSE file system: ") + std::strerror(errno);
      close(device_);
      device_ = -1;
      return;
    }
    stop_ = eventfd(0, EFD_CLOEXEC);
    server_ = std::thread([this] { Serve(); });
  }
  ~StalledFuse() {
    if (device_ < 0)
      return;
    umount2(mount_point_.path().c_str(), MNT_DETACH);
    // Trap: a thread blocked in read() of the device keeps it open, and the connection ends only
    // when its last descriptor closes. So the server waits in poll() with a stop signal.
    const uint64_t one = 1;
    (void)!write(stop_, &one, sizeof one);
    server_.join();
    close(device_);  // the last one: waiting requests fail with ENOTCONN
    close(stop_);
  }
  StalledFuse(const StalledFuse&) = delete;
  StalledFuse& operator=(const StalledFuse&) = delete;

  // Empty when mounted; otherwise why not.
  const std::string& why_not() const { return why_not_; }
  std::filesystem::path file() const { return mount_point_ / name_; }
  // Reads the kernel has asked for and not been answered.
  int stalled_reads() const { return stalled_reads_.load(); }

 private:
  static constexpr uint64_t kFileNode = 2;

  fuse_attr Attributes(uint64_t node) const {
    fuse_attr attr{};
    attr.ino = node;
    attr.nlink = 1;
    if (node == FUSE_ROOT_ID) {
      attr.mode = S_IFDIR | 0755;
    } else {
      attr.mode = S_IFREG | 0644;
      attr.size = size_;
      attr.blocks = (size_ + 511) / 512;
    }
    return attr;
  }

  template <typename Body>
  void Reply(const fuse_in_header& request, int error, const Body* body) {
    std::vector<char> out(sizeof(fuse_out_header) + (body != nullptr ? sizeof(Body) : 0));
    fuse_out_header header{static_cast<uint32_t>(out.size()), error, request.unique};
    std::memcpy(out.data(), &header, sizeof header);
    if (body != nullptr)
      std::memcpy(out.data() + sizeof header, body, sizeof(Body));
    (void)!write(device_, out.data(), out.size());
  }
  void ReplyError(const fuse_in_header& request, int error) {
    Reply<char>(request, -error, nullptr);
  }

  void Serve() {
    std::vector<char> buffer(1 << 20);
    for (;;) {
      pollfd waits[] = {{device_, POLLIN, 0}, {stop_, POLLIN, 0}};
      if (poll(waits, 2, -1) < 0 && errno == EINTR)
        continue;
      if ((waits[1].revents & POLLIN) != 0)
        return;
      if ((waits[0].revents & POLLIN) == 0)
        continue;
      const ssize_t n = read(device_, buffer.data(), buffer.size());
      if (n < 0 && (errno == EINTR || errno == ENOENT))
        continue;
      if (n < static_cast<ssize_t>(sizeof(fuse_in_header)))
        return;  // unmounted (ENODEV) or closed
      fuse_in_header request;
      std::memcpy(&request, buffer.data(), sizeof request);
      const char* argument = buffer.data() + sizeof request;
      switch (request.opcode) {
        case FUSE_INIT: {
          fuse_init_out init{};
          init.major = FUSE_KERNEL_VERSION;
          init.minor = 31;
          init.max_readahead = 1 << 16;
          init.max_write = 1 << 16;
          init.max_background = 16;
          init.congestion_threshold = 12;
          init.time_gran = 1;
          Reply(request, 0, &init);
          break;
        }
        case FUSE_LOOKUP: {
          if (request.nodeid != FUSE_ROOT_ID || name_ != argument) {
            ReplyError(request, ENOENT);
            break;
          }
          fuse_entry_out entry{};
          entry.nodeid = kFileNode;
          entry.attr = Attributes(kFileNode);
          Reply(request, 0, &entry);
          break;
        }
        case FUSE_GETATTR: {
          fuse_attr_out attr{};
          attr.attr = Attributes(request.nodeid);
          Reply(request, 0, &attr);
          break;
        }
        case FUSE_OPEN: {
          fuse_open_out opened{};
          opened.fh = 1;
          Reply(request, 0, &opened);
          break;
        }
        case FUSE_READ:
          ++stalled_reads_;  // never answered
          break;
        case FUSE_INTERRUPT:
        case FUSE_FORGET:
        case FUSE_BATCH_FORGET:
          break;  // no reply is expected
        case FUSE_FLUSH:
        case FUSE_RELEASE:
          ReplyError(request, 0);
          break;
        default:
          ReplyError(request, ENOSYS);
      }
    }
  }

  TempDir mount_point_;
  const std::string name_;
  const uint64_t size_;
  int device_ = -1;
  int stop_ = -1;
  std::string why_not_;
  std::thread server_;
  std::atomic<int> stalled_reads_{0};
};

}  // namespace backplane::testing
