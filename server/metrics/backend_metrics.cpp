#include "metrics/backend_metrics.hpp"

#include <string_view>

namespace backplane::server {

namespace {

// Time from switch to unload: immediate (no request held the old code) to minutes (a network
// pinned to it until unloaded).
constexpr double kDrainBounds[] = {0.001, 0.01, 0.1, 0.5, 1, 5, 30, 120, 600};

constexpr const char* kRollbackDeciders[] = {"policy", "operator", "deploy"};

}  // namespace

std::string_view RollbackDecidedBy(std::string_view message) {
  // The rollout controller drops a candidate with "<decided_by>: <why>" as its message.
  for (std::string_view by : {"policy", "operator"}) {
    if (message.size() > by.size() && message.substr(0, by.size()) == by &&
        message[by.size()] == ':')
      return by;
  }
  return "deploy";
}

// ---- BackendEventMetrics --------------------------------------------------------------------

BackendEventMetrics::Events& BackendEventMetrics::BackendLocked(const std::string& id) {
  Events& events = backends_[id];
  if (!events.drain_seconds) {
    // Every series of a backend exists from the start, at 0: a counter born at 1 has no earlier
    // sample, so increase() over it is 0 and an alert on the first rejection would never fire.
    events.drain_seconds = std::make_unique<Histogram>(kDrainBounds);
    for (int i = 0; i <= static_cast<int>(LoadReason::kLastReason); ++i) {
      if (static_cast<LoadReason>(i) != LoadReason::kRolledBack)
        events.rejected[static_cast<LoadReason>(i)] = 0;
    }
    for (const char* by : kRollbackDeciders)
      events.rollbacks[by] = 0;
  }
  return events;
}

void BackendEventMetrics::CountRejectedLocked(const std::string& id, uint64_t generation,
                                              const Status& error) {
  // The registry gives every rejection a reason code (PREPARE_FAILED when a runtime could not
  // prepare its networks on the new generation); count one without as that, too.
  const LoadReason reason = error.reason().value_or(LoadReason::kPrepareFailed);
  // A candidate rolled back was not at fault as a file: it loaded and served, and a working
  // rollout rolls candidates back. Counted apart, so that an alert on broken files stays quiet.
  if (reason == LoadReason::kRolledBack) {
    if (generation != 0)
      ++BackendLocked(id).rollbacks[std::string(RollbackDecidedBy(error.message()))];
    return;
  }
  ++BackendLocked(id).rejected[reason];
}

void BackendEventMetrics::AttachRegistry(const BackendRegistry& registry) {
  const auto ids = registry.BackendIds();
  const auto rejected = registry.Rejected();
  MutexLock lock(mutex_);
  BackendLocked("");
  for (const auto& id : ids) {
    known_backends_.insert(id);
    BackendLocked(id);
  }
  for (const auto& file : rejected)
    CountRejectedLocked(file.backend_id, 0, file.error);
}

void BackendEventMetrics::OnGenerationEvent(const GenerationEvent& event) {
  MutexLock lock(mutex_);
  switch (event.kind) {
    case GenerationEvent::Kind::kActivated: {
      // A backend id seen before getting a new active generation is a swap (a deploy or a
      // rollback); a new id's first generation is not.
      const bool known = !known_backends_.insert(event.backend_id).second;
      Events& events = BackendLocked(event.backend_id);
      if (known)
        ++events.swaps;
      break;
    }
    case GenerationEvent::Kind::kRejected:
      CountRejectedLocked(event.backend_id, event.generation, event.error);
      break;
    case GenerationEvent::Kind::kLeaked:
      ++BackendLocked(event.backend_id).leaked;
      [[fallthrough]];
    case GenerationEvent::Kind::kUnloaded:
      if (event.drain_ms)
        BackendLocked(event.backend_id).drain_seconds->Observe(*event.drain_ms / 1000.0);
      break;
    default:
      break;
  }
}

void BackendEventMetrics::Render(PrometheusWriter& out) const {
  MutexLock lock(mutex_);
  out.Family("backplane_backend_swaps_total", "counter",
             "Times a backend's active generation was replaced (deploys and rollbacks).");
  for (const auto& [id, events] : backends_) {
    if (!id.empty())
      out.Sample("backplane_backend_swaps_total", {{"backend", id}}, events.swaps);
  }
  out.Family("backplane_backend_rejected_loads_total", "counter",
             "Backend files refused, by backend (empty: the file named none) and reason code "
             "(docs/troubleshooting.md); rollout candidates rolled back are in "
             "backplane_backend_rollbacks_total.");
  for (const auto& [id, events] : backends_) {
    for (const auto& [reason, count] : events.rejected) {
      out.Sample("backplane_backend_rejected_loads_total",
                 {{"backend", id}, {"reason", std::string(ToString(reason))}}, count);
    }
  }
  out.Family("backplane_backend_rollbacks_total", "counter",
             "Rollout candidates rolled back, by who decided: policy (the rollout's verdict), "
             "operator (the admin API), deploy (superseded by a newer file, or the stable file "
             "designated again).");
  for (const auto& [id, events] : backends_) {
    if (id.empty())
      continue;
    for (const auto& [by, count] : events.rollbacks)
      out.Sample("backplane_backend_rollbacks_total", {{"backend", id}, {"by", by}}, count);
  }
  out.Family("backplane_backend_leaked_generations_total", "counter",
             "Generations still mapped after dlclose, by backend.");
  for (const auto& [id, events] : backends_) {
    if (!id.empty())
      out.Sample("backplane_backend_leaked_generations_total", {{"backend", id}}, events.leaked);
  }
  out.Family("backplane_backend_drain_seconds", "histogram",
             "Time from a generation being replaced to its code leaving the process.");
  for (const auto& [id, events] : backends_) {
    if (id.empty())
      continue;
    out.HistogramSamples("backplane_backend_drain_seconds", {{"backend", id}},
                         events.drain_seconds->Read());
  }
}

// ---- The registry's generations, the loader, the workers -------------------------------------

void RenderBackendGenerations(PrometheusWriter& out, const BackendRegistry& registry) {
  const auto described = registry.Describe();
  out.Family("backplane_backend_generations", "gauge",
             "Generations of each backend in the registry's recent history, by state.");
  for (const auto& backend : described) {
    std::map<std::string_view, int64_t> by_state;
    for (auto state :
         {GenerationState::kLoading, GenerationState::kActive, GenerationState::kDraining,
          GenerationState::kUnloaded, GenerationState::kLeaked, GenerationState::kRejected}) {
      by_state[ToString(state)] = 0;
    }
    for (const auto& generation : backend.generations)
      ++by_state[ToString(generation.state)];
    for (const auto& [state, count] : by_state) {
      out.Sample("backplane_backend_generations",
                 {{"backend", backend.id}, {"state", std::string(state)}}, count);
    }
  }
  out.Family("backplane_backend_active_generation", "gauge",
             "The generation number each backend serves new work on (0: static or withdrawn).");
  for (const auto& backend : described) {
    out.Sample("backplane_backend_active_generation", {{"backend", backend.id}},
               backend.active_generation);
  }
  // An info metric, as exporters publish build info: the labels say which code serves, the
  // value is always 1. A swap changes the labels, so dashboards see the series change.
  out.Family("backplane_backend_active_generation_info", "gauge",
             "The file and content each backend's active generation was loaded from (value 1).");
  for (const auto& backend : described) {
    for (const auto& generation : backend.generations) {
      if (generation.generation != backend.active_generation ||
          generation.state != GenerationState::kActive)
        continue;
      out.Sample("backplane_backend_active_generation_info",
                 {{"backend", backend.id},
                  {"generation", std::to_string(generation.generation)},
                  {"resolved_file", generation.resolved_file.string()},
                  {"sha256", generation.sha256},
                  {"release", generation.release}},
                 int64_t{1});
    }
  }
}

void RenderTrustHealth(PrometheusWriter& out, const loader::TrustPolicy* trust) {
  if (trust == nullptr)
    return;
  const loader::TrustHealth health = trust->Health();
  out.Family("backplane_trust_digests", "gauge",
             "Digests on the trusted backend lists now (0 while a list file trusts nothing).");
  out.Sample("backplane_trust_digests", {}, health.digests);
  out.Family("backplane_trust_signing_keys", "gauge",
             "Public keys whose signatures make backend content trusted.");
  out.Sample("backplane_trust_signing_keys", {}, health.keys);
  out.Family("backplane_trust_list_unreadable", "gauge",
             "Trusted-list files that cannot be read or parsed: they trust nothing (fail "
             "closed) until fixed.");
  out.Sample("backplane_trust_list_unreadable", {}, health.unreadable_lists);
}

void RenderLoaderStats(PrometheusWriter& out, const loader::LoaderStats& stats) {
  out.Family("backplane_loader_generations_loaded_total", "counter",
             "Backend library generations mapped by this process.");
  out.Sample("backplane_loader_generations_loaded_total", {}, stats.loaded.load());
  out.Family("backplane_loader_generations_unloaded_total", "counter",
             "Generations verified gone from the process after dlclose.");
  out.Sample("backplane_loader_generations_unloaded_total", {}, stats.unloaded.load());
  out.Family("backplane_loader_generations_leaked_total", "counter",
             "Generations still mapped after dlclose (all backends).");
  out.Sample("backplane_loader_generations_leaked_total", {}, stats.leaked.load());
  out.Family("backplane_loader_generations_live", "gauge",
             "Generations not yet destroyed (active, draining, or kept for rollback).");
  out.Sample("backplane_loader_generations_live", {}, stats.live.load());
}

void RenderWorkerMetrics(PrometheusWriter& out, const BackendRegistry& registry,
                         const std::map<std::string, WorkerCrashCounts>& counts) {
  std::set<std::string> isolated;
  for (const auto& backend : registry.Describe()) {
    for (const auto& generation : backend.generations) {
      if (!generation.runs_in.empty())
        isolated.insert(backend.id);
    }
  }
  for (const auto& [id, backend_counts] : counts)
    isolated.insert(id);
  const auto counts_of = [&](const std::string& id) {
    auto it = counts.find(id);
    return it != counts.end() ? it->second : WorkerCrashCounts{};
  };

  out.Family("backplane_backend_worker_crashes_total", "counter",
             "Deaths of an isolated backend's worker processes, by how: signal (a crash, the OOM "
             "killer, kill -9), exit, hang (past execute_timeout_ms), memory (past "
             "memory_limit_bytes), killed (by the server for another reason).");
  for (const auto& id : isolated) {
    const WorkerCrashCounts backend_counts = counts_of(id);
    for (const char* how : {"signal", "exit", "hang", "memory", "killed"}) {
      const auto it = backend_counts.deaths.find(how);
      out.Sample("backplane_backend_worker_crashes_total", {{"backend", id}, {"how", how}},
                 it != backend_counts.deaths.end() ? it->second : uint64_t{0});
    }
  }
  out.Family("backplane_backend_worker_restarts_total", "counter",
             "Active generations of an isolated backend restarted as new generations in new "
             "workers after their worker died.");
  for (const auto& id : isolated)
    out.Sample("backplane_backend_worker_restarts_total", {{"backend", id}},
               counts_of(id).restarts);
  out.Family("backplane_backend_worker_last_crash_generation", "gauge",
             "The generation whose worker died last (0: none yet).");
  for (const auto& id : isolated) {
    out.Sample("backplane_backend_worker_last_crash_generation", {{"backend", id}},
               counts_of(id).last_generation);
  }
}

std::string RenderWorkerMetrics(const BackendRegistry& registry,
                                const std::map<std::string, WorkerCrashCounts>& counts) {
  PrometheusWriter out;
  RenderWorkerMetrics(out, registry, counts);
  return out.Take();
}

}  // namespace backplane::server
