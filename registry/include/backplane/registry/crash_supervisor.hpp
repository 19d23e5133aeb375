// What a worker's death costs (isolation/): a candidate whose worker died is rolled back at once
// (CRASHED); an active generation's worker is restarted as a new generation of the same file, the
// first time at once and then with a growing pause, until it has died `max_crashes` times within
// `crash_window`: then the previous build is rolled back to (the rollback store), or, with none,
// the dead generation stays and the log says so. A rollout baseline's worker (the stable build
// loaded again beside a candidate) costs nothing but itself: logged, nothing rolled back or
// restarted. The decisions run on a thread of their own: a restart prepares every network again,
// which must not hold a worker's monitor.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "backplane/core/thread_annotations.hpp"
#include "backplane/isolation/worker_runner.hpp"

namespace backplane {

class BackendRegistry;

struct CrashPolicy {
  int max_crashes = 3;  // deaths of one backend's active workers within crash_window...
  std::chrono::seconds crash_window{60};  // ... after which it is not restarted again
  // The pause before the n-th restart within the window: 0 for the first, then this doubled
  // each time, at most max_backoff.
  std::chrono::milliseconds first_backoff{100};
  std::chrono::milliseconds max_backoff{5000};
};

// What ended a worker, in a word /metrics can use as a label (a bounded set, unlike the death's
// text): "signal" (a crash, the OOM killer, kill -9), "exit" (the backend called exit), "hang" (a
// call ran past the call timeout), "memory" (its resident set passed the limit), "killed" (the
// server ended it for another reason, such as a malformed reply).
std::string_view DeathCause(const isolation::WorkerDeath& death);

// What the supervisor saw and did about one backend id's workers since it started.
struct WorkerCrashCounts {
  std::map<std::string, uint64_t, std::less<>> deaths;  // by DeathCause
  uint64_t restarts = 0;                                // active generations restarted as new ones
  uint64_t last_generation = 0;                         // the generation whose worker died last
};

// Thread-safe.
class CrashSupervisor {
 public:
  explicit CrashSupervisor(CrashPolicy policy = {});
  ~CrashSupervisor();
  CrashSupervisor(const CrashSupervisor&) = delete;
  CrashSupervisor& operator=(const CrashSupervisor&) = delete;

  // The registry whose backends the crashes are about; until set, crashes are only logged.
  void Attach(std::weak_ptr<BackendRegistry> registry) BACKPLANE_EXCLUDES(mutex_);
  // From any thread (a worker's monitor): queued, decided on the supervisor's thread. Give
  // isolation::MakeWorkerRunner a listener that reaches this through a weak_ptr: workers can
  // outlive the supervisor.
  void OnCrash(isolation::WorkerCrash crash) BACKPLANE_EXCLUDES(mutex_);

  // Crashes decided so far, for tests and metrics.
  uint64_t decided() const BACKPLANE_EXCLUDES(mutex_);
  // Per backend id, every death told so far (counted when told, before it is decided).
  std::map<std::string, WorkerCrashCounts> Counts() const BACKPLANE_EXCLUDES(mutex_);

 private:
  void Run();
  void Decide(BackendRegistry& registry, const isolation::WorkerCrash& crash);

  const CrashPolicy policy_;
  mutable Mutex mutex_;
  std::condition_variable_any wake_;
  std::deque<isolation::WorkerCrash> queue_ BACKPLANE_GUARDED_BY(mutex_);
  std::weak_ptr<BackendRegistry> registry_ BACKPLANE_GUARDED_BY(mutex_);
  bool stopping_ BACKPLANE_GUARDED_BY(mutex_) = false;
  uint64_t decided_ BACKPLANE_GUARDED_BY(mutex_) = 0;
  std::map<std::string, WorkerCrashCounts> counts_ BACKPLANE_GUARDED_BY(mutex_);
  // Per backend id, when its active workers died lately (the supervisor's thread only).
  std::map<std::string, std::deque<std::chrono::steady_clock::time_point>> deaths_;
  std::thread thread_;  // last: started once the rest exists
};

}  // namespace backplane
