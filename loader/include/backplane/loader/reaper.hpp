// The reaper: the one host thread where backend instances are shut down and destroyed and where
// libraries are closed (docs/loading-rules.md rule 6). Nothing that runs backend teardown code may
// run on a request thread or inside backend code, where the code being unmapped could still be on
// the stack.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace backplane::loader {

// Thread-safe. Owned through shared_ptr; deleters that hand objects to it hold a weak_ptr, and
// when the reaper is gone they dispose inline (the process is shutting down).
class Reaper {
 public:
  Reaper();
  ~Reaper();  // finishes everything queued, then joins
  Reaper(const Reaper&) = delete;
  Reaper& operator=(const Reaper&) = delete;

  // Queues `disposal` to run on the reaper thread. Returns false (and does not run it) when the
  // reaper is stopping; the caller then disposes inline.
  bool Post(std::function<void()> disposal);

  // Blocks until nothing is queued or running. A disposal may queue more (an instance releasing
  // the last lease on its generation); those are waited for too.
  void WaitIdle();

  bool OnReaperThread() const;

 private:
  // Shared with the thread: when the last owner of the Reaper is a disposal running on the
  // reaper thread itself, the Reaper is destroyed under the running loop, which must still find
  // its queue and lock afterwards.
  struct State;
  static void Run(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_;
  std::thread thread_;  // last: starts after the state it uses
};

// A shared_ptr whose last release hands `object` to `reaper` for destruction.
template <typename T>
std::shared_ptr<T> MakeReaped(std::unique_ptr<T> object, const std::shared_ptr<Reaper>& reaper) {
  std::weak_ptr<Reaper> weak = reaper;
  return std::shared_ptr<T>(object.release(), [weak](T* doomed) {
    auto destroy = [doomed] { delete doomed; };
    if (auto strong = weak.lock(); strong && strong->Post(destroy))
      return;
    destroy();
  });
}

}  // namespace backplane::loader
