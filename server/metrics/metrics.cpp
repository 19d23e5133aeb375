#include "metrics/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

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
// Time from switch to unload: immediate (no request held the old code) to minutes (a network
// pinned to it until unloaded).
constexpr double kDrainBounds[] = {0.001, 0.01, 0.1, 0.5, 1, 5, 30, 120, 600};

// Shortest text that reads back as the same double; Prometheus accepts Go float syntax.
std::string FormatDouble(double value) {
  if (std::isinf(value))
    return value > 0 ? "+Inf" : "-Inf";
  if (std::isnan(value))
    return "NaN";
  char buffer[64];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return error == std::errc() ? std::string(buffer, end) : "NaN";
}

// Writes one metric family at a time: HELP and TYPE once, then its samples.
class Exposition {
 public:
  void Family(std::string_view name, std::string_view type, std::string_view help) {
    text_ += "# HELP ";
    text_ += name;
    text_ += ' ';
    // HELP text escapes backslash and newline only.
    for (char c : help) {
      if (c == '\\')
        text_ += "\\\\";
      else if (c == '\n')
        text_ += "\\n";
      else
        text_ += c;
    }
    text_ += "\n# TYPE ";
    text_ += name;
    text_ += ' ';
    text_ += type;
    text_ += '\n';
  }

  using Labels = std::vector<std::pair<std::string_view, std::string>>;
  void Sample(std::string_view name, const Labels& labels, std::string_view value) {
    text_ += name;
    if (!labels.empty()) {
      text_ += '{';
      for (std::size_t i = 0; i < labels.size(); ++i) {
        if (i > 0)
          text_ += ',';
        text_ += labels[i].first;
        text_ += "=\"";
        text_ += EscapeLabelValue(labels[i].second);
        text_ += '"';
      }
      text_ += '}';
    }
    text_ += ' ';
    text_ += value;
    text_ += '\n';
  }
  void Sample(std::string_view name, const Labels& labels, uint64_t value) {
    Sample(name, labels, std::to_string(value));
  }
  void Sample(std::string_view name, const Labels& labels, int64_t value) {
    Sample(name, labels, std::to_string(value));
  }

  void HistogramSamples(std::string_view name, const Labels& labels,
                        const Histogram::Snapshot& snapshot) {
    const std::string bucket = std::string(name) + "_bucket";
    for (std::size_t i = 0; i <= snapshot.upper_bounds.size(); ++i) {
      Labels with_le = labels;
      with_le.emplace_back("le", i < snapshot.upper_bounds.size()
                                     ? FormatDouble(snapshot.upper_bounds[i])
                                     : std::string("+Inf"));
      Sample(bucket, with_le, snapshot.cumulative_counts[i]);
    }
    Sample(std::string(name) + "_sum", labels, FormatDouble(snapshot.sum));
    Sample(std::string(name) + "_count", labels, snapshot.count);
  }

  std::string Take() { return std::move(text_); }

 private:
  std::string text_;
};

using ModelList = std::vector<std::pair<std::string, const ModelMetrics*>>;

// Executions against requests, batch sizes and queue delays, per model (dynamic batching).
void RenderBatchingMetrics(Exposition& out, const ModelList& models) {
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

}  // namespace

std::string EscapeLabelValue(std::string_view value) {
  std::string escaped;
  escaped.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      escaped += "\\\\";
    else if (c == '"')
      escaped += "\\\"";
    else if (c == '\n')
      escaped += "\\n";
    else
      escaped += c;
  }
  return escaped;
}

// ---- Histogram ------------------------------------------------------------------------------

Histogram::Histogram(std::span<const double> upper_bounds)
    : upper_bounds_(upper_bounds.begin(), upper_bounds.end()),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(upper_bounds.size() + 1)) {}

