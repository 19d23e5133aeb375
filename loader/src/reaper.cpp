#include "backplane/loader/reaper.hpp"

#include <spdlog/spdlog.h>

namespace backplane::loader {

struct Reaper::State {
  std::mutex mutex;
  std::condition_variable wake;
  std::condition_variable idle;
  std::deque<std::function<void()>> queue;  // guarded by mutex
  bool running_disposal = false;            // guarded by mutex
  bool stopping = false;                    // guarded by mutex
  std::thread::id thread_id;                // set before the first Post
};

Reaper::Reaper() : state_(std::make_shared<State>()), thread_([state = state_] { Run(state); }) {
  state_->thread_id = thread_.get_id();
}

Reaper::~Reaper() {
  {
    std::lock_guard lock(state_->mutex);
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
    std::lock_guard lock(state_->mutex);
    if (state_->stopping && !OnReaperThread())
      return false;
    state_->queue.push_back(std::move(disposal));
  }
  state_->wake.notify_one();
  return true;
}

void Reaper::WaitIdle() {
  std::unique_lock lock(state_->mutex);
  state_->idle.wait(lock, [this] { return state_->queue.empty() && !state_->running_disposal; });
}

void Reaper::Run(const std::shared_ptr<State>& state) {
  std::unique_lock lock(state->mutex);
  for (;;) {
    state->wake.wait(lock, [&] { return state->stopping || !state->queue.empty(); });
    if (state->queue.empty()) {
      if (state->stopping)
        return;
      continue;
    }
    auto disposal = std::move(state->queue.front());
    state->queue.pop_front();
    state->running_disposal = true;
    lock.unlock();
    try {
      disposal();
    } catch (const std::exception& e) {
      // Destructors do not throw in this code base; a backend destructor that does is reported.
      spdlog::error("reaper: a disposal threw: {}", e.what());
    } catch (...) {
      spdlog::error("reaper: a disposal threw a non-standard exception");
    }
    disposal = nullptr;  // its captures may own more work; release them before going idle
    lock.lock();
    state->running_disposal = false;
    if (state->queue.empty())
      state->idle.notify_all();
  }
}

}  // namespace backplane::loader
