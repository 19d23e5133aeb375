// What the admin API of `backplane serve` works with: the serving core's parts, by reference
// (the inference transports get only `inference`). ServingCore owns them and stops every transport
// before any of them goes; each is thread-safe.
#pragma once

#include <atomic>
#include <memory>

#include "backplane/registry/backend_registry.hpp"
#include "backplane/runtime/runtime.hpp"

namespace backplane {
class CrashSupervisor;
}

namespace backplane::server {

class InferenceApi;
class ModelRepository;
class RolloutController;
class ServerMetrics;

struct ServeContext {
  const InferenceApi& inference;  // all the inference transports see (serving/inference.hpp)
  Runtime& runtime;
  BackendRegistry& registry;
  ModelRepository& repository;
  ServerMetrics& metrics;
  RolloutController& rollouts;
  const loader::LoaderStats* loader_stats = nullptr;
  const CrashSupervisor* crash_supervisor = nullptr;  // what isolated backends' workers cost
  // False until the serving core is told it is ready, and again from the moment it stops.
  const std::atomic<bool>& ready;
  int max_json_depth = 32;
};

}  // namespace backplane::server
