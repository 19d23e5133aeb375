#include "metrics/metrics.hpp"

#include <utility>

#include "metrics/process_metrics.hpp"

namespace backplane::server {

namespace {

// Request latency: 0.5 ms (a cached tiny model) to 10 s (a client's patience).
constexpr double kLatencyBounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                     0.1,    0.25,  0.5,    1,     2.5,  5,     10};
// Rows per batched execution: powers of two up to the largest max_batch_size worth having.
constexpr double kBatchSizeBounds[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
// Time a request waited for its batch: 50 µs (a batch was forming) to 1 s (max_queue_delay_us's
// ceiling).
constexpr double kQueueDelayBounds[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001,
                                        0.002,   0.0025, 0.005,   0.01,   0.025,
                                        0.05,    0.1,    0.25,    0.5,    1};
// A batch's execution: 50 µs (a small model's few rows) to 10 s.
constexpr double kBatchExecutionBounds[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002,
                                            0.004,   0.008,  0.016,   0.032,  0.064, 0.128,
                                            0.25,    0.5,    1,       2.5,    10};

using ModelList = std::vector<std::pair<std::string, const ModelMetrics*>>;

// Executions against requests, batch sizes and queue delays, per model (dynamic batching).
void RenderBatchingFamilies(PrometheusWriter& out, const ModelList& models) {
  out.Family("backplane_inference_executions_total", "counter",
             "Executions of a model's network; below its requests when dynamic batching joins "
             "them.");
  for (const auto& [name, metrics] : models) {
    out.Sample("backplane_inference_executions_total", {{"model", name}},
               metrics->batching.executions.load(std::memory_order_relaxed));
  }
  out.Family("backplane_inference_batch_size", "histogram",
             "Rows per batched execution, for models with dynamic_batching.");
  for (const auto& [name, metrics] : models) {
    out.HistogramSamples("backplane_inference_batch_size", {{"model", name}},
                         metrics->batching.batch_size.Read());
  }
  out.Family("backplane_inference_queue_delay_seconds", "histogram",
             "Time from a request's arrival to its batch leaving for execution, for models with "
             "dynamic_batching.");
  for (const auto& [name, metrics] : models) {
    out.HistogramSamples("backplane_inference_queue_delay_seconds", {{"model", name}},
                         metrics->batching.queue_delay_seconds.Read());
  }
  out.Family("backplane_inference_batch_execution_seconds", "histogram",
             "Time from a batch leaving to its outputs, by the batch size it executed at (its "
             "rows padded up to an execution size), for models with dynamic_batching.");
  for (const auto& [name, metrics] : models) {
    for (const auto& [rows, snapshot] : metrics->batching.ExecutionSeconds()) {
      out.HistogramSamples("backplane_inference_batch_execution_seconds",
                           {{"model", name}, {"batch_size", std::to_string(rows)}}, snapshot);
    }
  }
  out.Family("backplane_inference_batch_waits_skipped_total", "counter",
             "Requests that found no company and left without waiting max_queue_delay_us, "
             "because the waits before them had gathered none.");
  for (const auto& [name, metrics] : models) {
    out.Sample("backplane_inference_batch_waits_skipped_total", {{"model", name}},
               metrics->batching.waits_skipped.load(std::memory_order_relaxed));
  }
}

// Requests, failures, requests in flight and latency, per model; then its batching.
void RenderModelFamilies(PrometheusWriter& out, const ModelList& models) {
  out.Family("backplane_inference_requests_total", "counter",
             "Inference requests received for a model of the repository.");
  for (const auto& [name, metrics] : models) {
    out.Sample("backplane_inference_requests_total", {{"model", name}},
               metrics->requests.load(std::memory_order_relaxed));
  }
  out.Family(
      "backplane_inference_failures_total", "counter",
      "Inference requests that failed, by model and status code (the same over REST and gRPC).");
  for (const auto& [name, metrics] : models) {
    for (const auto& [code, count] : metrics->Failures()) {
      out.Sample("backplane_inference_failures_total",
                 {{"model", name}, {"code", std::string(ToString(code))}}, count);
    }
  }
  out.Family("backplane_inference_requests_in_flight", "gauge",
             "Inference requests of a model being executed right now.");
  for (const auto& [name, metrics] : models) {
    out.Sample("backplane_inference_requests_in_flight", {{"model", name}},
               metrics->in_flight.load(std::memory_order_relaxed));
  }
  out.Family("backplane_inference_request_duration_seconds", "histogram",
             "Time from a request's arrival to its response being ready, successful requests.");
  for (const auto& [name, metrics] : models) {
    out.HistogramSamples("backplane_inference_request_duration_seconds", {{"model", name}},
                         metrics->latency_seconds.Read());
  }
  RenderBatchingFamilies(out, models);
}

// Shape programs, per served model version with dynamic input dimensions (docs/performance.md,
// "Shape programs"). Counters span hot swaps; the programs gauge is the current binding's cache.
void RenderShapeProgramFamilies(PrometheusWriter& out,
                                std::span<const ShapeProgramSample> samples) {
  out.Family("backplane_network_shape_program_requests_total", "counter",
             "Requests of a network with dynamic input dimensions, by whether a shape program for "
             "their input shapes was cached (hit) or not (miss: compiled by the first, the "
             "load-time workloads for the others meanwhile).");
  for (const auto& sample : samples) {
    for (auto [result, count] : {std::pair{"hit", sample.hits}, std::pair{"miss", sample.misses}}) {
      out.Sample("backplane_network_shape_program_requests_total",
                 {{"model", sample.model}, {"version", sample.version}, {"result", result}}, count);
    }
  }
  const std::pair<const char*, const char*> counters[] = {
      {"backplane_network_shape_program_compiles_total",
       "Shape programs built, one per new input shape (the first request of that shape pays it)."},
      {"backplane_network_shape_program_compile_failures_total",
       "Runs of layers a backend failed to compile at a concrete shape; they run layer by layer "
       "at that shape."},
      {"backplane_network_shape_program_evictions_total",
       "Shape programs evicted, least recently used first, beyond the network's capacity."}};
  const std::pair<const char*, const char*> gauges[] = {
      {"backplane_network_shape_programs", "Shape programs cached now."},
      {"backplane_network_shape_program_capacity",
       "How many shape programs the network keeps (NetworkOptions::shape_program_capacity)."}};
  for (std::size_t i = 0; i < std::size(counters); ++i) {
    out.Family(counters[i].first, "counter", counters[i].second);
    for (const auto& sample : samples) {
      const uint64_t values[] = {sample.compiles, sample.compile_failures, sample.evictions};
      out.Sample(counters[i].first, {{"model", sample.model}, {"version", sample.version}},
                 values[i]);
    }
  }
  for (std::size_t i = 0; i < std::size(gauges); ++i) {
    out.Family(gauges[i].first, "gauge", gauges[i].second);
    for (const auto& sample : samples) {
      const uint64_t values[] = {sample.programs, sample.capacity};
      out.Sample(gauges[i].first, {{"model", sample.model}, {"version", sample.version}},
                 values[i]);
    }
  }
}

// 1 for each model version that serves, 0 for a model of the repository that does not.
void RenderModelReadiness(PrometheusWriter& out, std::span<const ModelReadySample> models) {
  out.Family("backplane_model_ready", "gauge",
             "1 when a model version serves requests (READY), 0 for a model of the repository "
             "that does not (version empty).");
  for (const auto& model : models) {
    out.Sample("backplane_model_ready", {{"model", model.model}, {"version", model.version}},
               int64_t{model.ready ? 1 : 0});
  }
}

}  // namespace

// ---- ModelMetrics ---------------------------------------------------------------------------

BatchingMetrics::BatchingMetrics()
    : batch_size(kBatchSizeBounds), queue_delay_seconds(kQueueDelayBounds) {}

void BatchingMetrics::ObserveExecution(int64_t execution_rows, double seconds) {
  MutexLock lock(mutex_);
  auto& histogram = execution_seconds_[execution_rows];
  if (histogram == nullptr)
    histogram = std::make_unique<Histogram>(kBatchExecutionBounds);
  histogram->Observe(seconds);
}

std::map<int64_t, Histogram::Snapshot> BatchingMetrics::ExecutionSeconds() const {
  std::map<int64_t, Histogram::Snapshot> snapshots;
  MutexLock lock(mutex_);
  for (const auto& [rows, histogram] : execution_seconds_)
    snapshots.emplace(rows, histogram->Read());
  return snapshots;
}

ModelMetrics::ModelMetrics() : latency_seconds(kLatencyBounds) {}

void ModelMetrics::CountFailure(StatusCode code) {
  MutexLock lock(mutex_);
  ++failures_[code];
}

std::map<StatusCode, uint64_t> ModelMetrics::Failures() const {
  MutexLock lock(mutex_);
  return failures_;
}

// ---- ServerMetrics --------------------------------------------------------------------------

ServerMetrics::ServerMetrics() = default;

ModelMetrics& ServerMetrics::ForModel(std::string_view name) {
  MutexLock lock(models_mutex_);
  auto it = models_.find(name);
  if (it == models_.end())
    it = models_.emplace(std::string(name), std::make_unique<ModelMetrics>()).first;
  return *it->second;
}

std::string ServerMetrics::Render(const BackendRegistry* registry,
                                  const loader::LoaderStats* loader_stats,
                                  std::span<const ShapeProgramSample> shape_programs,
                                  std::span<const ModelReadySample> model_states) const {
  ModelList models;
  {
    MutexLock lock(models_mutex_);
    for (const auto& [name, metrics] : models_)
      models.emplace_back(name, metrics.get());
  }
  PrometheusWriter out;
  RenderBuildInfo(out);
  RenderProcessMetrics(out, ReadProcessSample());
  http.Render(out);
  RenderModelReadiness(out, model_states);
  RenderModelFamilies(out, models);
  RenderShapeProgramFamilies(out, shape_programs);
  if (registry != nullptr) {
    RenderBackendGenerations(out, *registry);
    RenderTrustHealth(out, registry->trust().get());
  }
  backend_events_.Render(out);
  if (loader_stats != nullptr)
    RenderLoaderStats(out, *loader_stats);
  return out.Take();
}

}  // namespace backplane::server
