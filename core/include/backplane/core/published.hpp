// Published<T>: an immutable value that readers take a reference to while a writer replaces it
// with a new one (copy, modify, publish). The request path reads network maps this way.
#pragma once

#include <memory>
#include <utility>

#include "backplane/core/thread_annotations.hpp"

namespace backplane {

// Thread-safe. A mutex rather than std::atomic<std::shared_ptr>: libstdc++ 12 builds that on a
// lock bit that ThreadSanitizer cannot see (every swap under load is reported as a race), and
// an uncontended lock around a shared_ptr copy costs about the same as that lock bit does.
template <typename T>
class Published {
 public:
  explicit Published(std::shared_ptr<const T> initial = std::make_shared<const T>())
      : current_(std::move(initial)) {}

  std::shared_ptr<const T> Load() const BACKPLANE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return current_;
  }

  void Publish(std::shared_ptr<const T> next) BACKPLANE_EXCLUDES(mutex_) {
    {
      MutexLock lock(mutex_);
      current_.swap(next);
    }
    // `next` holds the old value now: released on return, outside the lock.
  }

 private:
  mutable Mutex mutex_;
  std::shared_ptr<const T> current_ BACKPLANE_GUARDED_BY(mutex_);
};

}  // namespace backplane
