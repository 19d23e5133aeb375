#include "backplane/scheduler/request_scheduler.hpp"

#include <atomic>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include <tbb/info.h>

#include "backplane/core/thread_name.hpp"

namespace backplane::scheduler {

namespace {

template <typename Call>
Status Guarded(const char* what, Call&& call) {
  try {
    return call();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "backplane: %s threw: %s\n", what, e.what());
    return Internal(std::string(what) + " threw: " + e.what());
  } catch (...) {
    std::fprintf(stderr, "backplane: %s threw a non-standard exception\n", what);
    return Internal(std::string(what) + " threw a non-standard exception");
  }
}

// A TBB worker is otherwise called after whichever thread made TBB start it (a batcher's
// dispatcher, an HTTP thread), and a profile then charges that thread with the requests the
// worker executes. Named once per thread: a worker joins and leaves arenas all the time. An
// embedder's arenas share the workers, which keep the name after they leave this one.
class WorkerNames final : public tbb::task_scheduler_observer {
 public:
  explicit WorkerNames(tbb::task_arena& arena) : tbb::task_scheduler_observer(arena) {
    observe(true);
  }
  ~WorkerNames() override { observe(false); }

  void on_scheduler_entry(bool is_worker) override {
    thread_local bool named = false;
    if (is_worker && !named) {
      NameThisThread("bp-exec");
      named = true;
    }
  }
};

int ArenaSize(const SchedulerOptions& options) {
  return options.max_threads > 0 ? options.max_threads : tbb::info::default_concurrency();
}

}  // namespace

RequestScheduler::RequestScheduler(SchedulerOptions options)
    : options_(options), arena_slots_(ArenaSize(options)) {
  const auto size = static_cast<std::size_t>(arena_slots_);
  // max_allowed_parallelism counts the workers plus one caller; queued requests need `size`
  // workers. Raised only: a larger pool (another runtime's, the embedder's) is left as it is.
  const auto needed = size + 1;
  if (tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism) < needed)
    workers_.emplace(tbb::global_control::max_allowed_parallelism, needed);
  // No slot reserved for callers: with the default one, workers could fill all slots but one,
  // and requests queued by I/O threads (which never join) would run on one core fewer.
  arena_.initialize(static_cast<int>(size), /*reserved_for_masters=*/0);
  worker_names_ = std::make_unique<WorkerNames>(arena_);
}

RequestScheduler::~RequestScheduler() {
  MutexLock lock(drained_mutex_);
  while (in_flight_.load(std::memory_order_acquire) != 0)
    drained_.wait(drained_mutex_);
}

RequestScheduler::Admission::~Admission() {
  if (scheduler_ != nullptr)
    scheduler_->Release();
}

void RequestScheduler::Release() {
  // Trap: decrement and notify under the lock, never decrement first and lock afterwards. The
  // destructor returns as soon as it sees 0; had the count dropped to 0 before this thread locked,
  // the destructor could see it, return and free the mutex and condition variable that this
  // thread was about to lock and notify (a use-after-free when a Runtime is destroyed right after
  // an asynchronous result). Under the lock the destructor cannot see 0 before the unlock, and the
  // unlock is the last time this touches the scheduler. Admit() stays lock-free: it never makes 0.
  MutexLock lock(drained_mutex_);
  if (in_flight_.fetch_sub(1, std::memory_order_acq_rel) == 1)
    drained_.notify_all();
}

Result<RequestScheduler::Admission> RequestScheduler::Admit() {
  std::size_t current = in_flight_.load(std::memory_order_relaxed);
  do {
    if (current >= options_.max_in_flight) {
      return Status(StatusCode::kResourceExhausted,
                    "overloaded: " + std::to_string(current) + " requests in flight (limit " +
                        std::to_string(options_.max_in_flight) + "); retry later");
    }
  } while (!in_flight_.compare_exchange_weak(current, current + 1, std::memory_order_acq_rel));
  return Admission(this);
}

Status RequestScheduler::RunOnCallerThread(const std::function<Status()>& work) {
  // Trap: the count is a promise that a slot is free for this caller, not a reservation. Queued
  // requests' workers may hold slots too (the arena reserves none for callers, see the
  // constructor), and a caller that then finds none is handed to a worker after all, as before;
  // the count only bounds how many callers can be in that position: never more than the slots.
  // Counted only when below the slots (never up and down again when full), so that the count is
  // never seen above them, not even for an instant.
  int in_arena = callers_in_arena_.load(std::memory_order_acquire);
  while (in_arena < arena_slots_ && !callers_in_arena_.compare_exchange_weak(
                                        in_arena, in_arena + 1, std::memory_order_acq_rel)) {
  }
  if (in_arena < arena_slots_) {
    Status status;
    // When TBB does hand `work` to one of its threads, its wait orders the two, but libtbb is not
    // instrumented, so ThreadSanitizer reports every read of the results as a race. The
    // release/acquire pair makes the ordering visible.
    std::atomic<bool> finished{false};
    arena_.execute([&] {
      status = work();
      finished.store(true, std::memory_order_release);
    });
    (void)finished.load(std::memory_order_acquire);
    callers_in_arena_.fetch_sub(1, std::memory_order_acq_rel);
    return status;
  }
  // One slot, reserved for this thread: execute() never hands the work away, and no worker ever
  // joins (a ParallelFor inside runs serially here). One per thread, shared by every scheduler:
  // it holds no state between calls. Host code, so its thread_local destructor pins no backend.
  thread_local tbb::task_arena own_arena(/*max_concurrency=*/1, /*reserved_for_masters=*/1);
  Status status;
  own_arena.execute([&] { status = work(); });
  return status;
}

void RequestScheduler::Enqueue(Admission admission, std::function<Status()> work,
                               std::function<void(Status)> done,
                               std::optional<Clock::time_point> deadline) {
  // TBB wants a copyable, const-callable task; the admission rides in a shared_ptr that the task
  // releases itself, right after `done`, so that the destructor's wait covers the callback too.
  struct Task {
    // Mutable: released inside the task, not whenever TBB destroys its copy.
    mutable std::shared_ptr<Admission> admission;
    mutable std::function<Status()> work;
    mutable std::function<void(Status)> done;
    std::optional<Clock::time_point> deadline;

    void operator()() const {
      Status status;
      if (deadline && Clock::now() > *deadline) {
        status = Status(StatusCode::kDeadlineExceeded,
                        "the request's deadline passed while it was queued; it was not run");
      } else {
        status = Guarded("the request", work);
      }
      // An exception escaping a TBB task aborts the process; a caller's callback must not.
      (void)Guarded("the completion callback", [&] {
        done(std::move(status));
        return Status::Ok();
      });
      work = nullptr;  // what the closures own goes before the runtime may
      done = nullptr;
      admission.reset();
    }
  };
  arena_.enqueue(Task{std::make_shared<Admission>(std::move(admission)), std::move(work),
                      std::move(done), deadline});
}

}  // namespace backplane::scheduler
