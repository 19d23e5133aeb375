// Which backend call each thread is running, and for which model: kept for one reader that may
// take no lock and allocate nothing, the fatal-signal reporter (fatal_signal_reporter.hpp), so
// that a crash in backend code says which backend, generation and model died.
#pragma once

#include <atomic>
#include <cstdint>

namespace backplane {

// One call into backend code, as a crash report names it. Plain pointers to NUL-terminated
// strings: a signal handler reads them, so no std::string, no allocation, no lock.
//
// Trap: every string must stay alive while the call runs, and nobody may change it. They belong
// to what the call itself holds: the generation's immutable GenerationInfo (kept mapped by the
// lease that every BackendInstance and Workload holds), the instance's id (a const member of the
// instance the call runs on), and string literals for `call`.
struct BackendCallSite {
  const char* backend_id = nullptr;  // null: not known yet (a library still being loaded)
  uint64_t generation = 0;           // 0: a static (linked-in) backend
  const char* sha256 = nullptr;      // of the code mapped; null for a static backend
  const char* file = nullptr;        // the resolved file; null for a static backend
  const char* call = nullptr;        // a string literal: "IWorkload::Execute", "BackendFactory"
};

namespace internal {
// The calling thread's innermost backend call (null: none) and the model it runs for (null: not
// known). Defined in fatal_signal_reporter.cpp; constant-initialised, so no thread-local guard
// or init call is ever needed to read them, in a signal handler either.
extern constinit thread_local const BackendCallSite* current_backend_call;
extern constinit thread_local const char* current_model;
extern constinit thread_local bool thread_ready_for_crash_reports;
// Gives the calling thread an alternate signal stack when a reporter is installed, so that a
// stack overflow in backend code is reported too; true once that is done (or nothing is to be
// done on this thread again).
bool PrepareThreadForCrashReports() noexcept;
}  // namespace internal

// The calling thread's innermost backend call, or null. For tests and the reporter.
inline const BackendCallSite* CurrentBackendCall() noexcept {
  return internal::current_backend_call;
}
// The model the calling thread runs, or null.
inline const char* CurrentModel() noexcept {
  return internal::current_model;
}

// Marks the calling thread as running `site`'s backend call for the scope's lifetime; restores
// the outer call (calls nest: a backend's hook may call back into the host, which calls a backend
// again; a TBB thread waiting in one request may run another's task). Cheap: a copy of five
// pointers and two thread-local stores. The first call on a thread also gives it an alternate
// signal stack when a reporter is installed. Thread-compatible: one per call, on the caller's
// stack.
class ScopedBackendCall {
 public:
  explicit ScopedBackendCall(const BackendCallSite& site) noexcept
      : site_(site), outer_(internal::current_backend_call) {
    if (!internal::thread_ready_for_crash_reports) [[unlikely]]
      internal::thread_ready_for_crash_reports = internal::PrepareThreadForCrashReports();
    // A signal handler on this thread must see the whole site before the pointer to it.
    std::atomic_signal_fence(std::memory_order_release);
    internal::current_backend_call = &site_;
  }
  ~ScopedBackendCall() { internal::current_backend_call = outer_; }
  ScopedBackendCall(const ScopedBackendCall&) = delete;
  ScopedBackendCall& operator=(const ScopedBackendCall&) = delete;

 private:
  const BackendCallSite site_;
  const BackendCallSite* const outer_;
};

// Marks the calling thread as running model `model` (a NUL-terminated name that outlives the
// scope: the network's own, held by whoever executes it) for the scope's lifetime.
// Thread-compatible, as above.
class ScopedModelRun {
 public:
  explicit ScopedModelRun(const char* model) noexcept : outer_(internal::current_model) {
    std::atomic_signal_fence(std::memory_order_release);
    internal::current_model = model;
  }
  ~ScopedModelRun() { internal::current_model = outer_; }
  ScopedModelRun(const ScopedModelRun&) = delete;
  ScopedModelRun& operator=(const ScopedModelRun&) = delete;

 private:
  const char* const outer_;
};

}  // namespace backplane
