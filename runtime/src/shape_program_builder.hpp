// The thread that builds shape programs off the request path, for every network of one Runtime.
// Private to runtime/src.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <thread>

#include "backplane/core/thread_annotations.hpp"

namespace backplane {

// One thread and a bounded queue of builds (LoadedNetwork's shape programs: backend compiles).
// The first request at a new shape queues its program's build here and runs the load-time
// per-layer steps itself, so no request waits for a compile.
//
// Why one thread: a compile is CPU-bound backend work (CpuAcc times convolution candidates), and
// requests must keep the cores; one thread bounds what compiles take from them to one core, and
// builds of different networks simply take turns (each build runs on a thread of its own that
// ends with it, joined by this one: see Loop for the OpenMP trap). Not a TBB worker: those serve
// requests, and a compile parked on one would hold a request's slot. Why a bounded queue: a client
// that sends a new shape per request must not pile up unbounded work (and memory: each build holds
// its shapes); a build that does not fit is refused, the request releases its claim and a later
// request of that shape queues it again.
//
// Thread-safe. Shutdown (also the destructor) drops the builds not started (destroying them on
// the caller's thread) and waits for the running one. The builds own what they touch (a
// LoadedNetwork's build holds a weak_ptr to it): the builder knows nothing of networks.
class ShapeProgramBuilder {
 public:
  static constexpr std::size_t kDefaultQueueCapacity = 16;

  explicit ShapeProgramBuilder(std::size_t queue_capacity = kDefaultQueueCapacity);
  ~ShapeProgramBuilder();
  ShapeProgramBuilder(const ShapeProgramBuilder&) = delete;
  ShapeProgramBuilder& operator=(const ShapeProgramBuilder&) = delete;

  // Queues `build` to run on the builder's thread. False when the queue is full or after
  // Shutdown: then `build` has been destroyed, on this thread, before Submit returns.
  bool Submit(std::function<void()> build) BACKPLANE_EXCLUDES(mutex_);
  // Drops the builds not started and waits for the running one; Submit refuses from then on.
  // Idempotent, from one thread at a time (the Runtime's destructor, then this destructor). Must
  // not be called from a build (it would wait for itself).
  void Shutdown() BACKPLANE_EXCLUDES(mutex_);

 private:
  void Loop() BACKPLANE_EXCLUDES(mutex_);

  const std::size_t queue_capacity_;
  Mutex mutex_;
  std::condition_variable_any wake_;  // waits on mutex_ itself
  std::deque<std::function<void()>> queue_ BACKPLANE_GUARDED_BY(mutex_);
  bool stopping_ BACKPLANE_GUARDED_BY(mutex_) = false;
  std::thread thread_;  // last: starts after the state it uses
};

}  // namespace backplane
