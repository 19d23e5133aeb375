#include "serving/serving_core.hpp"

#include <algorithm>
#include <string>
#include <thread>
#include <utility>

#include "backplane/isolation/worker_runner.hpp"
#include "backplane/registry/crash_supervisor.hpp"
#include "serving/serving_log.hpp"

namespace backplane::server {

namespace {

// "CpuRef (generation 1), Hello (static)": what serves, in the start-up log.
std::string DescribeBackends(const Runtime& runtime) {
  std::string backends;
  for (const auto& id : runtime.BackendIds()) {
    const auto instance = runtime.Backend(id);
    backends += (backends.empty() ? "" : ", ") + id +
                (instance && instance->generation_number() != 0
                     ? " (generation " + std::to_string(instance->generation_number()) + ")"
                     : std::string(" (static)"));
  }
  return backends;
}

// The loader: the process's shared one, or with backend_isolation (or sandboxed rollout
// candidates) one of the server's own that can run generations in worker processes.
Result<std::shared_ptr<loader::Loader>> MakeLoader(
    const ServeConfig& config, const std::shared_ptr<CrashSupervisor>& supervisor) {
  isolation::IsolationPolicy isolation;
  for (const auto& [id, isolated] : config.backend_isolation) {
    if (id == "*")
      isolation.by_default = isolated;
    else
      isolation.by_id.emplace(id, isolated);
  }
  const bool sandbox_candidates =
      config.deploy_policy == "progressive" && config.rollout.sandbox_candidates;
  if (!isolation.IsolatesAny() && !sandbox_candidates)
    return loader::Loader::Shared();
  isolation.worker.call_timeout = config.worker.execute_timeout;
  isolation.worker.memory_limit_bytes = config.worker.memory_limit_bytes;
  isolation.worker.slots = static_cast<uint32_t>(config.worker.slots);
  isolation.worker.slot_bytes = config.worker.slot_bytes;
  auto on_crash =
      [weak = std::weak_ptr<CrashSupervisor>(supervisor)](const isolation::WorkerCrash& crash) {
        if (auto alive = weak.lock())
          alive->OnCrash(crash);
      };
  return loader::Loader::Create(
      {.out_of_process = isolation::MakeWorkerRunner(isolation, std::move(on_crash))});
}

}  // namespace

Result<std::unique_ptr<ServingCore>> ServingCore::Start(const ServeConfig& config) {
  auto core = std::unique_ptr<ServingCore>(new ServingCore());

  core->crash_supervisor_ = std::make_shared<CrashSupervisor>(CrashPolicy{
      .max_crashes = config.worker.max_crashes, .crash_window = config.worker.crash_window});
  auto made_loader = MakeLoader(config, core->crash_supervisor_);
  if (!made_loader.ok())
    return made_loader.error().WithContext("backend loader: ");
  core->loader_ = std::move(made_loader).value();

  // Before anything is loaded: with a trusted list, no untrusted backend may load even at start.
  auto trust = MakeTrustPolicy(config);
  if (!trust.ok())
    return trust.error();
  std::shared_ptr<const loader::TrustPolicy> trust_policy = std::move(trust).value();
  if (trust_policy != nullptr)
    Log().info("only trusted backend content loads: {}", trust_policy->Describe());
  auto registry = BackendRegistry::Create(
      {.backend_paths = config.backends,
       .loader = core->loader_,
       .trust = trust_policy,
       .deploy_policy = config.deploy_policy == "progressive" ? DeployPolicy::kProgressive
                                                              : DeployPolicy::kImmediate,
       .state_dir = config.state_dir,
       .crash_grace = config.crash_grace,
       .sandbox_candidates = config.rollout.sandbox_candidates,
       .baseline_generations = config.deploy_policy == "progressive" && config.rollout.baseline});
  // A state_dir that cannot be used stops the start: its message begins "state_dir <path>: ".
  if (!registry.ok())
    return registry.error().WithContext("backend registry: ");
  // Moved out: a copy left in the Result would keep the registry (and its leases) alive past
  // Stop.
  core->registry_ = std::move(registry).value();
  core->crash_supervisor_->Attach(core->registry_);
  // Before the reloader starts, so that no event falls between the two.
  core->metrics_.AttachRegistry(*core->registry_);
  core->metrics_observer_ =
      core->registry_->AddObserver([metrics = &core->metrics_](const GenerationEvent& event) {
        metrics->OnGenerationEvent(event);
      });

  // Before the runtime, which tells it of requests whose worker died.
  if (!config.crash_dir.empty()) {
    auto capture =
        CrashCapture::Create(config.crash_dir, *core->registry_, config.backend_preferences);
    if (!capture.ok())
      return capture.error();
    core->crash_capture_ = std::move(capture).value();
    Log().info("requests whose backend worker dies are kept in {}", config.crash_dir.string());
  }
  std::function<void(const CrashedRequest&)> on_crashed_request;
  if (core->crash_capture_) {
    on_crashed_request = [capture = core->crash_capture_.get()](const CrashedRequest& request) {
      capture->OnCrashedRequest(request);
    };
  }

  auto runtime = Runtime::Create(
      {.registry = core->registry_,
       .default_preferences = config.backend_preferences,
       .scheduler = {.max_threads = config.inference_threads,
                     .max_in_flight = static_cast<std::size_t>(config.max_in_flight)},
       .swap_policy = config.swap_policy == "pin" ? SwapPolicy::kPin : SwapPolicy::kMigrate,
       .on_crashed_request = std::move(on_crashed_request)});
  if (!runtime.ok())
    return runtime.error();
  core->runtime_ = std::move(runtime).value();
  Log().info("backends: {}", DescribeBackends(*core->runtime_));
  // Before the reloader: a deploy it applies may start a rollout at once.
  core->rollouts_ =
      std::make_unique<RolloutController>(*core->runtime_, *core->registry_, config.rollout);
  if (config.deploy_policy == "progressive")
    Log().info("deploys of new backend versions are rolled out progressively");

  // Hot reload: files published into the backend directories become new generations.
  if (config.watch_backends) {
    auto started = BackendReloader::Start(
        core->registry_,
        {.debounce = config.watch_debounce, .rescan_interval = config.rescan_interval});
    if (started.ok()) {
      core->reloader_ = std::move(started).value();
      std::string watched;
      for (const auto& directory : core->registry_->directories())
        watched += (watched.empty() ? "" : ", ") + directory.string();
      Log().info("watching backend directories for new versions: {}", watched);
    } else {
      Log().warn("hot reload of backend files is off: {}", started.error().message());
    }
  }

  // A batcher runs as many batches at once as the runtime has threads (more would only queue in
  // its scheduler), and holds no more waiting requests than the server admits at once.
  const BatcherLimits batcher_limits{
      .max_concurrent_batches =
          config.inference_threads > 0
              ? config.inference_threads
              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
      .max_waiting_requests = static_cast<std::size_t>(std::max(1, config.max_in_flight))};
  core->repository_ = std::make_unique<ModelRepository>(config.models, *core->runtime_,
                                                        core->metrics_, batcher_limits);
  if (core->crash_capture_)
    core->crash_capture_->AttachModels(*core->repository_);
  core->repository_->LoadAll();

  core->inference_.emplace(*core->repository_, core->metrics_, core->ready_);
  core->context_.emplace(ServeContext{.inference = *core->inference_,
                                      .runtime = *core->runtime_,
                                      .registry = *core->registry_,
                                      .repository = *core->repository_,
                                      .metrics = core->metrics_,
                                      .rollouts = *core->rollouts_,
                                      .loader_stats = &core->loader_->stats(),
                                      .crash_supervisor = core->crash_supervisor_.get(),
                                      .ready = core->ready_,
                                      .max_json_depth = config.max_json_depth});
  return core;
}

ServingCore::~ServingCore() {
  Stop();
}

void ServingCore::Stop() {
  if (stopped_)
    return;
  stopped_ = true;
  // 1. Stop taking requests; every request a transport took is answered first.
  ready_.store(false);
  while (!transports_.empty())
    transports_.pop_back();
  context_.reset();
  inference_.reset();
  // 2. No more backend files applied while tearing down, no worker restarted.
  crash_supervisor_.reset();
  reloader_.reset();
  rollouts_.reset();
  // 3. What crash_dir still has to write (it reads the models), every model's networks, then
  // every backend instance, then the registry's leases.
  if (crash_capture_)
    crash_capture_->Stop();
  repository_.reset();
  runtime_.reset();
  crash_capture_.reset();
  if (registry_ && metrics_observer_)
    registry_->RemoveObserver(*metrics_observer_);
  registry_.reset();
  if (!loader_)
    return;  // Start failed before anything was loaded
  // 4. The reaper unloads the last generations; wait until they really left the process.
  loader_->WaitForUnloads();
  const auto& stats = loader_->stats();
  if (stats.leaked.load() != 0 || stats.live.load() != 0) {
    Log().warn(
        "stopped; {} backend generation(s) unloaded, {} leaked (still mapped after "
        "dlclose), {} still held",
        stats.unloaded.load(), stats.leaked.load(), stats.live.load());
  } else {
    Log().info("stopped; every backend generation unloaded ({} in all)", stats.unloaded.load());
  }
}

}  // namespace backplane::server
