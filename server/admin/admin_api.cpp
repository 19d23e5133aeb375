#include "admin/admin_api.hpp"

#include <algorithm>
#include <charconv>

#include "backplane/core/quoted.hpp"

#include "config/option_json.hpp"
#include "metrics/metrics.hpp"
#include "rollout/rollout_controller.hpp"
#include "serving/model_repository.hpp"
#include "serving/serving_log.hpp"
#include "serving/utc_time.hpp"

namespace backplane::server {
using nlohmann::json;

namespace {

constexpr char kBackendPath[] = "/v2/backends/{}";

// RFC 3339, UTC, milliseconds: "2026-11-29T23:55:01.123Z"; empty for a time never set.
std::string Rfc3339(std::chrono::system_clock::time_point time) {
  if (time == std::chrono::system_clock::time_point{})
    return "";
  return UtcWithMillis(time, "%Y-%m-%dT%H:%M:%S");
}

std::string KnownBackends(const BackendRegistry& registry) {
  std::string known;
  for (const auto& id : registry.BackendIds())
    known += (known.empty() ? "" : ", ") + id;
  return known.empty() ? "none" : known;
}

HttpResponse UnknownBackend(const BackendRegistry& registry, std::string_view id) {
  return HttpResponse::Error(
      404, "unknown backend " + Quoted(id) + " (known: " + KnownBackends(registry) + ")");
}

// The options of this server's instance of `id`: current value, type, default, help, and
// whether a request may give it for itself (SDK 1.4 per-call options).
HttpResponse DescribeBackendOptions(const Runtime& runtime, std::string_view id) {
  const auto instance = runtime.Backend(id);  // dropped before returning: it pins the code
  if (instance == nullptr)
    return HttpResponse::Error(404, "this server has no backend " + Quoted(id));
  const std::vector<std::string> per_call = instance->DescribeCallOptions();
  json options = json::object();
  for (const auto& descriptor : instance->DescribeOptions()) {
    auto current = instance->GetOption(descriptor.name);
    options[descriptor.name] = {
        {"type", ToString(descriptor.type)},
        {"value", current.ok() ? OptionValueJson(current.value()) : json(nullptr)},
        {"default", OptionValueJson(descriptor.default_value)},
        {"help", descriptor.help},
        {"per_call",
         std::find(per_call.begin(), per_call.end(), descriptor.name) != per_call.end()}};
  }
  return HttpResponse::Json({{"id", instance->id()},
                             {"generation", instance->generation_number()},
                             {"options", options}});
}

HttpResponse UpdateBackendOptions(const ServeContext& context, const HttpRequest& request) {
  const std::string& id = request.params[0];
  auto body = ParseJsonBody(request.body, context.max_json_depth);
  if (!body.ok())
    return HttpResponse::FromStatus(body.error());
  if (!body->is_object()) {
    return HttpResponse::Error(
        400, "the body must be a JSON object of option values, e.g. {\"deterministic\": true}");
  }
  std::vector<OptionDescriptor> descriptors;
  {
    const auto instance = context.runtime.Backend(id);
    if (instance == nullptr)
      return HttpResponse::Error(404, "this server has no backend " + Quoted(id));
    descriptors = instance->DescribeOptions();
  }
  // Convert every value before applying any: one bad key applies nothing.
  auto changes = OptionsFromJson(body.value(), descriptors, id);
  if (!changes.ok()) {
    const Status& refused = changes.error();
    return HttpResponse::Error(HttpStatusFor(refused.code()),
                               refused.message() + "; nothing applied");
  }
  Status updated = context.runtime.UpdateBackendOptions(id, changes.value());
  if (!updated.ok())
    return HttpResponse::FromStatus(updated);
  Log().info("backend {} options updated: {}", id, body->dump());
  return DescribeBackendOptions(context.runtime, id);
}

json DeployOutcomeJson(const DeployOutcome& outcome) {
  return {{"action", ToString(outcome.action)},
          {"id", outcome.backend_id},
          {"file", outcome.file.string()},
          {"generation", outcome.generation},
          {"message", outcome.message}};
}

// A deploy outcome as a response: a rejected file is 422 (the request was fine, the file is
// not) so that a deploy script fails; anything else is 200.
HttpResponse DeployOutcomeResponse(const BackendRegistry& registry, const DeployOutcome& outcome) {
  json body = DeployOutcomeJson(outcome);
  if (auto status = registry.Describe(outcome.backend_id))
    body["backend"] = BackendStatusJson(*status);
  if (outcome.action == DeployOutcome::Action::kRejected) {
    body["error"] = "backend file " + outcome.file.string() + " rejected: " + outcome.message;
    return HttpResponse::Json(body, 422);
  }
  return HttpResponse::Json(body);
}

// Every served model version whose network keeps shape programs (dynamic input dimensions).
std::vector<ShapeProgramSample> ShapeProgramSamples(const ServeContext& context) {
  std::vector<ShapeProgramSample> samples;
  std::string previous;
  for (const auto& entry : context.repository.Index()) {  // one entry per version, by name
    if (entry.name == previous)
      continue;
    previous = entry.name;
    auto model = context.repository.Find(entry.name);
    if (model == nullptr)
      continue;
    for (const auto& [number, version] : model->versions) {
      auto stats = context.runtime.GetShapePrograms(version->network_id());
      if (!stats.ok() || (stats->capacity == 0 && stats->misses == 0))
        continue;
      samples.push_back({.model = model->name,
                         .version = std::to_string(number),
                         .hits = stats->hits,
                         .misses = stats->misses,
                         .compiles = stats->compiles,
                         .compile_failures = stats->compile_failures,
                         .evictions = stats->evictions,
                         .programs = stats->programs.size(),
                         .capacity = stats->capacity});
    }
  }
  return samples;
}

// Whether each model version of the repository serves (backplane_model_ready).
std::vector<ModelReadySample> ModelReadySamples(const ServeContext& context) {
  std::vector<ModelReadySample> samples;
  for (const auto& entry : context.repository.Index())
    samples.push_back({entry.name, entry.version, entry.state == "READY"});
  return samples;
}

// A model's batching configuration and how its requests were executed: requests against
// executions, the batch-size and queue-delay histograms' counts and sums, and batches' execution
// times by size (the buckets are in /metrics).
json BatchingJson(const ServingModel& model) {
  json body = {{"max_batch_size", model.config.max_batch_size}};
  if (const auto& batching = model.config.dynamic_batching) {
    body["dynamic_batching"] = {{"max_queue_delay_us", batching->max_queue_delay_us},
                                {"preferred_batch_sizes", batching->preferred_batch_sizes},
                                {"preserve_ordering", batching->preserve_ordering}};
  } else {
    body["dynamic_batching"] = nullptr;
  }
  const ModelMetrics& metrics = *model.metrics;
  const auto batch_size = metrics.batching.batch_size.Read();
  const auto queue_delay = metrics.batching.queue_delay_seconds.Read();
  body["requests"] = metrics.requests.load(std::memory_order_relaxed);
  body["executions"] = metrics.batching.executions.load(std::memory_order_relaxed);
  body["batches"] = batch_size.count;
  body["batched_rows"] = batch_size.sum;
  body["queue_delay_seconds_sum"] = queue_delay.sum;
  body["queue_delay_count"] = queue_delay.count;
  body["waits_skipped"] = metrics.batching.waits_skipped.load(std::memory_order_relaxed);
  // Triton's batch_stats: per execution size, how many batches ran at it and their time.
  json executions = json::array();
  for (const auto& [rows, seconds] : metrics.batching.ExecutionSeconds()) {
    executions.push_back(
        {{"batch_size", rows}, {"count", seconds.count}, {"seconds_sum", seconds.sum}});
  }
  body["batch_executions"] = std::move(executions);
  return body;
}

HttpResponse Placement(const ServeContext& context, const HttpRequest& request) {
  auto resolved = ResolveModel(context.repository, request.params[0], request.params[1]);
  if (!resolved.ok())
    return HttpResponse::FromStatus(resolved.error());
  json versions = json::array();
  for (const auto& [number, version] : resolved->model->versions) {
    if (!request.params[1].empty() && version != resolved->version)
      continue;
    auto placement = context.runtime.GetPlacement(version->network_id());
    if (!placement.ok())
      return HttpResponse::FromStatus(placement.error());
    json layers = json::array();
    for (const auto& layer : placement.value()) {
      layers.push_back({{"node", layer.node},
                        {"op_type", layer.op_type},
                        {"backend", layer.backend_id},
                        {"generation", layer.generation},
                        // SDK 1.1: compiled into one workload with the run starting at
                        // `subgraph`; `note` is what the backend said about the layer.
                        {"compiled", layer.compiled},
                        {"subgraph", layer.subgraph},
                        {"note", layer.note},
                        // Dynamic input dimensions: the run is compiled per input shape on
                        // first use (docs/performance.md, "Shape programs").
                        {"compiled_per_input_shape", layer.compiled_per_input_shape},
                        // Every option of the backend at the value this layer was prepared
                        // with: the model's own, else the server's, else the default.
                        {"options", OptionsJson(layer.options)}});
    }
    versions.push_back({{"version", std::to_string(number)}, {"layers", layers}});
  }
  return HttpResponse::Json({{"name", resolved->model->name},
                             {"versions", versions},
                             {"batching", BatchingJson(*resolved->model)}});
}

// Per served version of the model (one when the request names it): the model's own option
// values per backend (config.json "backend_options", then updates), and the effective values
// each backend's layers run with.
HttpResponse ModelOptions(const ServeContext& context, const ResolvedModel& resolved,
                          bool one_version) {
  json versions = json::array();
  for (const auto& [number, version] : resolved.model->versions) {
    if (one_version && version != resolved.version)
      continue;
    auto own = context.runtime.GetNetworkOptions(version->network_id());
    auto placement = context.runtime.GetPlacement(version->network_id());
    if (!own.ok())
      return HttpResponse::FromStatus(own.error());
    if (!placement.ok())
      return HttpResponse::FromStatus(placement.error());
    json own_json = json::object();
    for (const auto& [id, options] : own.value())
      own_json[id] = OptionsJson(options);
    json effective = json::object();
    for (const auto& layer : placement.value()) {
      if (!effective.contains(layer.backend_id))
        effective[layer.backend_id] = OptionsJson(layer.options);
    }
    json instances = nullptr;
    if (auto counts = context.runtime.GetNetworkInstances(version->network_id()); counts.ok()) {
      instances = {
          {"limit", counts->limit}, {"running", counts->running}, {"waiting", counts->waiting}};
    }
    versions.push_back({{"version", std::to_string(number)},
                        {"backend_options", std::move(own_json)},
                        {"effective", std::move(effective)},
                        {"instances", std::move(instances)}});
  }
  return HttpResponse::Json({{"name", resolved.model->name}, {"versions", versions}});
}

// PUT {"ID": {"key": value}, ...}: the values of every backend typed and checked by the backend
// (names, types, ranges) before any is applied, then each version's network re-prepared with
// them (Runtime::UpdateNetworkOptions). The values hold until the version unloads; a load of
// the model with a changed config.json replaces them.
HttpResponse UpdateModelOptions(const ServeContext& context, const HttpRequest& request) {
  auto resolved = ResolveModel(context.repository, request.params[0], request.params[1]);
  if (!resolved.ok())
    return HttpResponse::FromStatus(resolved.error());
  auto body = ParseJsonBody(request.body, context.max_json_depth);
  if (!body.ok())
    return HttpResponse::FromStatus(body.error());
  if (!body->is_object() || body->empty()) {
    return HttpResponse::Error(400,
                               "the body must be a JSON object of option values per backend id, "
                               "e.g. {\"CpuAcc\": {\"intra_op_threads\": 1}}");
  }
  OptionsByBackend changes;
  for (const auto& [id, values] : body->items()) {
    const auto instance = context.runtime.Backend(id);
    if (instance == nullptr)
      return HttpResponse::Error(404, "this server has no backend " + Quoted(id));
    auto typed = OptionsFromJson(values, instance->DescribeOptions(), id);
    Status checked = typed.ok() ? instance->CheckNetworkOptions(typed.value()) : typed.error();
    if (!checked.ok())
      return HttpResponse::FromStatus(checked.WithContext("nothing applied: "));
    changes.emplace(id, std::move(typed).value());
  }
  const bool one_version = !request.params[1].empty();
  for (const auto& [number, version] : resolved->model->versions) {
    if (one_version && version != resolved->version)
      continue;
    for (const auto& [id, options] : changes) {
      Status updated = context.runtime.UpdateNetworkOptions(version->network_id(), id, options);
      if (!updated.ok()) {
        return HttpResponse::FromStatus(updated.WithContext(
            "model " + resolved->model->name + " version " + std::to_string(number) + ": "));
      }
    }
  }
  Log().info("model {} options updated through the admin API: {}", resolved->model->name,
             body->dump());
  return ModelOptions(context, resolved.value(), one_version);
}

json ArmJson(const RolloutArmStats& arm) {
  return {{"generation", arm.generation},
          {"requests", arm.requests},
          {"errors", arm.errors},
          {"p50_us", arm.latency.QuantileMicros(0.5)},
          {"p99_us", arm.latency.QuantileMicros(0.99)}};
}

json RolloutStatsJson(const RolloutStats& stats) {
  const ShadowStats& shadow = stats.shadow;
  return {{"stable", ArmJson(stats.stable)},
          {"candidate", ArmJson(stats.candidate)},
          // Generation 0: the rollout has no baseline (rollout.baseline false, or its build did
          // not load again).
          {"baseline", ArmJson(stats.baseline)},
          {"shadow",
           {{"samples", shadow.samples},
            {"errors", shadow.errors},
            {"skipped", shadow.skipped},
            {"diverged", shadow.diverged},
            {"argmax_disagreements", shadow.argmax_disagreements},
            {"max_abs_difference", shadow.max_abs_difference},
            {"max_relative_difference", shadow.max_relative_difference},
            {"timeouts", shadow.timeouts},
            // The shadow runs on the candidate and the same requests' runs on the stable
            // generation: what the shadow phase's latency verdict compares.
            {"p50_us", shadow.latency.QuantileMicros(0.5)},
            {"p99_us", shadow.latency.QuantileMicros(0.99)},
            {"stable_p50_us", shadow.stable_latency.QuantileMicros(0.5)},
            {"stable_p99_us", shadow.stable_latency.QuantileMicros(0.99)},
            {"slower", shadow.slower}}}};
}

// Which transitions of a rollout's history an answer carries. They are numbered from 0, the
// rollout's first, dropped ones included, so that a client that polls with `from` one past the
// last number it saw gets only what is new.
struct HistoryPage {
  uint64_t from = 0;  // clamped up to the oldest kept
  uint64_t limit = kMaxHistoryPage;
  static constexpr uint64_t kMaxHistoryPage = 100;
};

// ?history_from=N&history_limit=M; a malformed or unknown parameter is refused, not ignored: a
// typo would otherwise silently return another page.
Result<HistoryPage> ParseHistoryPage(std::string_view query) {
  HistoryPage page;
  while (!query.empty()) {
    const std::string_view pair = query.substr(0, query.find('&'));
    query.remove_prefix(std::min(query.size(), pair.size() + 1));
    if (pair.empty())
      continue;
    const std::size_t equals = pair.find('=');
    const std::string_view key = pair.substr(0, equals);
    const std::string_view text =
        equals == std::string_view::npos ? std::string_view() : pair.substr(equals + 1);
    if (key != "history_from" && key != "history_limit") {
      return InvalidArgument("unknown query parameter " + Quoted(key) +
                             " (known: history_from, history_limit)");
    }
    uint64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    const bool limit = key == "history_limit";
    if (text.empty() || error != std::errc() || end != text.data() + text.size() ||
        (limit && (value == 0 || value > HistoryPage::kMaxHistoryPage))) {
      return InvalidArgument(
          "query parameter " + std::string(key) + " must be " +
          (limit ? "an integer from 1 to " + std::to_string(HistoryPage::kMaxHistoryPage)
                 : std::string("a transition number, an integer from 0")) +
          ", got " + Quoted(text));
    }
    (limit ? page.limit : page.from) = value;
  }
  return page;
}

json RolloutJson(const RolloutView& view, const HistoryPage& page) {
  // view.history holds the transitions numbered history_dropped onwards.
  const uint64_t total = view.history_dropped + view.history.size();
  const uint64_t first = std::clamp(page.from, view.history_dropped, total);
  json history = json::array();
  for (uint64_t number = first; number < total && number < first + page.limit; ++number) {
    const auto& transition = view.history[number - view.history_dropped];
    history.push_back({{"at", Rfc3339(transition.at)},
                       {"phase", PhaseName(transition.to)},
                       {"weight_percent", transition.weight_percent},
                       {"why", transition.why}});
  }
  json body = {{"backend", view.backend_id},
               {"phase", PhaseName(view.phase)},
               {"stable_generation", view.stable_generation},
               {"candidate_generation", view.candidate_generation},
               {"promoted_generation", view.promoted_generation},
               {"baseline_generation", view.baseline_generation},
               {"baseline_lost", view.baseline_lost},
               {"weight_percent", view.weight_percent},
               {"step", view.step},
               {"samples", view.samples},
               {"decided_by", view.decided_by},
               {"reason", view.reason},
               {"policy", RolloutPolicyJson(view.policy)},
               {"window", RolloutStatsJson(view.window)},
               {"totals", view.totals ? RolloutStatsJson(*view.totals) : json(nullptr)},
               {"history", history},
               {"history_first", first},
               {"history_total", total},
               {"history_dropped", view.history_dropped},
               {"pinned", view.pinned},
               {"rejected", nullptr}};
  if (view.phase == RolloutPhase::kPaused)
    body["paused_in"] = PhaseName(view.paused_in);
  if (view.rejected) {
    body["rejected"] = {{"generation", view.rejected->generation},
                        {"file", view.rejected->resolved_file.string()},
                        {"sha256", view.rejected->sha256},
                        {"reason", view.rejected->rejection.ToString()}};
  }
  return body;
}

// `page`: the history the answer carries; nullopt (an admin verb's answer) only the newest
// transition, the one the verb made: GET …/rollout pages through the rest.
HttpResponse RolloutResponse(const ServeContext& context, std::string_view id,
                             std::optional<HistoryPage> page) {
  auto view = context.rollouts.View(id);
  if (!view.ok())
    return UnknownBackend(context.registry, id);
  const uint64_t total = view->history_dropped + view->history.size();
  json body = RolloutJson(view.value(), page.value_or(HistoryPage{total == 0 ? 0 : total - 1, 1}));
  // What a deploy does on this server, so that fleet tooling can check before it publishes.
  body["deploy_policy"] =
      context.registry.deploy_policy() == DeployPolicy::kProgressive ? "progressive" : "immediate";
  return HttpResponse::Json(body);
}

}  // namespace

json RejectedFileJson(const loader::RejectedFile& rejected) {
  return {{"file", rejected.file.string()},
          // The versioned file behind a link: the build that was refused.
          {"resolved_file", rejected.resolved_file.empty() ? rejected.file.string()
                                                           : rejected.resolved_file.string()},
          {"reason", rejected.error.name()},
          {"message", rejected.error.message()}};
}

json BackendStatusJson(const BackendStatus& status) {
  json generations = json::array();
  for (const auto& generation : status.generations) {
    generations.push_back(
        {{"generation", generation.generation},
         {"state", ToString(generation.state)},
         {"file", generation.file.string()},
         {"resolved_file", generation.resolved_file.string()},
         {"sha256", generation.sha256},
         {"release", generation.release},
         {"api_version", std::to_string(generation.api_version.major) + "." +
                             std::to_string(generation.api_version.minor)},
         {"build_id", generation.build_id},
         // "worker process 1234" (backend_isolation; kept after the worker ended), else "server".
         {"runs_in", generation.runs_in.empty() ? "server" : generation.runs_in},
         {"refcount", generation.refcount},
         {"loaded_at", Rfc3339(generation.loaded_at)},
         {"drain_ms", generation.drain_ms ? json(*generation.drain_ms) : json(nullptr)},
         {"reason",
          generation.rejection.ok() ? json(nullptr) : json(generation.rejection.ToString())}});
  }
  json rejected = json::array();
  for (const auto& file : status.rejected)
    rejected.push_back(RejectedFileJson(file));
  // The state directory's word on this id: builds on probation, and builds suspected of a crash
  // (refused until another file is published or the backend is reloaded).
  json activations = json::array();
  for (const auto& record : status.activations) {
    activations.push_back({{"state", ToString(record.state)},
                           {"sha256", record.sha256},
                           {"file", record.file.string()},
                           {"generation", record.generation},
                           {"activated_at", Rfc3339(record.activated_at)}});
  }
  return {{"id", status.id},
          {"static", status.is_static},
          {"active_generation", status.active_generation},
          {"candidate_generation", status.candidate_generation},
          {"pinned", status.pinned},
          {"withdrawn", status.withdrawn},
          {"file", status.file.string()},
          {"generations", generations},
          {"rejected", rejected},
          {"activations", activations}};
}

void AddAdminRoutes(HttpServer& http, const ServeContext& context) {
  using Access = HttpServer::Access;

  http.Get("/metrics", [context](const HttpRequest&) {
    HttpResponse response;
    response.content_type = "text/plain; version=0.0.4; charset=utf-8";
    response.body =
        context.metrics.Render(&context.registry, context.loader_stats,
                               ShapeProgramSamples(context), ModelReadySamples(context)) +
        context.rollouts.RenderMetrics();
    if (context.crash_supervisor != nullptr)
      response.body += RenderWorkerMetrics(context.registry, context.crash_supervisor->Counts());
    return response;
  });

  http.Get("/v2/models/{}[/versions/{}]/placement",
           [context](const HttpRequest& request) { return Placement(context, request); });
  http.Get("/v2/models/{}[/versions/{}]/options", [context](const HttpRequest& request) {
    auto resolved = ResolveModel(context.repository, request.params[0], request.params[1]);
    if (!resolved.ok())
      return HttpResponse::FromStatus(resolved.error());
    return ModelOptions(context, resolved.value(), !request.params[1].empty());
  });
  http.Put("/v2/models/{}[/versions/{}]/options", Access::kAdmin,
           [context](const HttpRequest& request) { return UpdateModelOptions(context, request); });

  http.Get("/v2/backends", [context](const HttpRequest&) {
    json backends = json::array();
    for (const auto& status : context.registry.Describe())
      backends.push_back(BackendStatusJson(status));
    json rejected = json::array();
    for (const auto& file : context.registry.Rejected())
      rejected.push_back(RejectedFileJson(file));
    return HttpResponse::Json({{"backends", backends}, {"rejected", rejected}});
  });
  http.Get(kBackendPath, [context](const HttpRequest& request) {
    auto status = context.registry.Describe(request.params[0]);
    if (!status)
      return UnknownBackend(context.registry, request.params[0]);
    return HttpResponse::Json(BackendStatusJson(*status));
  });

  http.Post(std::string(kBackendPath) + "/reload", Access::kAdmin,
            [context](const HttpRequest& request) {
              auto outcome = context.registry.Reload(request.params[0]);
              if (!outcome.ok())
                return HttpResponse::FromStatus(outcome.error());
              Log().info("reload of backend {} asked through the admin API: {} {}",
                         request.params[0], ToString(outcome->action), outcome->message);
              return DeployOutcomeResponse(context.registry, outcome.value());
            });
  http.Post(std::string(kBackendPath) + "/rollback", Access::kAdmin,
            [context](const HttpRequest& request) {
              auto generation = context.registry.Rollback(request.params[0]);
              if (!generation.ok())
                return HttpResponse::FromStatus(generation.error());
              Log().info("backend {} rolled back to generation {} through the admin API",
                         request.params[0], generation.value());
              json body = {{"id", request.params[0]}, {"active_generation", generation.value()}};
              if (auto status = context.registry.Describe(request.params[0]))
                body["backend"] = BackendStatusJson(*status);
              return HttpResponse::Json(body);
            });
  http.Post(std::string(kBackendPath) + "/pin", Access::kAdmin,
            [context](const HttpRequest& request) {
              Status pinned = context.registry.Pin(request.params[0]);
              if (!pinned.ok())
                return HttpResponse::FromStatus(pinned);
              Log().info("backend {} pinned through the admin API", request.params[0]);
              auto status = context.registry.Describe(request.params[0]);
              return status ? HttpResponse::Json(BackendStatusJson(*status))
                            : UnknownBackend(context.registry, request.params[0]);
            });
  http.Post(std::string(kBackendPath) + "/unpin", Access::kAdmin,
            [context](const HttpRequest& request) {
              auto outcome = context.registry.Unpin(request.params[0]);
              if (!outcome.ok())
                return HttpResponse::FromStatus(outcome.error());
              Log().info("backend {} unpinned through the admin API: {}", request.params[0],
                         ToString(outcome->action));
              return DeployOutcomeResponse(context.registry, outcome.value());
            });

  // Progressive rollouts (docs/hot-reload.md, "Progressive rollout").
  http.Get(std::string(kBackendPath) + "/rollout", [context](const HttpRequest& request) {
    auto page = ParseHistoryPage(request.query);
    if (!page.ok())
      return HttpResponse::FromStatus(page.error());
    return RolloutResponse(context, request.params[0], page.value());
  });
  http.Post(std::string(kBackendPath) + "/rollout/{}", Access::kAdmin,
            [context](const HttpRequest& request) {
              const std::string& id = request.params[0];
              const std::string& verb = request.params[1];
              if (!context.registry.Describe(id))
                return UnknownBackend(context.registry, id);
              Status done;
              if (verb == "advance") {
                done = context.rollouts.Advance(id);
              } else if (verb == "pause") {
                done = context.rollouts.Pause(id);
              } else if (verb == "resume") {
                done = context.rollouts.Resume(id);
              } else if (verb == "abort") {
                done = context.rollouts.Abort(id);
              } else {
                return HttpResponse::Error(404, "unknown rollout action " + Quoted(verb) +
                                                    " (known: advance, pause, resume, abort)");
              }
              if (!done.ok())
                return HttpResponse::FromStatus(done);
              Log().info("rollout of backend {}: {} asked through the admin API", id, verb);
              return RolloutResponse(context, id, std::nullopt);
            });
  http.Put(std::string(kBackendPath) + "/rollout/policy", Access::kAdmin,
           [context](const HttpRequest& request) {
             const std::string& id = request.params[0];
             auto view = context.rollouts.View(id);
             if (!view.ok())
               return UnknownBackend(context.registry, id);
             auto body = ParseJsonBody(request.body, context.max_json_depth);
             if (!body.ok())
               return HttpResponse::FromStatus(body.error());
             // Start-up settings: what they choose is loaded with the candidate's file.
             if (body->is_object() && body->contains("candidate_isolation")) {
               return HttpResponse::FromStatus(InvalidArgument(
                   "'candidate_isolation' is a start-up setting (server config 'rollout'): a "
                   "candidate's place is chosen when its file loads"));
             }
             if (body->is_object() && body->contains("baseline")) {
               return HttpResponse::FromStatus(InvalidArgument(
                   "'baseline' is a start-up setting (server config 'rollout'): a candidate's "
                   "baseline is loaded with it, when its file loads"));
             }
             RolloutPolicy policy = view->policy;
             Status applied = ApplyRolloutPolicy(body.value(), "the request body", policy);
             if (applied.ok())
               applied = context.rollouts.SetPolicy(id, policy);
             if (!applied.ok())
               return HttpResponse::FromStatus(applied);
             return RolloutResponse(context, id, std::nullopt);
           });

  http.Get(std::string(kBackendPath) + "/options", [context](const HttpRequest& request) {
    return DescribeBackendOptions(context.runtime, request.params[0]);
  });
  http.Put(
      std::string(kBackendPath) + "/options", Access::kAdmin,
      [context](const HttpRequest& request) { return UpdateBackendOptions(context, request); });
}

}  // namespace backplane::server
