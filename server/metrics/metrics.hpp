// Prometheus metrics of `backplane serve`, in parts that each render their own families: the
// HTTP transport's counters (http_metrics.hpp), the models' requests and batching (here), the
// backends' hot-reload events, generations, loader and workers (backend_metrics.hpp). The
// exposition format and the histogram are prometheus.hpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/registry/backend_registry.hpp"
#include "backplane/registry/crash_supervisor.hpp"
#include "metrics/backend_metrics.hpp"
#include "metrics/http_metrics.hpp"
#include "metrics/prometheus.hpp"

namespace backplane::server {

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

// Whether one model version of the repository serves (Triton's READY), read at scrape time from
// the repository index: a model that is not serving has one sample with an empty version.
struct ModelReadySample {
  std::string model;
  std::string version;
  bool ready = false;
};

// Every metric of the server. Thread-safe.
class ServerMetrics {
 public:
  ServerMetrics();

  // The metrics of model `name`, created on first use and never removed (Prometheus counters
  // must not vanish while the process lives). Only names of models found in the repository may
  // reach this: a label per name a client typed would let clients grow memory without bound.
  ModelMetrics& ForModel(std::string_view name) BACKPLANE_EXCLUDES(models_mutex_);

  // The HTTP transport's counters, handed to HttpServer alone.
  HttpMetrics http;

  // Hot-reload events, fed by a registry observer (BackendEventMetrics).
  void AttachRegistry(const BackendRegistry& registry) { backend_events_.AttachRegistry(registry); }
  void OnGenerationEvent(const GenerationEvent& event) { backend_events_.OnGenerationEvent(event); }

  // The whole exposition. `registry` (optional) adds the generations per backend and state and
  // the trust policy's health; the loader counters come from `loader_stats` when given;
  // `shape_programs`, one per served model version with dynamic input dimensions; `models`, the
  // repository's index (backplane_model_ready). Build info and process_* always.
  std::string Render(const BackendRegistry* registry, const loader::LoaderStats* loader_stats,
                     std::span<const ShapeProgramSample> shape_programs = {},
                     std::span<const ModelReadySample> models = {}) const
      BACKPLANE_EXCLUDES(models_mutex_);

 private:
  mutable Mutex models_mutex_;
  std::map<std::string, std::unique_ptr<ModelMetrics>, std::less<>> models_
      BACKPLANE_GUARDED_BY(models_mutex_);
  BackendEventMetrics backend_events_;
};

}  // namespace backplane::server
