// The KServe v2 / Open Inference Protocol REST endpoints (health, server and model metadata,
// readiness, inference) and Triton's model repository extension (index, load, unload).
#pragma once

#include "http/http_server.hpp"
#include "serving/inference.hpp"
#include "serving/model_repository.hpp"

namespace backplane::server {

// The inference routes: health, server and model metadata, readiness, inference. They see the
// server through `inference` alone, which must outlive `http`.
void AddKServeRoutes(HttpServer& http, const InferenceApi& inference, int max_json_depth);
// The repository extension: index (public), load and unload (admin routes: bearer token when one
// is set). `repository` must outlive `http`.
void AddRepositoryRoutes(HttpServer& http, ModelRepository& repository, int max_json_depth);

}  // namespace backplane::server
