#include "cli/serve_command.hpp"

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "admin/admin_api.hpp"
#include "backplane/core/fatal_signal_reporter.hpp"
#include "cli/heap_trim.hpp"
#include "http/http_server.hpp"
#include "kserve_grpc/grpc_server.hpp"
#include "kserve_rest/rest_routes.hpp"
#include "serving/serving_log.hpp"

namespace backplane::server {
namespace fs = std::filesystem;

namespace {

constexpr char kAdminTokenVariable[] = "BACKPLANE_ADMIN_TOKEN";

// The addresses `config` listens on: REST's, and gRPC's unless "off". kInvalidArgument naming
// the bad one.
struct ListenAddresses {
  ListenAddress http;
  std::optional<ListenAddress> grpc;
};
Result<ListenAddresses> ParseListenAddresses(const ServeConfig& config) {
  auto http = ParseListenAddress(config.listen);
  if (!http.ok())
    return http.error();
  ListenAddresses addresses{.http = *http};
  if (config.grpc_listen != kGrpcOff) {
    auto grpc = ParseListenAddress(config.grpc_listen);
    if (!grpc.ok())
      return grpc.error().WithContext("gRPC ");
    addresses.grpc = *grpc;
  }
  return addresses;
}

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
  if (auto addresses = ParseListenAddresses(config); !addresses.ok())
    return addresses.error();
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
  if (!config.trusted_backends_file.empty() && !fs::exists(config.trusted_backends_file, error)) {
    std::cerr << "note: the trusted backend list " << config.trusted_backends_file
              << " does not exist here\n";
  } else if (auto trust = MakeTrustPolicy(config); !trust.ok()) {
    std::cerr << "backplane serve: " << trust.error().message() << "\n";
    return 1;
  }
  if (!IsLoopbackHost(ParseListenAddress(config.listen).value().host) &&
      config.admin_token.empty()) {
    std::cerr << "note: listening on " << config.listen
              << " without an admin token: set BACKPLANE_ADMIN_TOKEN where it runs\n";
  }
  return 0;
}

// Addresses other machines can reach: said once at start, with the admin token's absence.
void WarnAboutReachableAddresses(const ServeConfig& config) {
  if (config.grpc_listen != kGrpcOff &&
      !IsLoopbackHost(ParseListenAddress(config.grpc_listen).value().host)) {
    Log().warn("gRPC listening on {}, reachable from other machines", config.grpc_listen);
  }
  const ListenAddress listen = ParseListenAddress(config.listen).value();
  if (!IsLoopbackHost(listen.host)) {
    Log().warn("listening on {}, reachable from other machines{}", listen.ToString(),
               config.admin_token.empty()
                   ? ": the admin API is open to them (set --admin-token or " +
                         std::string(kAdminTokenVariable) + ")"
                   : "");
  }
}

void AnnounceListening(std::string_view scheme, const ListenAddress& address) {
  Log().info("listening on {}://{}", scheme, address.ToString());
  if (!Log().should_log(spdlog::level::info))
    std::cerr << "backplane serve: listening on " << scheme << "://" << address.ToString()
              << std::endl;
}

}  // namespace

Result<RunningServer> StartServer(const ServeConfig& config) {
  // Before anything is loaded: a bad address must not cost a start and a stop.
  auto addresses = ParseListenAddresses(config);
  if (!addresses.ok())
    return addresses.error();
  auto started = ServingCore::Start(config);
  if (!started.ok())
    return started.error();
  RunningServer server{.core = std::move(started).value()};
  ServingCore& core = *server.core;

  auto http =
      std::make_unique<HttpServer>(HttpLimitsFrom(config), config.admin_token, core.metrics().http);
  AddKServeRoutes(*http, core.inference(), config.max_json_depth);
  AddRepositoryRoutes(*http, core.context().repository, config.max_json_depth);
  AddAdminRoutes(*http, core.context());
  auto bound = http->Start(addresses->http);
  if (!bound.ok())
    return bound.error();
  server.http = *bound;
  core.AddTransport(std::move(http));

  if (addresses->grpc) {
    auto grpc = GrpcServer::Start(*addresses->grpc, core.inference(),
                                  {.max_message_bytes = config.max_body_bytes,
                                   .max_buffered_bytes = config.max_buffered_body_bytes,
                                   .max_concurrent_streams = config.grpc_max_concurrent_streams});
    if (!grpc.ok())
      return grpc.error();
    server.grpc = core.AddTransport(std::move(grpc).value()).address();
  }
  core.SetReady();
  return server;
}

int RunServe(const ServeOptions& options) {
  if (options.check_config)
    return CheckConfig(options);
  const sigset_t shutdown_signals = BlockShutdownSignals();

  auto resolved = ResolveConfig(options);
  if (!resolved.ok())
    return StartupFailure(resolved.error().message());
  const ServeConfig config = std::move(resolved).value();
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  WarnAboutReachableAddresses(config);

  // Before the server's threads: a crash in backend code (or anywhere) leaves one last line
  // saying which signal, backend, generation and model (docs/troubleshooting.md).
  if (Status reporter = InstallFatalSignalReporter(); !reporter.ok())
    Log().warn("crashes will not be reported: {}", reporter.message());
  ConfigureAllocator();  // before the server's threads: mallopt is not meant to race malloc
  auto started = StartServer(config);
  if (!started.ok())
    return StartupFailure(started.error().message());
  RunningServer server = std::move(started).value();
  // Tests and scripts wait for these exact lines: keep their wording, and print them even when
  // the log level hides info.
  AnnounceListening("http", server.http);
  if (server.grpc)
    AnnounceListening("grpc", *server.grpc);

  // The main thread waits for the shutdown signal and meanwhile, every kHeapTrimPeriod, gives
  // back the heap a burst left free (heap_trim.hpp): it is idle otherwise, and the trim takes
  // no lock of ours.
  int signal_number = 0;
  const timespec period{.tv_sec = kHeapTrimPeriod.count(), .tv_nsec = 0};
  for (;;) {
    signal_number = sigtimedwait(&shutdown_signals, nullptr, &period);
    if (signal_number > 0)
      break;
    const auto started = std::chrono::steady_clock::now();
    if (const std::size_t free_bytes = TrimFreeHeap(kHeapTrimMinFreeBytes); free_bytes > 0) {
      Log().debug("gave back the free heap ({} MiB free in glibc's arenas) in {} ms",
                  free_bytes >> 20,
                  std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - started)
                      .count());
    }
  }
  UnblockShutdownSignals(shutdown_signals);
  Log().info(
      "{} received: shutting down (no new connections; finishing the {} request(s) in "
      "flight; a second signal ends the process at once)",
      signal_number == SIGINT ? "SIGINT" : "SIGTERM", server.core->metrics().http.in_flight.load());
  server.core->Stop();
  return 0;
}

}  // namespace backplane::server