void Histogram::Observe(double value) {
  // The first bound >= value; past the end is the +Inf bucket.
  const auto bucket = static_cast<std::size_t>(
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.upper_bounds = upper_bounds_;
  uint64_t cumulative = 0;
  for (std::size_t i = 0; i <= upper_bounds_.size(); ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    snapshot.cumulative_counts.push_back(cumulative);
  }
  snapshot.count = cumulative;
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

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

void ServerMetrics::CountHttpResponse(int status) {
  if (status < 100 || status >= static_cast<int>(http_responses_.size()))
    status = 500;
  http_responses_[static_cast<std::size_t>(status)].fetch_add(1, std::memory_order_relaxed);
}

ServerMetrics::BackendEvents& ServerMetrics::BackendLocked(const std::string& id) {
  BackendEvents& events = backends_[id];
  if (!events.drain_seconds)
    events.drain_seconds = std::make_unique<Histogram>(kDrainBounds);
  return events;
}

void ServerMetrics::AttachRegistry(const BackendRegistry& registry) {
  const auto ids = registry.BackendIds();
  const auto rejected = registry.Rejected();
  MutexLock lock(backend_mutex_);
  for (const auto& id : ids) {
    known_backends_.insert(id);
    BackendLocked(id);
  }
  for (const auto& file : rejected)
    ++rejected_by_reason_[std::string(file.error.name())];
}

void ServerMetrics::OnGenerationEvent(const GenerationEvent& event) {
  MutexLock lock(backend_mutex_);
  switch (event.kind) {
    case GenerationEvent::Kind::kActivated: {
      // A backend id seen before getting a new active generation is a swap (a deploy or a
      // rollback); a new id's first generation is not.
      const bool known = !known_backends_.insert(event.backend_id).second;
      BackendEvents& events = BackendLocked(event.backend_id);
      if (known)
        ++events.swaps;
      break;
    }
    case GenerationEvent::Kind::kRejected:
      // The registry gives every rejection a reason code (PREPARE_FAILED when a runtime could
      // not prepare its networks on the new generation); count one without as that, too.
      ++rejected_by_reason_[event.error.reason() ? std::string(event.error.name())
                                                 : std::string("PREPARE_FAILED")];
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

std::string ServerMetrics::Render(const BackendRegistry* registry,
                                  const loader::LoaderStats* loader_stats,
                                  std::span<const ShapeProgramSample> shape_programs) const {
  Exposition out;

  // ---- HTTP
  out.Family("backplane_http_responses_total", "counter", "HTTP responses sent, by status code.");
  for (std::size_t status = 0; status < http_responses_.size(); ++status) {
    const uint64_t count = http_responses_[status].load(std::memory_order_relaxed);
    if (count != 0)
      out.Sample("backplane_http_responses_total", {{"code", std::to_string(status)}}, count);
  }
  out.Family("backplane_http_requests_in_flight", "gauge",
             "HTTP requests being handled right now (this scrape included).");
  out.Sample("backplane_http_requests_in_flight", {},
             http_in_flight.load(std::memory_order_relaxed));
  out.Family("backplane_http_buffered_body_bytes", "gauge",
             "Request-body bytes reserved against max_buffered_body_bytes right now.");
  out.Sample("backplane_http_buffered_body_bytes", {},
             http_buffered_body_bytes.load(std::memory_order_relaxed));
  out.Family("backplane_http_body_budget_refusals_total", "counter",
             "HTTP requests refused with 503 because their body did not fit in "
             "max_buffered_body_bytes.");
  out.Sample("backplane_http_body_budget_refusals_total", {},
             http_body_budget_refusals.load(std::memory_order_relaxed));

  // ---- Inference, per model
  ModelList models;
  {
    MutexLock lock(models_mutex_);
    for (const auto& [name, metrics] : models_)
      models.emplace_back(name, metrics.get());
  }
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
  RenderBatchingMetrics(out, models);

  // ---- Shape programs, per served model version with dynamic input dimensions
  // (docs/performance.md, "Shape programs"). Counters span hot swaps; the programs gauge is the
  // current binding's cache.
  out.Family("backplane_network_shape_program_requests_total", "counter",
             "Requests of a network with dynamic input dimensions, by whether a shape program for "
             "their input shapes was cached (hit) or not (miss: compiled by the first, the "
             "load-time workloads for the others meanwhile).");
  for (const auto& sample : shape_programs) {
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
    for (const auto& sample : shape_programs) {
      const uint64_t values[] = {sample.compiles, sample.compile_failures, sample.evictions};
      out.Sample(counters[i].first, {{"model", sample.model}, {"version", sample.version}},
                 values[i]);
    }
  }
  for (std::size_t i = 0; i < std::size(gauges); ++i) {
    out.Family(gauges[i].first, "gauge", gauges[i].second);
    for (const auto& sample : shape_programs) {
      const uint64_t values[] = {sample.programs, sample.capacity};
      out.Sample(gauges[i].first, {{"model", sample.model}, {"version", sample.version}},
                 values[i]);
    }
  }

  // ---- Backends and hot reload
  if (registry != nullptr) {
    const auto described = registry->Describe();
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
  {
    MutexLock lock(backend_mutex_);
    out.Family("backplane_backend_swaps_total", "counter",
               "Times a backend's active generation was replaced (deploys and rollbacks).");
    for (const auto& [id, events] : backends_)
      out.Sample("backplane_backend_swaps_total", {{"backend", id}}, events.swaps);
    out.Family("backplane_backend_rejected_loads_total", "counter",
               "Backend files refused, by reason code (docs/troubleshooting.md).");
    for (const auto& [reason, count] : rejected_by_reason_)
      out.Sample("backplane_backend_rejected_loads_total", {{"reason", reason}}, count);
    out.Family("backplane_backend_leaked_generations_total", "counter",
               "Generations still mapped after dlclose, by backend.");
    for (const auto& [id, events] : backends_)
      out.Sample("backplane_backend_leaked_generations_total", {{"backend", id}}, events.leaked);
    out.Family("backplane_backend_drain_seconds", "histogram",
               "Time from a generation being replaced to its code leaving the process.");
    for (const auto& [id, events] : backends_) {
      out.HistogramSamples("backplane_backend_drain_seconds", {{"backend", id}},
                           events.drain_seconds->Read());
    }
  }
  if (loader_stats != nullptr) {
    out.Family("backplane_loader_generations_loaded_total", "counter",
               "Backend library generations mapped by this process.");
    out.Sample("backplane_loader_generations_loaded_total", {}, loader_stats->loaded.load());
    out.Family("backplane_loader_generations_unloaded_total", "counter",
               "Generations verified gone from the process after dlclose.");
    out.Sample("backplane_loader_generations_unloaded_total", {}, loader_stats->unloaded.load());
    out.Family("backplane_loader_generations_leaked_total", "counter",
               "Generations still mapped after dlclose (all backends).");
    out.Sample("backplane_loader_generations_leaked_total", {}, loader_stats->leaked.load());
    out.Family("backplane_loader_generations_live", "gauge",
               "Generations not yet destroyed (active, draining, or kept for rollback).");
    out.Sample("backplane_loader_generations_live", {}, loader_stats->live.load());
  }
  return out.Take();
}

std::string RenderWorkerMetrics(const BackendRegistry& registry,
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

  Exposition out;
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
  return out.Take();
}

}  // namespace backplane::server
