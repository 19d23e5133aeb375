// A limit on how many executions of one network run at once (Triton's instance_group count):
// the requests beyond it wait their turn in arrival order, without a thread.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "backplane/core/status.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/scheduler/request_scheduler.hpp"

namespace backplane::scheduler {

// Thread-safe. Whoever asks for a turn (Acquire) is called back exactly once: with a Slot, at once
// on its own thread when fewer than `limit` slots are out, else on the thread that frees one (the
// Slot's destructor, SetLimit); or with kDeadlineExceeded when its deadline passed first. A
// waiting request is a callback in a queue, not a thread: an asynchronous request waits here
// before it is queued in the arena, so it never holds an arena thread while it waits.
//
// Traps kept in mind here:
//  - the callbacks run outside the lock, on whichever thread frees a slot, often a TBB worker at
//    the end of another request: they must only hand the turn on (queue a task, wake a thread),
//    never run the request themselves or block;
//  - deadlines have no timer of their own: a waiter whose deadline passed is failed the next time
//    the queue moves (a slot freed, a request arriving, the limit changed), which is at the latest
//    when it would have started. The scheduler treats its queued requests the same way;
//  - the invariant that keeps the queue from stalling: someone waits only while every slot is
//    out, so a freed slot always has someone to go to or nobody waiting;
//  - created by Create and held by shared_ptr: each Slot keeps its limit alive, so a slot may be
//    released after whoever made the limit let go of it (a request outliving its network).
class ConcurrencyLimit : public std::enable_shared_from_this<ConcurrencyLimit> {
 public:
  // `limit`: slots out at once; 0 = no limit (every Acquire gets one at once).
  static std::shared_ptr<ConcurrencyLimit> Create(std::size_t limit);
  ConcurrencyLimit(const ConcurrencyLimit&) = delete;
  ConcurrencyLimit& operator=(const ConcurrencyLimit&) = delete;

  // One execution's turn, handed to the next waiter when destroyed. Move-only.
  class Slot {
   public:
    Slot(Slot&& other) noexcept = default;
    Slot& operator=(Slot&&) = delete;
    ~Slot();

   private:
    friend class ConcurrencyLimit;
    explicit Slot(std::shared_ptr<ConcurrencyLimit> limit) : limit_(std::move(limit)) {}
    std::shared_ptr<ConcurrencyLimit> limit_;
  };

  using TurnCallback = std::function<void(Result<Slot>)>;
  // Calls `on_turn` with a slot as soon as one is free and every earlier waiter has had its turn,
  // or with kDeadlineExceeded once `deadline` has passed before that (see the traps above).
  void Acquire(TurnCallback on_turn, std::optional<Clock::time_point> deadline = std::nullopt);
  // Blocks the calling thread until it has a slot, waiting in the same queue (a synchronous
  // Execute, which has no deadline). Never call it on a thread that holds an arena slot.
  Slot AcquireBlocking();

  // Takes effect at once: a higher limit (or 0) starts waiters now, on this thread; a lower one
  // lets the executions running finish and starts nobody until fewer than it run.
  void SetLimit(std::size_t limit);

  struct Counts {
    std::size_t limit = 0;    // 0: none
    std::size_t running = 0;  // slots out
    std::size_t waiting = 0;  // callbacks queued for a slot
  };
  Counts counts() const;

 private:
  struct Waiter {
    TurnCallback on_turn;
    std::optional<Clock::time_point> deadline;
  };
  // What a move of the queue decided, to be told outside the lock.
  struct Turns {
    std::vector<std::pair<TurnCallback, Result<Slot>>> calls;
    void Tell();
  };

  explicit ConcurrencyLimit(std::size_t limit) : limit_(limit) {}
  void Release();
  // Fails the waiters whose deadline passed, then gives free slots to the first waiters.
  void MoveQueue(Turns& turns) BACKPLANE_REQUIRES(mutex_);
  bool HasFreeSlot() const BACKPLANE_REQUIRES(mutex_) { return limit_ == 0 || running_ < limit_; }

  mutable Mutex mutex_;
  std::size_t limit_ BACKPLANE_GUARDED_BY(mutex_);
  std::size_t running_ BACKPLANE_GUARDED_BY(mutex_) = 0;
  std::deque<Waiter> waiters_ BACKPLANE_GUARDED_BY(mutex_);
};

}  // namespace backplane::scheduler
