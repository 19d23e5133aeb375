// Backplane's own operational endpoints: the backend admin API under /v2/backends (generations,
// rejected files, reload, rollback, pin, unpin, options), model placement, and /metrics.
#pragma once

#include <nlohmann/json.hpp>

#include "backplane/core/options.hpp"
#include "backplane/registry/backend_registry.hpp"
#include "http/http_server.hpp"
#include "serving/serving_context.hpp"

namespace backplane::server {

// Registers the routes on `http`; `context` must outlive it. Mutating calls are admin routes
// (bearer token when one is set).
void AddAdminRoutes(HttpServer& http, const ServeContext& context);

// {"id", "static", "active_generation", "pinned", "withdrawn", "file", "generations": [...],
// "rejected": [...]}; times as RFC 3339 UTC strings.
nlohmann::json BackendStatusJson(const BackendStatus& status);
nlohmann::json RejectedFileJson(const loader::RejectedFile& rejected);

}  // namespace backplane::server
