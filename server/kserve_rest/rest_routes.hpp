// The KServe v2 / Open Inference Protocol REST endpoints (health, server and model metadata,
// readiness, inference) and Triton's model repository extension (index, load, unload).
#pragma once

#include "http/http_server.hpp"
#include "serving/serving_context.hpp"

namespace backplane::server {

// Registers the routes on `http`; `context` must outlive it. Load and unload are admin routes
// (bearer token when one is set).
void AddKServeRoutes(HttpServer& http, const ServeContext& context);

}  // namespace backplane::server
