// Clang's thread-safety analysis (-Wthread-safety, on the `clang` preset): locking rules the
// compiler checks instead of "guarded by" comments. Without clang the macros expand to nothing.
#pragma once

#include <mutex>

#if defined(__clang__)
#define BACKPLANE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define BACKPLANE_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) BACKPLANE_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY BACKPLANE_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) BACKPLANE_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) BACKPLANE_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) BACKPLANE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) BACKPLANE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) BACKPLANE_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) BACKPLANE_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) BACKPLANE_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) BACKPLANE_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) BACKPLANE_THREAD_ANNOTATION(assert_capability(x))
#define RETURN_CAPABILITY(x) BACKPLANE_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS BACKPLANE_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace backplane {

// std::mutex as a capability the analysis knows. BasicLockable, so std::unique_lock<Mutex> and
// std::condition_variable_any work with it.
class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mutex_.lock(); }
  void unlock() RELEASE() { mutex_.unlock(); }
  bool try_lock() BACKPLANE_THREAD_ANNOTATION(try_acquire_capability(true)) {
    return mutex_.try_lock();
  }
  // Tells the analysis that the caller holds this mutex (checked by nothing at run time): for
  // code the analysis cannot follow, such as a lock taken through a virtual call.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  std::mutex mutex_;
};

// Holds a Mutex for a scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~MutexLock() RELEASE() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mutex_;
};

}  // namespace backplane
