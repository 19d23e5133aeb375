// A TBB arena that confines the tasks of one backend generation, and knows when no thread is in
// it any more (docs/loading-rules.md rule 5, the fallback for backends that use TBB directly).
#pragma once

#include <tbb/task_arena.h>
#include <tbb/task_scheduler_observer.h>

#include <condition_variable>
#include <cstdint>
#include <functional>

#include "backplane/core/thread_annotations.hpp"

namespace backplane::loader {

// Why an arena of its own: TBB's task templates compiled into a backend keep a worker in the
// backend's code for a few instructions after the task released its waiter, so "every wait
// returned" does not mean "no thread is in the code". Which thread, and for how long, nothing
// says; sleeping before dlclose is a guess. A task runs in the arena it was spawned in, so when
// every call into the backend runs inside this arena (Execute), every task the backend spawns,
// and every worker that runs one, is inside it too. TBB tells an observer of the arena each time
// a thread enters or leaves it; a worker leaves only from TBB's dispatch loop, after its task's
// code has returned. So once no thread is inside (WaitUntilEmpty), none is in the backend's code.
// Why not wait for "every TBB worker of the process idle" instead: oneTBB has no process-wide
// view. An observer watches one arena, every external thread that runs TBB work has an implicit
// arena of its own, and a busy server's arenas are never all empty. This arena is the
// generation's alone and empties as soon as its tasks are done.
//
// Traps kept in mind here:
//  - The observer must see every entry: it is attached right after the arena is created, before
//    anything runs in it, and TBB reports a thread's exit only to observers that saw its entry.
//  - Work the backend hands to an arena of its own (a tbb::task_arena it creates), or to a
//    thread it starts, is not in this arena: Shutdown() must finish it (it must anyway).
//  - Workers leave an arena when it has no more work; a backend that leaves work queued after
//    Shutdown() keeps the arena occupied, and the reaper waits (a hang in a test, not a crash).
//
// Thread-safe.
class TbbConfinement {
 public:
  TbbConfinement();
  ~TbbConfinement();
  TbbConfinement(const TbbConfinement&) = delete;
  TbbConfinement& operator=(const TbbConfinement&) = delete;

  // Runs `call` inside the arena (on the calling thread when a slot is free), and returns when it
  // has; exceptions pass through.
  void Execute(const std::function<void()>& call);

  // Blocks until no thread is inside the arena. Call once nothing will run in it again.
  void WaitUntilEmpty() BACKPLANE_EXCLUDES(mutex_);

  uint64_t entries() const BACKPLANE_EXCLUDES(mutex_);

 private:
  class Observer final : public tbb::task_scheduler_observer {
   public:
    Observer(tbb::task_arena& arena, TbbConfinement& owner)
        : tbb::task_scheduler_observer(arena), owner_(owner) {}
    void on_scheduler_entry(bool) override { owner_.Entered(); }
    void on_scheduler_exit(bool) override { owner_.Left(); }

   private:
    TbbConfinement& owner_;
  };

  void Entered() BACKPLANE_EXCLUDES(mutex_);
  void Left() BACKPLANE_EXCLUDES(mutex_);

  mutable Mutex mutex_;
  std::condition_variable_any empty_;
  int64_t inside_ BACKPLANE_GUARDED_BY(mutex_) = 0;
  uint64_t entries_ BACKPLANE_GUARDED_BY(mutex_) = 0;
  tbb::task_arena arena_;
  Observer observer_;  // after arena_: stops observing before the arena goes
};

}  // namespace backplane::loader
