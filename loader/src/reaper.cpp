#include "backplane/loader/reaper.hpp"

#include <spdlog/spdlog.h>

#include <condition_variable>
#include <deque>

#include "backplane/core/backend_call.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/core/thread_name.hpp"

namespace backplane::loader {

struct Reaper::State {
  Mutex mutex;
  // condition_variable_any waits on the Mutex itself, so the analysis sees it held throughout.
  std::condition_variable_any wake;
  std::condition_variable_any idle;
  std::deque<std::function<void()>> queue BACKPLANE_GUARDED_BY(mutex);
  bool running_disposal BACKPLANE_GUARDED_BY(mutex) = false;
  bool stopping BACKPLANE_GUARDED_BY(mutex) = false;
  std::thread::id thread_id;  // set before the first Post
};

Reaper::Reaper()
    : state_(std::make_shared<State>()), thread_([state = state_] {
        NameThisThread("bp-reaper");
        Run(state);
      }) {
  state_->thread_id = thread_.get_id();
}

Reaper::~Reaper() {
  {
    MutexLock lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  // The last owner may be a disposal running on the reaper itself; it cannot join itself. The
  // detached thread finishes the queue and exits, keeping the state alive until then.
  if (OnReaperThread()) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

bool Reaper::OnReaperThread() const {
  return std::this_thread::get_id() == state_->thread_id;
}

bool Reaper::Post(std::function<void()> disposal) {
  {
    MutexLock lock(state_->mutex);
    if (state_->stopping && !OnReaperThread())
      return false;
    state_->queue.push_back(std::move(disposal));
  }
  state_->wake.notify_one();
  return true;
}

void Reaper::WaitIdle() {
  MutexLock lock(state_->mutex);
  while (!state_->queue.empty() || state_->running_disposal)
    state_->idle.wait(state_->mutex);
}

void Reaper::Run(const std::shared_ptr<State>& state) {
  MutexLock lock(state->mutex);
  for (;;) {
    while (!state->stopping && state->queue.empty())
      state->wake.wait(state->mutex);
    if (state->queue.empty()) {
      if (state->stopping)
        return;
      continue;
    }
    auto disposal = std::move(state->queue.front());
    state->queue.pop_front();
    state->running_disposal = true;
    {
      MutexUnlock unlocked(state->mutex);
      // Destructors do not throw in this code base; a backend destructor that does is reported.
      GuardBackendCall(disposal, [](std::string_view what) {
        spdlog::error("reaper: a disposal threw: {}", what);
      });
      disposal = nullptr;  // its captures may own more work; release them before going idle
    }
    state->running_disposal = false;
    if (state->queue.empty())
      state->idle.notify_all();
  }
}

}  // namespace backplane::loader
