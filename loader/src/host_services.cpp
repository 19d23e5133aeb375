#include "backplane/loader/host_services.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <string>

#include "backplane/core/backend_call.hpp"
#include "backplane/core/backend_call_record.hpp"
#include "backplane/core/thread_annotations.hpp"

namespace backplane::loader {
namespace {

// What a backend's function threw, kept until the call that waits for it reports it. The first
// one wins; the others are counted only. Thread-safe.
class FailureRecord {
 public:
  // Calls fn (backend code) and records what it throws; never throws.
  template <typename Fn>
  void Guard(Fn&& fn) noexcept {
    GuardBackendCall(std::forward<Fn>(fn), [&](std::string_view what) { Record(what); });
  }

  // OK, or kInternal naming the first failure since the last Take; clears the record.
  Status Take(std::string_view what) BACKPLANE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    if (count_ == 0)
      return Status::Ok();
    Status failure = Internal(std::string(what) + " threw: " + first_ +
                              (count_ > 1 ? " (and " + std::to_string(count_ - 1) + " more)" : "") +
                              " (functions given to the host must not throw)");
    first_.clear();
    count_ = 0;
    return failure;
  }

 private:
  void Record(std::string_view what) BACKPLANE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    if (count_++ == 0)
      first_ = what;
  }

  Mutex mutex_;
  std::string first_ BACKPLANE_GUARDED_BY(mutex_);
  std::size_t count_ BACKPLANE_GUARDED_BY(mutex_) = 0;
};

// A function a backend handed the host, running on some thread (a TBB worker, or the caller's):
// the thread's backend call record says it is that backend's code, as the call that handed it
// over (`caller`, null: none was recorded) and, where given, for the caller's model.
// Thread-compatible: one per function run, on that thread's stack.
class ScopedHostedCall {
 public:
  ScopedHostedCall(const std::optional<BackendCallSite>& caller, const char* model,
                   const char* what) {
    if (caller) {
      BackendCallSite site = *caller;
      site.call = what;
      call_.emplace(site);
    }
    if (model != nullptr)
      model_.emplace(model);
  }

 private:
  std::optional<ScopedBackendCall> call_;
  std::optional<ScopedModelRun> model_;  // declared last: restored first
};

std::optional<BackendCallSite> CallingSite() {
  const BackendCallSite* caller = CurrentBackendCall();
  return caller != nullptr ? std::optional<BackendCallSite>(*caller) : std::nullopt;
}

// Thread-safe as IHostTaskGroup.
class TbbTaskGroup final : public IHostTaskGroup {
 public:
  ~TbbTaskGroup() override {
    // The backend's tasks must be finished before the backend can go on (and before the group's
    // memory goes); a failure nobody waited for is dropped with the group.
    (void)Wait();
  }

  void Run(HostTaskFn task, void* context) override {
    // The lambda is host code: the backend's task returns into it, and only then does TBB's
    // (host-instantiated) task code release the group's wait.
    // The caller's site is copied: its strings are its generation's, which outlives the
    // backend's tasks (it waits for them before it shuts down). Not its model: a task may
    // outlive the request that started it.
    group_->run([this, task, context, caller = CallingSite()] {
      const ScopedHostedCall running(caller, nullptr, "a task given to IHostTaskGroup::Run");
      failures_.Guard([&] { task(context); });
    });
  }

  Status Wait() override {
    group_->wait();  // never throws: every task catches its own exceptions
    return failures_.Take("a task run through IHostTaskGroup");
  }

 private:
  FailureRecord failures_;
  // After failures_: destroyed first. Behind a pointer because ~task_group may throw (a missed
  // wait), which an IHostTaskGroup's destructor must not; it never does here, after Wait.
  std::unique_ptr<tbb::task_group> group_ = std::make_unique<tbb::task_group>();
};

// Thread-safe.
class TbbHost final : public IHost {
 public:
  BackendApiVersion ApiVersion() const override { return kBackendApiVersion; }

  Status ParallelFor(std::size_t n, std::size_t grain, HostRangeFn body, void* context) override {
    grain = std::max<std::size_t>(grain, 1);
    FailureRecord failures;
    if (n <= grain) {
      // One chunk: no task, no hand-off to another thread.
      failures.Guard([&] { body(context, 0, n); });
    } else {
      // Every chunk is the caller's code, on whichever thread runs it; the caller's model is
      // alive until this call returns, after every chunk.
      const std::optional<BackendCallSite> caller = CallingSite();
      const char* model = CurrentModel();
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, grain),
                        [&](const tbb::blocked_range<std::size_t>& range) {
                          const ScopedHostedCall running(caller, model,
                                                         "a body given to IHost::ParallelFor");
                          failures.Guard([&] { body(context, range.begin(), range.end()); });
                        });
    }
    return failures.Take("a ParallelFor body");
  }

  std::unique_ptr<IHostTaskGroup> CreateTaskGroup() override {
    return std::make_unique<TbbTaskGroup>();
  }

  int MaxConcurrency() const override { return tbb::this_task_arena::max_concurrency(); }
};

}  // namespace

IHost& HostServices() {
  // Never destroyed: a backend instance released during static destruction may still use it.
  static TbbHost* const host = new TbbHost();
  return *host;
}

}  // namespace backplane::loader
