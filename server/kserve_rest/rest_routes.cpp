#include "kserve_rest/rest_routes.hpp"

#include "kserve_rest/kserve_json.hpp"
#include "serving/inference.hpp"
#include "serving/model_repository.hpp"

namespace backplane::server {
using nlohmann::json;

namespace {

constexpr char kModelPath[] = "/v2/models/{}[/versions/{}]";

HttpResponse InferenceResponse(Result<InferenceOutcome> outcome) {
  if (!outcome.ok())
    return HttpResponse::FromStatus(outcome.error());  // 503s carry their Retry-After
  // The inputs' memory is back before the response is rendered (the runtime releases them after
  // the run): a large request's tensors and its response are never resident together.
  auto rendered = RenderInferenceResponseWithBinary(
      outcome->model.model->name, outcome->model.version->version(), outcome->request,
      outcome->model.version->network(), outcome->outputs);
  // The outputs' memory back before the response is copied into the transport.
  outcome->outputs.clear();
  HttpResponse response;
  response.body = std::move(rendered.body);
  if (rendered.has_binary) {
    // As Triton answers: JSON then raw bytes, typed as octet-stream, split by this header.
    response.content_type = "application/octet-stream";
    response.headers.emplace_back(kInferenceHeaderContentLength,
                                  std::to_string(rendered.json_length));
  }
  return response;
}

// Queued on the runtime's scheduler from the I/O thread: the parse, the run and the rendering
// happen on a TBB worker, which hands the response back.
void Infer(const ServeContext& context, HttpRequest request, HttpServer::Responder respond) {
  auto shared = std::make_shared<const HttpRequest>(std::move(request));
  const int max_json_depth = context.max_json_depth;
  StartInference(
      context, shared->params[0], shared->params[1],
      [shared, max_json_depth](const Network& network) -> Result<InferenceRequest> {
        // Streamed from the body's text: no JSON document of the request is ever built.
        auto body = SplitInferenceBody(shared->body, shared->header(kInferenceHeaderContentLength));
        if (!body.ok())
          return body.error();
        return ParseInferenceRequest(*body, network, ParseLimits{.max_json_depth = max_json_depth});
      },
      ParseOn::kQueue,  // never on the I/O thread: a large body parses for milliseconds
      shared->deadline,
      [respond = std::move(respond)](Result<InferenceOutcome> outcome) {
        respond(InferenceResponse(std::move(outcome)));
      });
}

HttpResponse ModelMetadata(const ServeContext& context, const HttpRequest& request) {
  auto resolved = ResolveModel(context.repository, request.params[0], request.params[1]);
  if (!resolved.ok())
    return HttpResponse::FromStatus(resolved.error());
  std::vector<int64_t> versions;
  for (const auto& [number, loaded] : resolved->model->versions)
    versions.push_back(number);
  json metadata =
      RenderModelMetadata(resolved->model->name, versions, resolved->version->network());
  // The batch dimension and its maximum, in the Open Inference Protocol's optional metadata
  // "parameters" (Triton puts max_batch_size in its config endpoint, which Backplane lacks).
  if (const ModelConfig& config = resolved->model->config; config.max_batch_size > 0) {
    metadata["parameters"] = {{"batch_dimension", 0},
                              {"max_batch_size", config.max_batch_size},
                              {"dynamic_batching", config.dynamic_batching.has_value()}};
  }
  return HttpResponse::Json(metadata);
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
      return InvalidArgument("unknown key " + Quoted(key) + " (known: parameters)");
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
    json extensions = json::array();
    for (std::string_view extension : kServerExtensions)
      extensions.push_back(extension);
    return HttpResponse::Json(
        {{"name", "backplane"}, {"version", BACKPLANE_VERSION}, {"extensions", extensions}});
  });
  http.Get(kModelPath,
           [context](const HttpRequest& request) { return ModelMetadata(context, request); });
  http.Get(std::string(kModelPath) + "/ready",
           [context](const HttpRequest& request) { return ModelReady(context, request); });
  http.PostAsync(std::string(kModelPath) + "/infer", HttpServer::Access::kPublic,
                 [context](HttpRequest request, HttpServer::Responder respond) {
                   Infer(context, std::move(request), std::move(respond));
                 });

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
  http.Post("/v2/repository/models/{}/load", HttpServer::Access::kAdmin,
            [context](const HttpRequest& request) {
              Status body = CheckRepositoryBody(request, context.max_json_depth, {});
              if (!body.ok())
                return HttpResponse::FromStatus(body);
              Status loaded = context.repository.Load(request.params[0]);
              if (!loaded.ok())
                return HttpResponse::FromStatus(loaded);
              return HttpResponse::Json(ModelState(context.repository, request.params[0]));
            });
  http.Post("/v2/repository/models/{}/unload", HttpServer::Access::kAdmin,
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
