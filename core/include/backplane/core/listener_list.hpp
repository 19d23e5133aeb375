// ListenerList: callbacks that any thread may add, remove and notify.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "backplane/core/logging.hpp"
#include "backplane/core/thread_annotations.hpp"

namespace backplane {

// Thread-safe. Listeners run on the notifying thread; Remove waits until no Notify is running,
// so after it returns the removed listener's captures may be destroyed. Trap: a listener must not
// Add or Remove on its own list (it would wait for itself). Anything a listener throws is logged
// and swallowed.
template <typename... Args>
class ListenerList {
 public:
  using Listener = std::function<void(const Args&...)>;

  // `what` names the listeners in the log ("generation observer").
  explicit ListenerList(std::string what) : what_(std::move(what)) {}

  uint64_t Add(Listener listener) BACKPLANE_EXCLUDES(mutex_) {
    WriterMutexLock lock(mutex_);
    listeners_.emplace(next_id_, std::move(listener));
    return next_id_++;
  }

  void Remove(uint64_t id) BACKPLANE_EXCLUDES(mutex_) {
    WriterMutexLock lock(mutex_);
    listeners_.erase(id);
  }

  void Notify(const Args&... args) const BACKPLANE_EXCLUDES(mutex_) {
    ReaderMutexLock lock(mutex_);  // held while listeners run: Remove waits for them
    for (const auto& [id, listener] : listeners_) {
      try {
        listener(args...);
      } catch (const std::exception& e) {
        ModuleLogger("backplane").error("{} threw: {}", what_, e.what());
      } catch (...) {
        // Notify runs in noexcept destructors (a generation's): nothing may escape.
        ModuleLogger("backplane")
            .error("{} threw an exception that is not a std::exception", what_);
      }
    }
  }

 private:
  const std::string what_;
  mutable SharedMutex mutex_;
  std::map<uint64_t, Listener> listeners_ BACKPLANE_GUARDED_BY(mutex_);
  uint64_t next_id_ BACKPLANE_GUARDED_BY(mutex_) = 1;
};

}  // namespace backplane
