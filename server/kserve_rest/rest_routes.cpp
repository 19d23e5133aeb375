#include "kserve_rest/rest_routes.hpp"

#include "kserve_rest/kserve_json.hpp"

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

// Taken from the I/O thread: the parse, the run and the rendering happen where the model's queue
// runs them (a TBB worker, a batcher's threads), which hands the response back.
void Infer(const InferenceApi& inference, int max_json_depth, HttpRequest request,
           HttpServer::Responder respond) {
  auto shared = std::make_shared<const HttpRequest>(std::move(request));
  inference.Infer(InferenceCall{
      .model = shared->params[0],
      .version = shared->params[1],
      .parse = [shared, max_json_depth](const Network& network) -> Result<InferenceRequest> {
        // Streamed from the body's text: no JSON document of the request is ever built.
        auto body = SplitInferenceBody(shared->body, shared->header(kInferenceHeaderContentLength));
        if (!body.ok())
          return body.error();
        return ParseInferenceRequest(*body, network, ParseLimits{.max_json_depth = max_json_depth});
      },
      .run_on = RunOn::kQueue,  // never on the I/O thread: a large body parses for milliseconds
      .deadline = shared->deadline,
      .done =
          [respond = std::move(respond)](Result<InferenceOutcome> outcome) {
            respond(InferenceResponse(std::move(outcome)));
          },
  });
}

HttpResponse ModelMetadata(const InferenceApi& inference, const HttpRequest& request) {
  auto resolved = inference.Resolve(request.params[0], request.params[1]);
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

HttpResponse ModelReady(const InferenceApi& inference, const HttpRequest& request) {
  auto resolved = inference.Resolve(request.params[0], request.params[1]);
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

void AddKServeRoutes(HttpServer& http, const InferenceApi& inference, int max_json_depth) {
  http.Get("/v2/health/live", [](const HttpRequest&) {
    return HttpResponse::Json({{"live", true}});
  });
  http.Get("/v2/health/ready", [&inference](const HttpRequest&) {
    if (!inference.ready())
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
           [&inference](const HttpRequest& request) { return ModelMetadata(inference, request); });
  http.Get(std::string(kModelPath) + "/ready",
           [&inference](const HttpRequest& request) { return ModelReady(inference, request); });
  http.PostAsync(std::string(kModelPath) + "/infer", HttpServer::Access::kPublic,
                 [&inference, max_json_depth](HttpRequest request, HttpServer::Responder respond) {
                   Infer(inference, max_json_depth, std::move(request), std::move(respond));
                 });
}

void AddRepositoryRoutes(HttpServer& http, ModelRepository& repository, int max_json_depth) {
  http.Post("/v2/repository/index", HttpServer::Access::kPublic,
            [&repository, max_json_depth](const HttpRequest& request) {
              bool ready_only = false;
              if (!request.body.empty()) {
                auto body = ParseJsonBody(request.body, max_json_depth);
                if (!body.ok())
                  return HttpResponse::FromStatus(body.error());
                if (!body->is_object())
                  return HttpResponse::Error(400, "the request body must be a JSON object");
                for (const auto& [key, value] : body->items()) {
                  if (key != "ready" || !value.is_boolean()) {
                    return HttpResponse::Error(
                        400, "the index request takes only {\"ready\": true|false}, got key '" +
                                 key + "'");
                  }
                  ready_only = value.get<bool>();
                }
              }
              json index = json::array();
              for (const auto& entry : repository.Index()) {
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
            [&repository, max_json_depth](const HttpRequest& request) {
              Status body = CheckRepositoryBody(request, max_json_depth, {});
              if (!body.ok())
                return HttpResponse::FromStatus(body);
              Status loaded = repository.Load(request.params[0]);
              if (!loaded.ok())
                return HttpResponse::FromStatus(loaded);
              return HttpResponse::Json(ModelState(repository, request.params[0]));
            });
  http.Post("/v2/repository/models/{}/unload", HttpServer::Access::kAdmin,
            [&repository, max_json_depth](const HttpRequest& request) {
              Status body = CheckRepositoryBody(request, max_json_depth, {"unload_dependents"});
              if (!body.ok())
                return HttpResponse::FromStatus(body);
              Status unloaded = repository.Unload(request.params[0]);
              if (!unloaded.ok())
                return HttpResponse::FromStatus(unloaded);
              return HttpResponse::Json(ModelState(repository, request.params[0]));
            });
}

}  // namespace backplane::server
