// ListenerList: callbacks that any thread may add, remove and notify.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backplane/loader/logging.hpp"

namespace backplane {

// Thread-safe. Listeners run outside the lock, on the notifying thread, so they may call back
// into their owner; one may still run just after Remove returned, when a Notify had already
// taken its copy. An exception from a listener is logged and swallowed.
template <typename... Args>
class ListenerList {
 public:
  using Listener = std::function<void(const Args&...)>;

  // `what` names the listeners in the log ("generation observer").
  explicit ListenerList(std::string what) : what_(std::move(what)) {}

  uint64_t Add(Listener listener) {
    std::lock_guard lock(mutex_);
    listeners_.emplace(next_id_, std::move(listener));
    return next_id_++;
  }

  void Remove(uint64_t id) {
    std::lock_guard lock(mutex_);
    listeners_.erase(id);
  }

  void Notify(const Args&... args) const {
    std::vector<Listener> listeners;
    {
      std::lock_guard lock(mutex_);
      for (const auto& [id, listener] : listeners_)
        listeners.push_back(listener);
    }
    for (const auto& listener : listeners) {
      try {
        listener(args...);
      } catch (const std::exception& e) {
        ModuleLogger("backplane")->error("{} threw: {}", what_, e.what());
      }
    }
  }

 private:
  const std::string what_;
  mutable std::mutex mutex_;
  std::map<uint64_t, Listener> listeners_;  // guarded by mutex_
  uint64_t next_id_ = 1;                    // guarded by mutex_
};

}  // namespace backplane
