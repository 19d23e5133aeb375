#include "backplane/registry/crash_supervisor.hpp"

#include <algorithm>

#include "backplane/core/thread_name.hpp"
#include "backplane/registry/backend_registry.hpp"
#include "registry_log.hpp"

namespace backplane {

std::string_view DeathCause(const isolation::WorkerDeath& death) {
  using Killed = isolation::WorkerDeath::Killed;
  switch (death.killed) {
    case Killed::kCallTimeout:
      return "hang";
    case Killed::kMemoryLimit:
      return "memory";
    case Killed::kBadReply:
      return "killed";
    case Killed::kNo:
      break;
  }
  return death.signal != 0 ? "signal" : "exit";
}

CrashSupervisor::CrashSupervisor(CrashPolicy policy)
    : policy_(policy), thread_([this] { Run(); }) {}

CrashSupervisor::~CrashSupervisor() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void CrashSupervisor::Attach(std::weak_ptr<BackendRegistry> registry) {
  MutexLock lock(mutex_);
  registry_ = std::move(registry);
}

void CrashSupervisor::OnCrash(isolation::WorkerCrash crash) {
  {
    MutexLock lock(mutex_);
    WorkerCrashCounts& counts = counts_[crash.backend_id];
    ++counts.deaths[std::string(DeathCause(crash.death))];
    counts.last_generation = crash.generation;
    queue_.push_back(std::move(crash));
  }
  wake_.notify_all();
}

uint64_t CrashSupervisor::decided() const {
  MutexLock lock(mutex_);
  return decided_;
}

std::map<std::string, WorkerCrashCounts> CrashSupervisor::Counts() const {
  MutexLock lock(mutex_);
  return counts_;
}

void CrashSupervisor::Run() {
  NameThisThread("bp-crash-super");
  for (;;) {
    isolation::WorkerCrash crash;
    std::shared_ptr<BackendRegistry> registry;
    {
      MutexLock lock(mutex_);
      while (!stopping_ && queue_.empty())
        wake_.wait(mutex_);
      if (stopping_)
        return;
      crash = std::move(queue_.front());
      queue_.pop_front();
      registry = registry_.lock();
    }
    if (registry != nullptr)
      Decide(*registry, crash);
    MutexLock lock(mutex_);
    ++decided_;
  }
}

void CrashSupervisor::Decide(BackendRegistry& registry, const isolation::WorkerCrash& crash) {
  const auto status = registry.Describe(crash.backend_id);
  if (!status)
    return;
  const std::string died =
      "its worker process " + std::to_string(crash.pid) + " " + crash.death.ToString();
  if (status->candidate_generation == crash.generation) {
    // A candidate answers nobody but itself: rolled back at once, whatever its window said.
    auto dropped =
        registry.DropCandidate(crash.backend_id, died, crash.generation, LoadReason::kCrashed);
    registry_detail::Log().error(
        "backend {} candidate generation {} ({}, sha256 {}): {}; {}", crash.backend_id,
        crash.generation, crash.file, crash.sha256, died,
        dropped.ok() ? "rolled back (CRASHED)" : dropped.error().message());
    return;
  }
  if (status->baseline_generation == crash.generation) {
    // The stable build's second copy, not the stable generation: the runtimes run its share on
    // the stable generation from now on. Its death says nothing against the candidate, and its
    // content already serves in the active generation, which did not die: nothing is rolled
    // back or restarted, and the death does not count against the active generation's window.
    registry_detail::Log().warn(
        "backend {} baseline generation {} (the stable build loaded again beside candidate "
        "generation {}; {}, sha256 {}): {}; its share runs on the stable generation, the "
        "rollout goes on",
        crash.backend_id, crash.generation, status->candidate_generation, crash.file, crash.sha256,
        died);
    return;
  }
  if (status->active_generation != crash.generation)
    return;  // an older generation, draining: it ends anyway

  auto& deaths = deaths_[crash.backend_id];
  const auto now = std::chrono::steady_clock::now();
  deaths.push_back(now);
  while (!deaths.empty() && now - deaths.front() > policy_.crash_window)
    deaths.pop_front();
  const int within = static_cast<int>(deaths.size());
  if (within > policy_.max_crashes) {
    const std::string why = died + "; " + std::to_string(within) + " deaths within " +
                            std::to_string(policy_.crash_window.count()) + " s (max_crashes " +
                            std::to_string(policy_.max_crashes) + ")";
    auto rolled = registry.Rollback(crash.backend_id);
    std::string done;
    if (rolled.ok()) {
      done = "rolled back to the previous build as generation " + std::to_string(*rolled);
    } else {
      auto withdrawn = registry.WithdrawCrashed(crash.backend_id, crash.generation, why);
      done = "no previous build (" + rolled.error().message() + "): " +
             (withdrawn.ok() ? "withdrawn, its file refused as CRASHED until another is published"
                             : "withdrawing it failed: " + withdrawn.error().message());
    }
    registry_detail::Log().error("backend {} generation {} ({}, sha256 {}): {}; {}",
                                 crash.backend_id, crash.generation, crash.file, crash.sha256, why,
                                 done);
    deaths.clear();
    return;
  }
  // The first restart at once; later ones after a pause that doubles.
  if (within > 1) {
    auto pause = policy_.first_backoff * (1 << std::min(within - 2, 16));
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(pause, policy_.max_backoff));
  }
  auto restarted = registry.Restart(crash.backend_id, crash.generation);
  if (restarted.ok()) {
    MutexLock lock(mutex_);
    ++counts_[crash.backend_id].restarts;
  } else {
    registry_detail::Log().error("backend {} generation {}: {}; restarting it failed: {}",
                                 crash.backend_id, crash.generation, died,
                                 restarted.error().message());
  }
}

}  // namespace backplane
