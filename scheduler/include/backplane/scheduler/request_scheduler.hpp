// The request scheduler: runs requests as TBB tasks in the runtime's own arena, refusing work
// beyond a limit on requests in flight instead of queueing it without bound.
#pragma once

#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <tbb/task_scheduler_observer.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "backplane/core/status.hpp"
#include "backplane/core/thread_annotations.hpp"

namespace backplane::scheduler {

struct SchedulerOptions {
  // Threads of the arena that runs requests and their kernels; 0 = one per core. Queued requests
  // run on TBB workers and may take every slot: the scheduler raises TBB's worker count to the
  // arena's size when it is lower (TBB's default is one per core less one, for a caller that a
  // queued request does not have). A synchronous Execute always runs on its caller's thread: it
  // joins the arena while fewer callers than max_threads are inside, else runs beside it
  // (RunOnCallerThread).
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

  // Runs `work` on the calling thread, never on a worker, and returns its status (ONNX Runtime's
  // Run does the same). While fewer callers than the arena has slots are inside it, the caller
  // joins the arena, and the work's parallel kernels (IHost::ParallelFor) use the arena's workers;
  // a caller beyond that runs the work in a one-slot arena of its own thread, its parallel kernels
  // serial: callers beyond the cores only take turns on them, and more threads would not help.
  // Why not always join: TBB's execute() on an arena without a free slot hands the work to a
  // worker and blocks the caller until it is done. With more callers than slots, each call became
  // a handoff (wake a worker, put the caller to sleep, wake it), and the workers that came for
  // the handoffs held the slots the next callers wanted: 4 callers on 2 cores ran at a quarter
  // of 2 callers' throughput. Work run here is not counted as admitted: take an Admission first.
  Status RunOnCallerThread(const std::function<Status()>& work);

  // Callers of RunOnCallerThread inside the arena now, for tests.
  int callers_in_arena() const { return callers_in_arena_.load(std::memory_order_relaxed); }

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
  // Names TBB's workers "bp-exec" as they join arena_ (after it: detached before it goes).
  std::unique_ptr<tbb::task_scheduler_observer> worker_names_;
  const int arena_slots_;
  // Raised before a caller joins the arena and lowered after it left; a caller that finds it at
  // arena_slots_ runs beside the arena instead (RunOnCallerThread).
  std::atomic<int> callers_in_arena_{0};
  // Goes up without the lock (Admit) but down only under drained_mutex_ (Release), so that the
  // destructor, which waits for 0 under that lock, cannot free the lock while a Release uses it.
  std::atomic<std::size_t> in_flight_{0};
  Mutex drained_mutex_;
  std::condition_variable_any drained_;  // waits on drained_mutex_ itself
};

}  // namespace backplane::scheduler
