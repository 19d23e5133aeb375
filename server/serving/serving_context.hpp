// What the transports of `backplane serve` (REST, gRPC, admin) work with: the serving core's
// parts, by reference. ServingCore owns them and stops every transport before any of them goes;
// each is thread-safe.
#pragma once

#include <atomic>
#include <memory>

#include "backplane/registry/backend_registry.hpp"
#include "backplane/runtime/runtime.hpp"

namespace backplane {
class CrashSupervisor;
}

namespace backplane::server {

class ModelRepository;
class RolloutController;
class ServerMetrics;

struct ServeContext {
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
