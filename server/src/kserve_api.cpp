#include "kserve_api.hpp"

#include <chrono>

#include "inference_api.hpp"
#include "metrics.hpp"
#include "model_repository.hpp"
#include "server_log.hpp"

namespace backplane::server {
using nlohmann::json;

namespace {

constexpr char kModelPath[] = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";

// Admits one request of a model against its max_in_flight; releases on destruction.
class ModelAdmission {
 public:
  ModelAdmission(ModelMetrics& metrics, int64_t limit) : metrics_(metrics) {
    const int64_t before = metrics_.in_flight.fetch_add(1);
    admitted_ = limit <= 0 || before < limit;
    if (!admitted_)
      metrics_.in_flight.fetch_sub(1);
  }
  ~ModelAdmission() {
    if (admitted_)
      metrics_.in_flight.fetch_sub(1);
  }
  ModelAdmission(const ModelAdmission&) = delete;
  ModelAdmission& operator=(const ModelAdmission&) = delete;
  bool admitted() const { return admitted_; }

 private:
  ModelMetrics& metrics_;
  bool admitted_ = false;
};

HttpResponse Infer(const ServeContext& context, const HttpRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  auto resolved = ResolveModel(context.repository, request.params[0], request.params[1]);
  if (!resolved.ok()) {
    // Count only models of the repository: labels from arbitrary client input would grow the
    // metrics without bound.
    if (resolved.error().code() == StatusCode::kUnavailable) {
      ModelMetrics& unavailable = context.metrics.ForModel(request.params[0]);
      unavailable.requests.fetch_add(1, std::memory_order_relaxed);
      unavailable.CountFailure(503);
    }
    return HttpResponse::FromStatus(resolved.error());
  }
  const ServingModel& model = *resolved->model;
  const ModelVersion& version = *resolved->version;
  ModelMetrics& metrics = *model.metrics;
  metrics.requests.fetch_add(1, std::memory_order_relaxed);
  const auto fail = [&](HttpResponse response) {
    metrics.CountFailure(response.status);
    return response;
  };

  auto body = ParseJsonBody(request.body, context.max_json_depth);
  if (!body.ok())
    return fail(HttpResponse::FromStatus(body.error()));
  auto parsed = ParseInferenceRequest(body.value(), version.network());
  if (!parsed.ok()) {
    return fail(HttpResponse::Error(400, "model '" + model.name + "' version " +
                                             std::to_string(version.version()) + ": " +
                                             parsed.error().message()));
  }

  ModelAdmission admission(metrics, model.config.max_in_flight);
  if (!admission.admitted()) {
    HttpResponse response = HttpResponse::Error(
        503, "model '" + model.name + "' has " + std::to_string(model.config.max_in_flight) +
                 " requests in flight, its max_in_flight; retry later");
    response.headers.emplace_back("Retry-After", "1");
    return fail(std::move(response));
  }
  std::vector<ConstTensorView> views;
  views.reserve(parsed->inputs.size());
  for (const auto& tensor : parsed->inputs)
    views.push_back(tensor.View());
  auto outputs = context.runtime.Execute(version.network_id(), views);
  if (!outputs.ok()) {
    if (outputs.error().code() == StatusCode::kInternal)
      Log().error("model {} version {}: {}", model.name, version.version(),
                   outputs.error().message());
    return fail(HttpResponse::FromStatus(outputs.error()));
  }
  HttpResponse response;
  response.body = RenderInferenceResponse(model.name, version.version(), parsed.value(),
                                          version.network(), outputs.value());
  metrics.latency_seconds.Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return response;
}

HttpResponse ModelMetadata(const ServeContext& context, const HttpRequest& request) {
  auto resolved = ResolveModel(context.repository, request.params[0], request.params[1]);
  if (!resolved.ok())
    return HttpResponse::FromStatus(resolved.error());
  std::vector<int64_t> versions;
  for (const auto& [number, loaded] : resolved->model->versions)
    versions.push_back(number);
  return HttpResponse::Json(
      RenderModelMetadata(resolved->model->name, versions, resolved->version->network()));
}

HttpResponse ModelReady(const ServeContext& context, const HttpRequest& request) {
  auto resolved = ResolveModel(context.repository, request.params[0], request.params[1]);
  if (!resolved.ok())
    return HttpResponse::FromStatus(resolved.error());
  return HttpResponse::Json({{"name", resolved->model->name},
                             {"version", std::to_string(resolved->version->version())},
                             {"ready", true}});
}

// The optional body of the repository calls: {} or {"parameters": {...}}. Parameters that would
// change what is loaded (Triton's config override, file upload) are refused, not ignored.
Status CheckRepositoryBody(const HttpRequest& request, int max_json_depth,
                           std::initializer_list<std::string_view> allowed_parameters) {
  if (request.body.empty())
    return Status::Ok();
  auto body = ParseJsonBody(request.body, max_json_depth);
  if (!body.ok())
    return body.error();
  if (!body->is_object())
    return InvalidArgument("the request body must be a JSON object");
  for (const auto& [key, value] : body->items()) {
    if (key != "parameters")
      return InvalidArgument("unknown key '" + key + "' (known: parameters)");
    if (!value.is_object())
      return InvalidArgument("'parameters' must be an object");
    for (const auto& [name, parameter] : value.items()) {
      bool allowed = false;
      for (auto known : allowed_parameters)
        allowed = allowed || name == known;
      if (!allowed) {
        return InvalidArgument("parameter '" + name +
                               "' is not supported: the server loads what is in the model "
                               "repository");
      }
    }
  }
  return Status::Ok();
}

json ModelState(const ModelRepository& repository, const std::string& name) {
  json versions = json::array();
  if (auto model = repository.Find(name)) {
    for (const auto& [number, loaded] : model->versions)
      versions.push_back(std::to_string(number));
  }
  return {{"name", name},
          {"state", versions.empty() ? "UNAVAILABLE" : "READY"},
          {"versions", versions}};
}

}  // namespace

void AddKServeRoutes(HttpServer& http, const ServeContext& context) {
  http.Get("/v2/health/live", [](const HttpRequest&) {
    return HttpResponse::Json({{"live", true}});
  });
  http.Get("/v2/health/ready", [context](const HttpRequest&) {
    if (!context.ready.load())
      return HttpResponse::Error(503, "not ready: the server is starting or shutting down");
    return HttpResponse::Json({{"ready", true}});
  });
  http.Get("/v2", [](const HttpRequest&) {
    return HttpResponse::Json(
        {{"name", "backplane"},
         {"version", BACKPLANE_VERSION},
         {"extensions", {"model_repository", "backend_admin", "model_placement", "metrics"}}});
  });
  http.Get(kModelPath,
           [context](const HttpRequest& request) { return ModelMetadata(context, request); });
  http.Get(std::string(kModelPath) + "/ready",
           [context](const HttpRequest& request) { return ModelReady(context, request); });
  http.Post(std::string(kModelPath) + "/infer", HttpServer::Access::kPublic,
            [context](const HttpRequest& request) { return Infer(context, request); });

  http.Post(
      "/v2/repository/index", HttpServer::Access::kPublic, [context](const HttpRequest& request) {
        bool ready_only = false;
        if (!request.body.empty()) {
          auto body = ParseJsonBody(request.body, context.max_json_depth);
          if (!body.ok())
            return HttpResponse::FromStatus(body.error());
          if (!body->is_object())
            return HttpResponse::Error(400, "the request body must be a JSON object");
          for (const auto& [key, value] : body->items()) {
            if (key != "ready" || !value.is_boolean()) {
              return HttpResponse::Error(
                  400,
                  "the index request takes only {\"ready\": true|false}, got key '" + key + "'");
            }
            ready_only = value.get<bool>();
          }
        }
        json index = json::array();
        for (const auto& entry : context.repository.Index()) {
          if (ready_only && entry.state != "READY")
            continue;
          json line = {{"name", entry.name}, {"state", entry.state}};
          if (!entry.version.empty())
            line["version"] = entry.version;
          if (!entry.reason.empty())
            line["reason"] = entry.reason;
          index.push_back(std::move(line));
        }
        return HttpResponse::Json(index);
      });
  http.Post("/v2/repository/models/([^/]+)/load", HttpServer::Access::kAdmin,
            [context](const HttpRequest& request) {
              Status body = CheckRepositoryBody(request, context.max_json_depth, {});
              if (!body.ok())
                return HttpResponse::FromStatus(body);
              Status loaded = context.repository.Load(request.params[0]);
              if (!loaded.ok())
                return HttpResponse::FromStatus(loaded);
              return HttpResponse::Json(ModelState(context.repository, request.params[0]));
            });
  http.Post("/v2/repository/models/([^/]+)/unload", HttpServer::Access::kAdmin,
            [context](const HttpRequest& request) {
              Status body =
                  CheckRepositoryBody(request, context.max_json_depth, {"unload_dependents"});
              if (!body.ok())
                return HttpResponse::FromStatus(body);
              Status unloaded = context.repository.Unload(request.params[0]);
              if (!unloaded.ok())
                return HttpResponse::FromStatus(unloaded);
              return HttpResponse::Json(ModelState(context.repository, request.params[0]));
            });
}

}  // namespace backplane::server
