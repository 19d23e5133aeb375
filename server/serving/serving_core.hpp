// The serving core of `backplane serve`, whatever the transport: the backend loader, registry
// and hot reload, the runtime, the model repository and the metrics, started and stopped in the
// one order that is safe. Transports (REST, gRPC) are started on its context and handed to it;
// it stops them before anything they serve from goes. Runs in-process: tests and embedders can
// start a whole server without the executable.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/loader/loader.hpp"
#include "backplane/registry/backend_registry.hpp"
#include "backplane/registry/backend_reloader.hpp"
#include "backplane/registry/crash_supervisor.hpp"
#include "backplane/runtime/runtime.hpp"
#include "config/server_config.hpp"
#include "metrics/metrics.hpp"
#include "rollout/rollout_controller.hpp"
#include "serving/crash_capture.hpp"
#include "serving/inference.hpp"
#include "serving/model_repository.hpp"
#include "serving/serving_context.hpp"

namespace backplane::server {

// Start and Stop are called from one thread; context() and its parts are thread-safe.
class ServingCore {
 public:
  // Starts, in order: the loader, the backend registry (observed by the metrics from before its
  // first event), the runtime, the rollout controller, hot reload of the backend directories (when
  // watch_backends; a watcher that cannot start is a warning, not a failure), and the model
  // repository with every model loaded (a model that fails is recorded, not fatal). Not ready yet.
  // The error names the part that could not start.
  static Result<std::unique_ptr<ServingCore>> Start(const ServeConfig& config);
  ~ServingCore();  // Stop()
  ServingCore(const ServingCore&) = delete;
  ServingCore& operator=(const ServingCore&) = delete;

  const ServeContext& context() const { return *context_; }
  // What the inference transports are started on.
  const InferenceApi& inference() const { return *inference_; }
  ServerMetrics& metrics() { return metrics_; }

  // Keeps a started transport (HttpServer, GrpcServer) until Stop, which destroys transports
  // before anything else, newest first; destroying one stops it after it has answered every
  // request it took.
  template <typename Transport>
  Transport& AddTransport(std::unique_ptr<Transport> transport) {
    Transport& added = *transport;
    transports_.push_back(std::shared_ptr<Transport>(std::move(transport)));
    return added;
  }

  // Health checks answer ready from here on.
  void SetReady() { ready_.store(true); }

  // Not ready; the transports stop (each answers what it took); hot reload stops; every model,
  // then every backend instance, then the registry's leases are released; then waits until the
  // reaper has unloaded every generation, and logs what left and what leaked. Idempotent.
  void Stop();

 private:
  ServingCore() = default;

  // Declaration order is the start order; Stop releases them in reverse, explicitly.
  ServerMetrics metrics_;  // observed by everything: outlives all of it
  std::atomic<bool> ready_{false};
  // Decides what a worker's death costs (backend_isolation); its workers' listeners hold it weakly.
  std::shared_ptr<CrashSupervisor> crash_supervisor_;
  std::shared_ptr<loader::Loader> loader_;  // held to wait for the last unloads
  std::shared_ptr<BackendRegistry> registry_;
  std::optional<uint64_t> metrics_observer_;
  std::unique_ptr<CrashCapture> crash_capture_;  // crash_dir; told by the runtime: outlives it
  std::unique_ptr<Runtime> runtime_;
  std::unique_ptr<RolloutController> rollouts_;
  std::unique_ptr<BackendReloader> reloader_;
  std::unique_ptr<ModelRepository> repository_;
  std::optional<InferenceApi> inference_;
  std::optional<ServeContext> context_;
  std::vector<std::shared_ptr<void>> transports_;  // type-erased; each one's destructor stops it
  bool stopped_ = false;
};

}  // namespace backplane::server
