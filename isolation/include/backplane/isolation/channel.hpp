// The shared memory between the host and one backend worker: a memfd both map, cut into slots.
// Each slot carries one call at a time, request and reply in place, tensors included; the
// doorbell is the slot's state word, which the waiting side spins on briefly and then sleeps on
// with a futex (it works across processes on a shared mapping).
//
// Why this doorbell: a futex or eventfd round trip with both sides asleep costs about a hundred
// times what a spin that sees the change costs, and a backend call often returns within a few
// wake-ups' time (bench/isolation_bench.cpp), so the waiter spins for about as long as a wake-up
// would cost and then sleeps, leaving the core to others.
//
// Trap: the worker is untrusted. The host reads only what fits in the slot, and never trusts a
// state word it did not expect: a worker that scribbles on the region can fail its own calls,
// never make the host read outside it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/core/thread_annotations.hpp"

namespace backplane::isolation {

// kInternal: `what` failed, with strerror(errno).
Status SystemError(std::string_view what);

// A descriptor that closes itself. Move-only.
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  OwnedFd(OwnedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  OwnedFd& operator=(OwnedFd&& other) noexcept;
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd();

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// The state word of a slot.
enum class SlotState : uint32_t {
  kIdle = 0,     // the host owns the slot
  kRequest = 1,  // the host wrote a request: the worker's turn
  kReply = 2,    // the worker wrote the reply: the host's turn
};

struct alignas(64) SlotHeader {
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> host_sleeping;    // the host waits on `state` with a futex
  std::atomic<uint32_t> worker_sleeping;  // the worker does
  uint32_t reserved;
  uint64_t message_bytes;  // of the request, then of the reply
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// The region as mapped: a header page, then `slot_count` slots of `slot_bytes` each (a SlotHeader
// and the payload). Created by the host, mapped again by the worker from the inherited memfd.
class SharedRegion {
 public:
  static Result<SharedRegion> Create(uint32_t slot_count, std::size_t payload_bytes);
  static Result<SharedRegion> Map(int fd);
  SharedRegion(SharedRegion&& other) noexcept;
  SharedRegion& operator=(SharedRegion&&) = delete;
  ~SharedRegion();

  int fd() const { return fd_.get(); }
  uint32_t slot_count() const { return slot_count_; }
  std::size_t payload_bytes() const { return payload_bytes_; }
  SlotHeader& header(uint32_t slot) const;
  std::span<std::byte> payload(uint32_t slot) const;

 private:
  SharedRegion(OwnedFd fd, std::byte* base, std::size_t size, uint32_t slot_count,
               std::size_t payload_bytes)
      : fd_(std::move(fd)),
        base_(base),
        size_(size),
        slot_count_(slot_count),
        payload_bytes_(payload_bytes) {}

  OwnedFd fd_;
  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
  uint32_t slot_count_ = 0;
  std::size_t payload_bytes_ = 0;
};

// Waits until `slot`'s state is `wanted`: spins, then sleeps on the futex. Returns false when
// `give_up()` holds (checked between sleeps, each at most `poll`) before that; true once wanted.
// A waker that sets `give_up` wakes every slot (WakeAll) so that a sleeper sees it at once.
template <typename GiveUp>
bool WaitForState(SlotHeader& slot, SlotState wanted, std::atomic<uint32_t>& sleeping,
                  GiveUp&& give_up, std::chrono::milliseconds poll);
// Sets the state and wakes the other side if it sleeps.
void SetState(SlotHeader& slot, SlotState state, const std::atomic<uint32_t>& other_sleeping);
// Wakes every sleeper of every slot (the peer died, or the worker stops).
void WakeAll(const SharedRegion& region);

// Internal: the futex calls WaitForState makes.
namespace detail {
bool SpinFor(const std::atomic<uint32_t>& word, uint32_t wanted);
void FutexWait(const std::atomic<uint32_t>& word, uint32_t seen, std::chrono::milliseconds timeout);
void FutexWakeAll(const std::atomic<uint32_t>& word);
}  // namespace detail

template <typename GiveUp>
bool WaitForState(SlotHeader& slot, SlotState wanted, std::atomic<uint32_t>& sleeping,
                  GiveUp&& give_up, std::chrono::milliseconds poll) {
  const auto target = static_cast<uint32_t>(wanted);
  if (detail::SpinFor(slot.state, target))
    return true;
  for (;;) {
    // Dekker with SetState: announce the sleep, then look; the waker stores, then looks at us.
    sleeping.store(1, std::memory_order_seq_cst);
    const uint32_t seen = slot.state.load(std::memory_order_seq_cst);
    if (seen == target) {
      sleeping.store(0, std::memory_order_relaxed);
      return true;
    }
    if (give_up()) {
      sleeping.store(0, std::memory_order_relaxed);
      return false;
    }
    detail::FutexWait(slot.state, seen, poll);
    sleeping.store(0, std::memory_order_relaxed);
    if (slot.state.load(std::memory_order_acquire) == target)
      return true;
  }
}

// The host's side: slots handed to one call at a time. Thread-safe.
class SlotPool {
 public:
  explicit SlotPool(uint32_t slot_count);
  // Waits for a free slot; nullopt when `closed` (the worker is gone).
  std::optional<uint32_t> Acquire() BACKPLANE_EXCLUDES(mutex_);
  void Release(uint32_t slot) BACKPLANE_EXCLUDES(mutex_);
  // Every waiter returns nullopt from now on.
  void Close() BACKPLANE_EXCLUDES(mutex_);

 private:
  Mutex mutex_;
  std::condition_variable_any freed_;
  std::vector<uint32_t> free_ BACKPLANE_GUARDED_BY(mutex_);
  bool closed_ BACKPLANE_GUARDED_BY(mutex_) = false;
};

}  // namespace backplane::isolation
