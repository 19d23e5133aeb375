#include "backplane/isolation/channel.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace backplane::isolation {
namespace {

constexpr uint32_t kRegionMagic = 0x42504c31;  // "BPL1"
constexpr std::size_t kHeaderBytes = 4096;

struct RegionHeader {
  uint32_t magic;
  uint32_t slot_count;
  uint64_t payload_bytes;
};

std::size_t SlotBytes(std::size_t payload_bytes) {
  const std::size_t bytes = sizeof(SlotHeader) + payload_bytes;
  return (bytes + kHeaderBytes - 1) / kHeaderBytes * kHeaderBytes;
}

// About as long as a futex wake-up costs: longer spins take the core from the request threads of
// a 2-core machine for nothing (bench/isolation_bench.cpp compares spin times).
constexpr std::chrono::microseconds kSpinTime{20};
constexpr int kSpinsPerYield = 32;

}  // namespace

Status SystemError(std::string_view what) {
  return Internal(std::string(what) + ": " + std::strerror(errno));
}

OwnedFd& OwnedFd::operator=(OwnedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

OwnedFd::~OwnedFd() {
  if (fd_ >= 0)
    ::close(fd_);
}

Result<SharedRegion> SharedRegion::Create(uint32_t slot_count, std::size_t payload_bytes) {
  OwnedFd fd(::memfd_create("backplane-worker-channel", MFD_CLOEXEC));
  if (!fd)
    return SystemError("memfd_create for a worker channel");
  const std::size_t size = kHeaderBytes + slot_count * SlotBytes(payload_bytes);
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
    return SystemError("sizing a worker channel");
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED)
    return SystemError("mapping a worker channel");
  auto* header = static_cast<RegionHeader*>(base);
  header->magic = kRegionMagic;
  header->slot_count = slot_count;
  header->payload_bytes = payload_bytes;
  return SharedRegion(std::move(fd), static_cast<std::byte*>(base), size, slot_count,
                      payload_bytes);
}

Result<SharedRegion> SharedRegion::Map(int raw_fd) {
  OwnedFd fd(raw_fd);
  struct stat status {};
  if (::fstat(fd.get(), &status) != 0)
    return SystemError("the worker channel descriptor");
  const auto size = static_cast<std::size_t>(status.st_size);
  if (size < kHeaderBytes)
    return InvalidArgument("the worker channel is " + std::to_string(size) + " bytes, too small");
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED)
    return SystemError("mapping the worker channel");
  const auto header = *static_cast<const RegionHeader*>(base);
  if (header.magic != kRegionMagic || header.slot_count == 0 ||
      kHeaderBytes + header.slot_count * SlotBytes(header.payload_bytes) != size) {
    ::munmap(base, size);
    return InvalidArgument("the worker channel's header does not describe its size");
  }
  return SharedRegion(std::move(fd), static_cast<std::byte*>(base), size, header.slot_count,
                      header.payload_bytes);
}

SharedRegion::SharedRegion(SharedRegion&& other) noexcept
    : fd_(std::move(other.fd_)),
      base_(std::exchange(other.base_, nullptr)),
      size_(other.size_),
      slot_count_(other.slot_count_),
      payload_bytes_(other.payload_bytes_) {}

SharedRegion::~SharedRegion() {
  if (base_ != nullptr)
    ::munmap(base_, size_);
}

SlotHeader& SharedRegion::header(uint32_t slot) const {
  return *reinterpret_cast<SlotHeader*>(base_ + kHeaderBytes + slot * SlotBytes(payload_bytes_));
}

std::span<std::byte> SharedRegion::payload(uint32_t slot) const {
  return {base_ + kHeaderBytes + slot * SlotBytes(payload_bytes_) + sizeof(SlotHeader),
          payload_bytes_};
}

namespace detail {

bool SpinFor(const std::atomic<uint32_t>& word, uint32_t wanted) {
  // Spins for about kSpinTime, yielding the core now and then: when the other side was woken on
  // this same core, a pure spin would keep it from running until the spin gives up.
  const auto until = std::chrono::steady_clock::now() + kSpinTime;
  for (int i = 1;; ++i) {
    if (word.load(std::memory_order_acquire) == wanted)
      return true;
    if (i % kSpinsPerYield == 0) {
      if (std::chrono::steady_clock::now() >= until)
        return false;
      ::sched_yield();
    }
#if defined(__x86_64__)
    _mm_pause();
#endif
  }
}

void FutexWait(const std::atomic<uint32_t>& word, uint32_t seen,
               std::chrono::milliseconds timeout) {
  timespec relative{};
  relative.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  relative.tv_nsec = static_cast<long>(timeout.count() % 1000) * 1'000'000;
  // Shared (not FUTEX_PRIVATE_FLAG): the other side is another process. EAGAIN (the word moved)
  // and EINTR return as a wake-up does: the caller looks again.
  ::syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&word), FUTEX_WAIT, seen, &relative,
            nullptr, 0);
}

void FutexWakeAll(const std::atomic<uint32_t>& word) {
  ::syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&word), FUTEX_WAKE, INT32_MAX, nullptr,
            nullptr, 0);
}

}  // namespace detail

void SetState(SlotHeader& slot, SlotState state, const std::atomic<uint32_t>& other_sleeping) {
  slot.state.store(static_cast<uint32_t>(state), std::memory_order_seq_cst);
  if (other_sleeping.load(std::memory_order_seq_cst) != 0)
    detail::FutexWakeAll(slot.state);
}

void WakeAll(const SharedRegion& region) {
  for (uint32_t slot = 0; slot < region.slot_count(); ++slot)
    detail::FutexWakeAll(region.header(slot).state);
}

SlotPool::SlotPool(uint32_t slot_count) {
  for (uint32_t slot = slot_count; slot > 0; --slot)
    free_.push_back(slot - 1);
}

std::optional<uint32_t> SlotPool::Acquire() {
  MutexLock lock(mutex_);
  while (!closed_ && free_.empty())
    freed_.wait(mutex_);
  if (closed_)
    return std::nullopt;
  const uint32_t slot = free_.back();
  free_.pop_back();
  return slot;
}

void SlotPool::Release(uint32_t slot) {
  {
    MutexLock lock(mutex_);
    free_.push_back(slot);
  }
  freed_.notify_one();
}

void SlotPool::Close() {
  {
    MutexLock lock(mutex_);
    closed_ = true;
  }
  freed_.notify_all();
}

}  // namespace backplane::isolation
