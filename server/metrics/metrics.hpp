// Prometheus metrics of `backplane serve`, rendered in the text exposition format (version
// 0.0.4) that `promtool check metrics` accepts: HELP and TYPE lines, counters ending in _total,
// histograms as _bucket{le}/_sum/_count, seconds as the unit, escaped label values.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/registry/backend_registry.hpp"
#include "backplane/registry/crash_supervisor.hpp"

namespace backplane::server {

// A cumulative histogram with fixed upper bounds. Thread-safe and lock-free: Observe is a few
// relaxed atomic adds, so a scrape may see a sum and counts from slightly different moments
// (Prometheus tolerates that; it never sees a bucket count decrease).
class Histogram {
 public:
  explicit Histogram(std::span<const double> upper_bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative_counts;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> upper_bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket (not cumulative), then +Inf
  std::atomic<double> sum_{0};
};

// How a model's requests were executed: executions against requests (a batched model runs many
// requests per execution), and for a model with dynamic_batching the rows of each batch, how
// long each request waited for its batch and how long batches took by the size they executed at.
// Thread-safe.
struct BatchingMetrics {
  BatchingMetrics();
  std::atomic<uint64_t> executions{0};     // runtime executions, batched or not
  Histogram batch_size;                    // rows per batched execution
  Histogram queue_delay_seconds;           // arrival to its batch leaving, per batched request
  std::atomic<uint64_t> waits_skipped{0};  // lone requests that left without waiting (waits
                                           // had gathered no company: CompanyOutlook)

  // A batch that executed at `execution_rows` (its rows padded to an execution size) took
  // `seconds` from leaving to its outputs. The sizes are few (ExecutionBatchSizes), so each gets
  // its own histogram: what a batch of each size costs is what max_queue_delay_us and
  // preferred_batch_sizes are chosen from.
  void ObserveExecution(int64_t execution_rows, double seconds) BACKPLANE_EXCLUDES(mutex_);
  std::map<int64_t, Histogram::Snapshot> ExecutionSeconds() const BACKPLANE_EXCLUDES(mutex_);

 private:
  mutable Mutex mutex_;
  std::map<int64_t, std::unique_ptr<Histogram>> execution_seconds_ BACKPLANE_GUARDED_BY(mutex_);
};

// The request metrics of one model, across its versions and reloads. Thread-safe.
struct ModelMetrics {
  ModelMetrics();
  std::atomic<uint64_t> requests{0};
  std::atomic<int64_t> in_flight{0};
  // Failed requests by the runtime's status code, whatever the transport: a REST 503 and a gRPC
  // UNAVAILABLE are one failure kind. The enum keeps the label set bounded whatever clients send.
  void CountFailure(StatusCode code) BACKPLANE_EXCLUDES(mutex_);
  std::map<StatusCode, uint64_t> Failures() const BACKPLANE_EXCLUDES(mutex_);
  Histogram latency_seconds;
  BatchingMetrics batching;

 private:
  mutable Mutex mutex_;
  std::map<StatusCode, uint64_t> failures_ BACKPLANE_GUARDED_BY(mutex_);
};

// One served model version's shape programs (Runtime::GetShapePrograms), read at scrape time:
// this room does not see the runtime, so the admin room copies the numbers into this.
struct ShapeProgramSample {
  std::string model;
  std::string version;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t compiles = 0;
  uint64_t compile_failures = 0;
  uint64_t evictions = 0;
  uint64_t programs = 0;  // cached now
  uint64_t capacity = 0;
};

// Every metric of the server. Thread-safe.
class ServerMetrics {
 public:
  ServerMetrics();

  // The metrics of model `name`, created on first use and never removed (Prometheus counters
  // must not vanish while the process lives). Only names of models found in the repository may
  // reach this: a label per name a client typed would let clients grow memory without bound.
  ModelMetrics& ForModel(std::string_view name) BACKPLANE_EXCLUDES(models_mutex_);

  // Every HTTP response, by status code (from the access log hook).
  void CountHttpResponse(int status);
  std::atomic<int64_t> http_in_flight{0};
  // The HTTP body budget (max_buffered_body_bytes): bytes reserved now, and requests refused
  // because their body did not fit.
  std::atomic<int64_t> http_buffered_body_bytes{0};
  std::atomic<uint64_t> http_body_budget_refusals{0};

  // Hot-reload events, fed by a registry observer. Attach seeds the ids known at start (so that
  // their next activation counts as a swap) and the files rejected before the observer existed.
  void AttachRegistry(const BackendRegistry& registry) BACKPLANE_EXCLUDES(backend_mutex_);
  void OnGenerationEvent(const GenerationEvent& event) BACKPLANE_EXCLUDES(backend_mutex_);

  // The whole exposition. `registry` (optional) adds the generations per backend and state; the
  // loader counters come from `loader_stats` when given; `shape_programs`, one per served model
  // version with dynamic input dimensions.
  std::string Render(const BackendRegistry* registry, const loader::LoaderStats* loader_stats,
                     std::span<const ShapeProgramSample> shape_programs = {}) const
      BACKPLANE_EXCLUDES(models_mutex_, backend_mutex_);

 private:
  struct BackendEvents {
    uint64_t swaps = 0;
    uint64_t leaked = 0;
    std::unique_ptr<Histogram> drain_seconds;
  };
  BackendEvents& BackendLocked(const std::string& id) BACKPLANE_REQUIRES(backend_mutex_);

  mutable Mutex models_mutex_;
  std::map<std::string, std::unique_ptr<ModelMetrics>, std::less<>> models_
      BACKPLANE_GUARDED_BY(models_mutex_);

  std::array<std::atomic<uint64_t>, 600> http_responses_{};  // by status code; 0 unused

  mutable Mutex backend_mutex_;
  std::set<std::string> known_backends_ BACKPLANE_GUARDED_BY(backend_mutex_);
  std::map<std::string, BackendEvents> backends_ BACKPLANE_GUARDED_BY(backend_mutex_);
  std::map<std::string, uint64_t> rejected_by_reason_ BACKPLANE_GUARDED_BY(backend_mutex_);
};

// The worker processes of isolated backends (backend_isolation), from the crash supervisor's
// counts: deaths by cause, restarts, the generation that died last. Labelled by backend, not by
// generation: a generation's worker dies at most once and each restart is a new generation, so a
// series per generation would be born at 1 (increase() never sees it) and a crash loop would add
// one for every restart. Each backend whose generations run in workers has its series from the
// start, at 0.
std::string RenderWorkerMetrics(const BackendRegistry& registry,
                                const std::map<std::string, WorkerCrashCounts>& counts);

// Prometheus label value escaping: backslash, double quote and newline.
std::string EscapeLabelValue(std::string_view value);

}  // namespace backplane::server
