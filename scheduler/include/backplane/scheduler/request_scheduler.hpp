// The request scheduler: runs requests as TBB tasks in the runtime's own arena, refusing work
// beyond a limit on requests in flight instead of queueing it without bound.
#pragma once

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <optional>
#include <utility>

#include "backplane/core/status.hpp"
#include "backplane/core/thread_annotations.hpp"

namespace backplane::scheduler {

struct SchedulerOptions {
  // Threads of the arena that runs requests and their kernels; 0 = one per core. Queued requests
  // run on TBB workers and may take every slot: the scheduler raises TBB's worker count to the
  // arena's size when it is lower (TBB's default is one per core less one, for a caller that a
  // queued request does not have). A synchronous Execute joins the arena on its caller's thread
  // when a slot is free, and otherwise waits while a worker runs it.
  int max_threads = 0;
  // Requests admitted at once (running or queued in the arena); beyond it, refused at once.
  std::size_t max_in_flight = 64;
};

using Clock = std::chrono::steady_clock;

// Thread-safe. The destructor waits for every admitted request to finish.
class RequestScheduler {
 public:
  explicit RequestScheduler(SchedulerOptions options = {});
  ~RequestScheduler();
  RequestScheduler(const RequestScheduler&) = delete;
  RequestScheduler& operator=(const RequestScheduler&) = delete;

  // A slot among the requests in flight, released on destruction. Move-only.
  class Admission {
   public:
    Admission(Admission&& other) noexcept : scheduler_(std::exchange(other.scheduler_, nullptr)) {}
    Admission& operator=(Admission&&) = delete;
    ~Admission();

   private:
    friend class RequestScheduler;
    explicit Admission(RequestScheduler* scheduler) : scheduler_(scheduler) {}
    RequestScheduler* scheduler_;
  };

  // kResourceExhausted ("overloaded") when max_in_flight requests are already admitted.
  Result<Admission> Admit();

  // Runs `work` inside the arena on the calling thread (its parallel kernels use the arena's
  // workers) and returns its status.
  Status RunInArena(const std::function<Status()>& work);

  // Queues `work` in the arena; `done` gets its status, or kDeadlineExceeded when `deadline`
  // passed before the request started. The admission is held until `done` returns.
  void Enqueue(Admission admission, std::function<Status()> work, std::function<void(Status)> done,
               std::optional<Clock::time_point> deadline = std::nullopt);

  std::size_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
  const SchedulerOptions& options() const { return options_; }

 private:
  void Release() BACKPLANE_EXCLUDES(drained_mutex_);

  const SchedulerOptions options_;
  // Process-wide, and the smallest active value wins: an embedder's own lower limit still holds.
  std::optional<tbb::global_control> workers_;
  tbb::task_arena arena_;
  // Goes up without the lock (Admit) but down only under drained_mutex_ (Release), so that the
  // destructor, which waits for 0 under that lock, cannot free the lock while a Release uses it.
  std::atomic<std::size_t> in_flight_{0};
  Mutex drained_mutex_;
  std::condition_variable_any drained_;  // waits on drained_mutex_ itself
};

}  // namespace backplane::scheduler
