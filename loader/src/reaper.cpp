#include "backplane/loader/reaper.hpp"

#include <spdlog/spdlog.h>

namespace backplane::loader {

Reaper::Reaper() : thread_([this] { Run(); }) {}

Reaper::~Reaper() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  // The last owner may be a disposal running on the reaper itself; it cannot join itself.
  if (OnReaperThread()) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

bool Reaper::Post(std::function<void()> disposal) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !OnReaperThread())
      return false;
    queue_.push_back(std::move(disposal));
  }
  wake_.notify_one();
  return true;
}

void Reaper::WaitIdle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [this] { return queue_.empty() && !running_disposal_; });
}

void Reaper::Run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) {
      if (stopping_)
        return;
      continue;
    }
    auto disposal = std::move(queue_.front());
    queue_.pop_front();
    running_disposal_ = true;
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
    running_disposal_ = false;
    if (queue_.empty())
      idle_.notify_all();
  }
}

}  // namespace backplane::loader
