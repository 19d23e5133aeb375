// `backplane serve`: the inference server. KServe v2 REST over a Triton-layout model
// repository, the backend admin API, Prometheus metrics, hot reload of backend files.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backplane/core/status.hpp"
#include "config/server_config.hpp"
#include "serving/serving_core.hpp"

namespace backplane::server {

// The command line; every flag overrides the config file's key of the same meaning.
struct ServeOptions {
  std::string config_file;                         // --config
  std::optional<std::string> models;               // --models
  std::vector<std::string> backends;               // --backends (repeatable)
  std::optional<std::string> listen;               // --listen
  std::optional<std::string> grpc_listen;          // --grpc-listen (HOST:PORT or "off")
  std::optional<std::string> log_level;            // --log-level (after `serve`)
  std::optional<std::string> admin_token;          // --admin-token
  std::optional<std::string> inherited_log_level;  // `backplane --log-level L serve`
  bool check_config = false;                       // --check-config: validate, print, exit
};

// Runs until SIGINT or SIGTERM, then shuts down gracefully: stops accepting, answers every
// request in flight, unloads every model and backend (through the reaper), and returns 0.
// Returns 1 when it cannot start (bad config, address in use, no backend at all).
// With check_config: resolves the configuration exactly as a start would (defaults, file,
// environment, flags), prints it as JSON on stdout and returns 0, or names the problem and
// returns 1; it starts nothing. Paths missing on this machine are noted on stderr, not errors:
// a config is often checked where it is written, not where it runs.
int RunServe(const ServeOptions& options);

// A whole server in this process, as RunServe starts it: the serving core with REST (and gRPC
// unless "off") attached, ready. Destroying `core` (or core->Stop()) shuts it down gracefully.
struct RunningServer {
  std::unique_ptr<ServingCore> core;
  ListenAddress http;                 // bound (port 0 resolved)
  std::optional<ListenAddress> grpc;  // bound, unless gRPC is off
};
// The serving core's errors, or the address that could not be bound.
Result<RunningServer> StartServer(const ServeConfig& config);

}  // namespace backplane::server
