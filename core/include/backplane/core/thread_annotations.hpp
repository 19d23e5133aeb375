// Clang's thread-safety analysis (-Wthread-safety, on the `clang` preset): locking rules the
// compiler checks instead of "guarded by" comments. Without clang the macros expand to nothing.
// Prefixed BACKPLANE_, as abseil's are ABSL_: a backend or an embedding program that includes
// abseil (gRPC brings it) or defines its own GUARDED_BY sees no redefinition.
#pragma once

#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define BACKPLANE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define BACKPLANE_THREAD_ANNOTATION(x)
#endif

#define BACKPLANE_CAPABILITY(x) BACKPLANE_THREAD_ANNOTATION(capability(x))
#define BACKPLANE_SCOPED_CAPABILITY BACKPLANE_THREAD_ANNOTATION(scoped_lockable)
#define BACKPLANE_GUARDED_BY(x) BACKPLANE_THREAD_ANNOTATION(guarded_by(x))
#define BACKPLANE_PT_GUARDED_BY(x) BACKPLANE_THREAD_ANNOTATION(pt_guarded_by(x))
#define BACKPLANE_REQUIRES(...) BACKPLANE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define BACKPLANE_EXCLUDES(...) BACKPLANE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define BACKPLANE_ACQUIRE(...) BACKPLANE_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define BACKPLANE_RELEASE(...) BACKPLANE_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define BACKPLANE_ACQUIRE_SHARED(...) \
  BACKPLANE_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define BACKPLANE_RELEASE_SHARED(...) \
  BACKPLANE_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define BACKPLANE_ASSERT_CAPABILITY(x) BACKPLANE_THREAD_ANNOTATION(assert_capability(x))
#define BACKPLANE_RETURN_CAPABILITY(x) BACKPLANE_THREAD_ANNOTATION(lock_returned(x))
#define BACKPLANE_NO_THREAD_SAFETY_ANALYSIS BACKPLANE_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace backplane {

// std::mutex as a capability the analysis knows. BasicLockable, so std::unique_lock<Mutex> and
// std::condition_variable_any work with it.
class BACKPLANE_CAPABILITY("mutex") Mutex {
 public:
  void lock() BACKPLANE_ACQUIRE() { mutex_.lock(); }
  void unlock() BACKPLANE_RELEASE() { mutex_.unlock(); }
  bool try_lock() BACKPLANE_THREAD_ANNOTATION(try_acquire_capability(true)) {
    return mutex_.try_lock();
  }
  // Tells the analysis that the caller holds this mutex (checked by nothing at run time): for
  // code the analysis cannot follow, such as a lock taken through a virtual call.
  void AssertHeld() const BACKPLANE_ASSERT_CAPABILITY(this) {}

 private:
  std::mutex mutex_;
};

// Holds a Mutex for a scope.
class BACKPLANE_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) BACKPLANE_ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~MutexLock() BACKPLANE_RELEASE() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mutex_;
};

// Releases a Mutex held by the enclosing scope for a nested scope and takes it back at its end,
// also when an exception leaves it: for work that must run unlocked, such as a disposal or a
// callback, in the middle of a locked loop.
class BACKPLANE_SCOPED_CAPABILITY MutexUnlock {
 public:
  explicit MutexUnlock(Mutex& mutex) BACKPLANE_RELEASE(mutex) : mutex_(mutex) { mutex_.unlock(); }
  ~MutexUnlock() BACKPLANE_RELEASE() { mutex_.lock(); }
  MutexUnlock(const MutexUnlock&) = delete;
  MutexUnlock& operator=(const MutexUnlock&) = delete;

 private:
  Mutex& mutex_;
};

// std::shared_mutex as a capability: exclusive for writers, shared for readers.
class BACKPLANE_CAPABILITY("mutex") SharedMutex {
 public:
  void lock() BACKPLANE_ACQUIRE() { mutex_.lock(); }
  void unlock() BACKPLANE_RELEASE() { mutex_.unlock(); }
  void lock_shared() BACKPLANE_ACQUIRE_SHARED() { mutex_.lock_shared(); }
  void unlock_shared() BACKPLANE_RELEASE_SHARED() { mutex_.unlock_shared(); }

 private:
  std::shared_mutex mutex_;
};

// Holds a SharedMutex exclusively for a scope.
class BACKPLANE_SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex& mutex) BACKPLANE_ACQUIRE(mutex) : mutex_(mutex) {
    mutex_.lock();
  }
  ~WriterMutexLock() BACKPLANE_RELEASE() { mutex_.unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex& mutex_;
};

// Holds a SharedMutex shared for a scope.
class BACKPLANE_SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex& mutex) BACKPLANE_ACQUIRE_SHARED(mutex) : mutex_(mutex) {
    mutex_.lock_shared();
  }
  ~ReaderMutexLock() BACKPLANE_RELEASE() { mutex_.unlock_shared(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex& mutex_;
};

}  // namespace backplane
