// One backend generation running in a process of its own: the host's handle on it.
//
// The worker is `backplane-backend-worker` (built beside `backplane`), started with two
// descriptors and nothing else of the host's: the shared region of call slots (channel.hpp) and
// the generation's sealed copy, which it maps with dlopen as the host would have. Calls cross
// through the slots; the death of the worker, however it happens, is seen at once by a monitor
// thread blocked on its pidfd, which fails the calls in flight with how it died.
//
// What a worker cannot do to the host: write outside the region (a separate address space), keep
// the host's descriptors (closed before exec), gain privileges (no_new_privs), outlive the host
// (it watches the host's pidfd and exits with it; PR_SET_PDEATHSIG is not used because it fires
// when the *thread* that forked exits, and the host's threads come and go).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "backplane/core/status.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/isolation/channel.hpp"
#include "backplane/isolation/wire.hpp"

namespace backplane::isolation {

struct WorkerOptions {
  // The worker executable; empty: backplane-backend-worker beside the running executable.
  std::filesystem::path executable;
  // Calls that may run at once (each takes a slot), and the largest request or reply of one call
  // (tensors included).
  uint32_t slots = 4;
  std::size_t slot_bytes = std::size_t{64} << 20;
  // A call running longer kills the worker (a hang is a crash); zero: no limit.
  std::chrono::milliseconds call_timeout{0};
  // The worker's resident memory above this kills it; zero: no limit. Checked every 50 ms.
  std::size_t memory_limit_bytes = 0;
  // For the log and errors: "backend TestCrash generation 3 (/dir/Test_Crash_backend.so)".
  std::string label;
};

// How a worker ended, once it has.
struct WorkerDeath {
  std::string how;    // "killed by signal 11 (SIGSEGV)", "exited with status 3"
  std::string cause;  // what the host did, when it killed it: "a call ran past 500 ms", ""
  // Why the host killed it, when it did (`cause` says it in words).
  enum class Killed { kNo, kCallTimeout, kMemoryLimit, kBadReply };
  Killed killed = Killed::kNo;
  int signal = 0;        // the signal that ended it, 0 when it exited
  int exit_status = -1;  // its exit status when it exited
  std::string ToString() const { return cause.empty() ? how : how + " (" + cause + ")"; }
};

// Thread-safe. Destroying it kills the worker (everything of the backend was shut down by then,
// or the worker is being abandoned) and waits for its monitor.
class BackendWorker {
 public:
  using DeathListener = std::function<void(const WorkerDeath&)>;

  // Starts the worker on `image_fd` (a sealed memfd; the worker gets its own copy of the
  // descriptor). `on_death` runs on the monitor thread when the worker dies other than by
  // the destructor; it must not release the last reference to this worker (the destructor
  // joins the monitor).
  static Result<std::unique_ptr<BackendWorker>> Start(const WorkerOptions& options, int image_fd,
                                                      DeathListener on_death = {});
  ~BackendWorker();
  BackendWorker(const BackendWorker&) = delete;
  BackendWorker& operator=(const BackendWorker&) = delete;

  // One call: `write` fills the request after the Call word, `read` reads the reply after its
  // Status (an error Status is returned as it is and `read` is not called). Fails with
  // kUnavailable, naming how the worker died, once it has; a call past the timeout kills it.
  Status Invoke(uint32_t call, const std::function<void(WireWriter&)>& write,
                const std::function<Status(WireReader&)>& read, std::string_view what);

  pid_t pid() const { return pid_; }
  std::string label() const BACKPLANE_EXCLUDES(mutex_);
  // Names the worker better once it said what it loaded ("backend TestCrash generation 3 ...").
  void Relabel(std::string label) BACKPLANE_EXCLUDES(mutex_);
  bool dead() const { return dead_.load(std::memory_order_acquire); }
  std::optional<WorkerDeath> death() const BACKPLANE_EXCLUDES(mutex_);
  // Kills the worker; its death is then reported with `cause`.
  void Kill(WorkerDeath::Killed why, std::string cause) BACKPLANE_EXCLUDES(mutex_);

 private:
  BackendWorker(WorkerOptions options, SharedRegion region, pid_t pid, OwnedFd pidfd,
                DeathListener on_death);
  void Monitor();
  Status DeadError(std::string_view what) const;

  const WorkerOptions options_;
  SharedRegion region_;
  SlotPool slots_;
  const pid_t pid_;
  const OwnedFd pidfd_;
  OwnedFd stop_;  // an eventfd: the destructor stops the monitor
  DeathListener on_death_;
  std::atomic<bool> dead_{false};
  std::atomic<bool> stopping_{false};
  mutable Mutex mutex_;
  std::optional<WorkerDeath> death_ BACKPLANE_GUARDED_BY(mutex_);
  std::string label_ BACKPLANE_GUARDED_BY(mutex_);
  std::string kill_cause_ BACKPLANE_GUARDED_BY(mutex_);
  WorkerDeath::Killed killed_ BACKPLANE_GUARDED_BY(mutex_) = WorkerDeath::Killed::kNo;
  std::thread monitor_;  // last: started once everything above exists
};

// The worker executable beside the running one.
std::filesystem::path DefaultWorkerExecutable();

}  // namespace backplane::isolation
