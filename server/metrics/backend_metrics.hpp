// The backends' part of the server's metrics: hot-reload events (swaps, rejections, leaks,
// drains), the registry's generations, the loader's counters and the isolated workers' deaths.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>

#include "backplane/core/thread_annotations.hpp"
#include "backplane/registry/backend_registry.hpp"
#include "backplane/registry/crash_supervisor.hpp"
#include "metrics/prometheus.hpp"

namespace backplane::server {

// Hot-reload events, fed by a registry observer. Thread-safe (one lock, held only to count or
// to render).
class BackendEventMetrics {
 public:
  // Seeds the ids known at start (so that their next activation counts as a swap) and the files
  // rejected before the observer existed.
  void AttachRegistry(const BackendRegistry& registry) BACKPLANE_EXCLUDES(mutex_);
  void OnGenerationEvent(const GenerationEvent& event) BACKPLANE_EXCLUDES(mutex_);

  // backplane_backend_{swaps,rejected_loads,rollbacks,leaked_generations}_total and
  // _drain_seconds.
  void Render(PrometheusWriter& out) const BACKPLANE_EXCLUDES(mutex_);

 private:
  struct Events {
    uint64_t swaps = 0;
    uint64_t leaked = 0;
    std::map<LoadReason, uint64_t> rejected;    // files at fault, by reason
    std::map<std::string, uint64_t> rollbacks;  // candidates rolled back, by who decided
    std::unique_ptr<Histogram> drain_seconds;
  };
  // `id` "" holds the files rejected before they named a backend.
  Events& BackendLocked(const std::string& id) BACKPLANE_REQUIRES(mutex_);
  void CountRejectedLocked(const std::string& id, uint64_t generation, const Status& error)
      BACKPLANE_REQUIRES(mutex_);

  mutable Mutex mutex_;
  std::set<std::string> known_backends_ BACKPLANE_GUARDED_BY(mutex_);
  std::map<std::string, Events> backends_ BACKPLANE_GUARDED_BY(mutex_);
};

// Who rolled a rollout candidate back, from its rejection's message: "policy" (its numbers),
// "operator" (the admin API), or "deploy" (a newer file superseded it, the stable file was
// designated again, the file was deleted, the backend was rolled back).
std::string_view RollbackDecidedBy(std::string_view message);

// The trust policy's health (docs/operators.md, "Securing the backend directory"): digests and
// keys trusted, whether an allowlist file trusts nothing because it could not be read. Nothing
// without a policy.
void RenderTrustHealth(PrometheusWriter& out, const loader::TrustPolicy* trust);

// The generations per backend and state, and each backend's active generation (a number and an
// info series naming its file and content), read from the registry at scrape time.
void RenderBackendGenerations(PrometheusWriter& out, const BackendRegistry& registry);

// The loader's process-wide generation counters.
void RenderLoaderStats(PrometheusWriter& out, const loader::LoaderStats& stats);

// The worker processes of isolated backends (backend_isolation), from the crash supervisor's
// counts: deaths by cause, restarts, the generation that died last. Labelled by backend, not by
// generation: a generation's worker dies at most once and each restart is a new generation, so a
// series per generation would be born at 1 (increase() never sees it) and a crash loop would add
// one for every restart. Each backend whose generations run in workers has its series from the
// start, at 0.
void RenderWorkerMetrics(PrometheusWriter& out, const BackendRegistry& registry,
                         const std::map<std::string, WorkerCrashCounts>& counts);
// The same, as a text of its own (appended to ServerMetrics::Render's by the admin room).
std::string RenderWorkerMetrics(const BackendRegistry& registry,
                                const std::map<std::string, WorkerCrashCounts>& counts);

}  // namespace backplane::server
