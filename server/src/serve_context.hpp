// What the HTTP handlers of `backplane serve` work with. The objects outlive the HTTP server
// (serve_command.cpp stops it first); each is thread-safe.
#pragma once

#include <atomic>
#include <memory>

#include "backplane/registry/backend_registry.hpp"
#include "backplane/runtime/runtime.hpp"

namespace backplane::server {

class ModelRepository;
class ServerMetrics;

struct ServeContext {
  Runtime& runtime;
  BackendRegistry& registry;
  ModelRepository& repository;
  ServerMetrics& metrics;
  const loader::LoaderStats* loader_stats = nullptr;
  // False until the models are loaded and again from the moment shutdown starts.
  const std::atomic<bool>& ready;
  int max_json_depth = 32;
};

}  // namespace backplane::server
