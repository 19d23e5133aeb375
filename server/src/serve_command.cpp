#include "serve_command.hpp"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <iostream>

#include "admin_api.hpp"
#include "backplane/registry/backend_registry.hpp"
#include "backplane/registry/backend_reloader.hpp"
#include "backplane/runtime/runtime.hpp"
#include "grpc_server.hpp"
#include "http_server.hpp"
#include "kserve_api.hpp"
#include "metrics.hpp"
#include "model_repository.hpp"
#include "serve_context.hpp"
#include "server_config.hpp"
#include "server_log.hpp"

namespace backplane::server {
namespace fs = std::filesystem;

namespace {

constexpr char kAdminTokenVariable[] = "BACKPLANE_ADMIN_TOKEN";

int StartupFailure(const std::string& message) {
  Log().error("backplane serve: {}", message);
  std::cerr << "backplane serve: " << message << "\n";
  return 1;
}

// Defaults, then the config file, then the environment, then the flags.
Result<ServeConfig> ResolveConfig(const ServeOptions& options) {
  ServeConfig config = DefaultServeConfig();
  if (options.inherited_log_level)
    config.log_level = *options.inherited_log_level;
  if (!options.config_file.empty())
    BACKPLANE_RETURN_IF_ERROR(ApplyConfigFile(options.config_file, config));
  if (const char* token = std::getenv(kAdminTokenVariable); token != nullptr && *token != '\0')
    config.admin_token = token;
  if (options.models)
    config.models = *options.models;
  if (!options.backends.empty())
    config.backends = std::vector<fs::path>(options.backends.begin(), options.backends.end());
  if (options.listen)
    config.listen = *options.listen;
  if (options.grpc_listen)
    config.grpc_listen = *options.grpc_listen;
  if (options.log_level)
    config.log_level = *options.log_level;
  if (options.admin_token)
    config.admin_token = *options.admin_token;
  auto listen = ParseListenAddress(config.listen);
  if (!listen.ok())
    return listen.error();
  if (config.grpc_listen != kGrpcOff) {
    auto grpc_listen = ParseListenAddress(config.grpc_listen);
    if (!grpc_listen.ok())
      return InvalidArgument("gRPC " + grpc_listen.error().message());
  }
  return config;
}

// SIGINT and SIGTERM are taken by sigwait on the main thread: blocked here, before any thread
// exists, so that every thread inherits the mask and none is interrupted by them.
sigset_t BlockShutdownSignals() {
  // A shell without job control starts background commands (`backplane serve &` in a script)
  // with SIGINT ignored, and an ignored signal is discarded, never seen by sigwait: restore the
  // default action first.
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // Asio sends with MSG_NOSIGNAL, but a backend or library writing to a socket or pipe a peer
  // closed would raise SIGPIPE and kill the process. Ignored, the write fails with EPIPE.
  signal(SIGPIPE, SIG_IGN);
  return signals;
}

// Lets a second Ctrl-C end the process at once: the first one started a graceful shutdown.
void UnblockShutdownSignals(const sigset_t& signals) {
  pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
}

int CheckConfig(const ServeOptions& options) {
  auto resolved = ResolveConfig(options);
  if (!resolved.ok()) {
    std::cerr << "backplane serve: " << resolved.error().message() << "\n";
    return 1;
  }
  const ServeConfig& config = resolved.value();
  std::cout << ConfigToJson(config) << std::endl;
  std::error_code error;
  if (!fs::is_directory(config.models, error))
    std::cerr << "note: the model repository " << config.models << " is not a directory here\n";
  for (const auto& directory : config.backends.value_or(std::vector<fs::path>{})) {
    if (!fs::is_directory(directory, error))
      std::cerr << "note: the backend directory " << directory << " is not a directory here\n";
  }
  if (!IsLoopbackHost(ParseListenAddress(config.listen).value().host) &&
      config.admin_token.empty()) {
    std::cerr << "note: listening on " << config.listen
              << " without an admin token: set BACKPLANE_ADMIN_TOKEN where it runs\n";
  }
  return 0;
}

}  // namespace

int RunServe(const ServeOptions& options) {
  if (options.check_config)
    return CheckConfig(options);
  const sigset_t shutdown_signals = BlockShutdownSignals();

  auto resolved = ResolveConfig(options);
  if (!resolved.ok())
    return StartupFailure(resolved.error().message());
  const ServeConfig config = std::move(resolved).value();
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  const ListenAddress listen = ParseListenAddress(config.listen).value();
  if (config.grpc_listen != kGrpcOff &&
      !IsLoopbackHost(ParseListenAddress(config.grpc_listen).value().host)) {
    Log().warn("gRPC listening on {}, reachable from other machines", config.grpc_listen);
  }
  if (!IsLoopbackHost(listen.host)) {
    Log().warn("listening on {}, reachable from other machines{}", listen.ToString(),
               config.admin_token.empty()
                   ? ": the admin API is open to them (set --admin-token or " +
                         std::string(kAdminTokenVariable) + ")"
                   : "");
  }

  // Declaration order is destruction order reversed, which the shutdown below also follows
  // explicitly: metrics (observed by everything) outlive the registry, the registry outlives the
  // runtime, the runtime outlives the repository's networks, and all of them outlive HTTP.
  ServerMetrics metrics;
  // Held for the whole run so that, after everything is released, we can wait for the reaper to
  // really unload every generation before exiting.
  auto shared_loader = loader::Loader::Shared();
  if (!shared_loader.ok())
    return StartupFailure("backend loader: " + shared_loader.error().message());
  const std::shared_ptr<loader::Loader> backend_loader = std::move(shared_loader).value();

  auto created_registry =
      BackendRegistry::Create({.backend_paths = config.backends, .loader = backend_loader});
  if (!created_registry.ok())
    return StartupFailure("backend registry: " + created_registry.error().message());
  // Moved out: a copy left in the Result would keep the registry (and its leases) alive past
  // registry.reset() below.
  std::shared_ptr<BackendRegistry> registry = std::move(created_registry).value();
  // Before the reloader starts, so that no event falls between the two.
  metrics.AttachRegistry(*registry);
  const uint64_t observer = registry->AddObserver(
      [&metrics](const GenerationEvent& event) { metrics.OnGenerationEvent(event); });

  auto created_runtime = Runtime::Create(
      {.registry = registry,
       .default_preferences = config.backend_preferences,
       .scheduler = {.max_threads = config.inference_threads,
                     .max_in_flight = static_cast<std::size_t>(config.max_in_flight)},
       .swap_policy = config.swap_policy == "pin" ? SwapPolicy::kPin : SwapPolicy::kMigrate});
  if (!created_runtime.ok())
    return StartupFailure(created_runtime.error().message());
  std::unique_ptr<Runtime> runtime = std::move(created_runtime).value();
  {
    std::string backends;
    for (const auto& id : runtime->BackendIds()) {
      const auto instance = runtime->Backend(id);
      backends += (backends.empty() ? "" : ", ") + id +
                  (instance && instance->generation_number() != 0
                       ? " (generation " + std::to_string(instance->generation_number()) + ")"
                       : std::string(" (static)"));
    }
    Log().info("backends: {}", backends);
  }

  // Hot reload: files published into the backend directories become new generations.
  std::unique_ptr<BackendReloader> reloader;
  if (config.watch_backends) {
    auto started = BackendReloader::Start(
        registry, {.debounce = config.watch_debounce, .rescan_interval = config.rescan_interval});
    if (started.ok()) {
      reloader = std::move(started).value();
      std::string watched;
      for (const auto& directory : registry->directories())
        watched += (watched.empty() ? "" : ", ") + directory.string();
      Log().info("watching backend directories for new versions: {}", watched);
    } else {
      Log().warn("hot reload of backend files is off: {}", started.error().message());
    }
  }

  auto repository = std::make_unique<ModelRepository>(config.models, *runtime, metrics);
  repository->LoadAll();

  std::atomic<bool> ready{false};
  const ServeContext context{.runtime = *runtime,
                             .registry = *registry,
                             .repository = *repository,
                             .metrics = metrics,
                             .loader_stats = &backend_loader->stats(),
                             .ready = ready,
                             .max_json_depth = config.max_json_depth};
  auto http = std::make_unique<HttpServer>(HttpLimitsFrom(config), config.admin_token, metrics);
  AddKServeRoutes(*http, context);
  AddAdminRoutes(*http, context);
  auto bound = http->Start(listen);
  if (!bound.ok())
    return StartupFailure(bound.error().message());
  std::unique_ptr<GrpcServer> grpc;
  if (config.grpc_listen != kGrpcOff) {
    auto started = GrpcServer::Start(ParseListenAddress(config.grpc_listen).value(), context,
                                     {.max_message_bytes = config.max_body_bytes});
    if (!started.ok())
      return StartupFailure(started.error().message());
    grpc = std::move(started).value();
  }
  ready.store(true);
  // Tests and scripts wait for this exact line: keep its wording, and print it even when the
  // log level hides info.
  Log().info("listening on http://{}", bound->ToString());
  if (!Log().should_log(spdlog::level::info))
    std::cerr << "backplane serve: listening on http://" << bound->ToString() << std::endl;
  if (grpc) {
    Log().info("listening on grpc://{}", grpc->address().ToString());
    if (!Log().should_log(spdlog::level::info))
      std::cerr << "backplane serve: listening on grpc://" << grpc->address().ToString()
                << std::endl;
  }

  int signal_number = 0;
  sigwait(&shutdown_signals, &signal_number);
  UnblockShutdownSignals(shutdown_signals);
  Log().info(
      "{} received: shutting down (no new connections; finishing the {} request(s) in "
      "flight; a second signal ends the process at once)",
      signal_number == SIGINT ? "SIGINT" : "SIGTERM", metrics.http_in_flight.load());

  // 1. Stop taking requests; every request being handled is answered first.
  ready.store(false);
  grpc.reset();
  http.reset();
  // 2. No more backend files applied while tearing down.
  reloader.reset();
  // 3. Every model's networks, then every backend instance, then the registry's leases.
  repository.reset();
  runtime.reset();
  registry->RemoveObserver(observer);
  registry.reset();
  // 4. The reaper unloads the last generations; wait until they really left the process.
  backend_loader->WaitForUnloads();
  const auto& stats = backend_loader->stats();
  if (stats.leaked.load() != 0 || stats.live.load() != 0) {
    Log().warn(
        "stopped; {} backend generation(s) unloaded, {} leaked (still mapped after "
        "dlclose), {} still held",
        stats.unloaded.load(), stats.leaked.load(), stats.live.load());
  } else {
    Log().info("stopped; every backend generation unloaded ({} in all)", stats.unloaded.load());
  }
  return 0;
}

}  // namespace backplane::server
