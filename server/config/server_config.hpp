// The configuration of `backplane serve`: every setting with its default, read from a JSON config
// file and overridden by command-line flags. docs/operators.md documents each key.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/loader/trust.hpp"
#include "config/rollout_policy.hpp"

namespace backplane::server {

// A value type (thread-compatible). Field names are the config file's keys.
struct ServeConfig {
  // ---- What to serve
  // The model repository (Triton layout). Default: the example repository of the source tree.
  std::filesystem::path models;
  // Backend directories; nullopt: DefaultBackendPaths() ($BACKPLANE_BACKEND_PATHS, else the
  // build's backends/ and the installed ones). An empty list disables dynamic backends.
  std::optional<std::vector<std::filesystem::path>> backends;
  // Backend preference list for models whose config.json names none; empty: every backend by id.
  std::vector<std::string> backend_preferences;

  // ---- Where and how to listen
  std::string listen = "127.0.0.1:8000";  // HOST:PORT; port 0 picks a free one
  // KServe v2 gRPC, HOST:PORT like `listen`, or "off"; 8001 like Triton and KServe runtimes.
  std::string grpc_listen = "127.0.0.1:8001";
  std::string log_level = "info";
  // Bearer token that mutating admin and repository calls must present; empty: not required.
  std::string admin_token;
  int io_threads = 2;  // event-loop threads: accept, read, write (never a handler)
  // Handler threads: synchronous requests (metadata, admin, repository) handled at once, and the
  // bound on inference requests handed on at once; an inference runs on the runtime's scheduler,
  // not on these. Connections do not hold one; an idle keep-alive connection costs a descriptor
  // and a buffer.
  int http_threads = 32;
  int max_connections = 10000;  // beyond it a new connection gets 503 and is closed
  int listen_backlog = 1024;    // the kernel caps it at net.core.somaxconn
  std::size_t max_body_bytes = 16u << 20;
  // Request-body bytes held at once, all HTTP connections together (a body is reserved before it
  // is read; one that does not fit gets 503), and gRPC's memory quota. 256 MiB: 16 bodies of the
  // default max_body_bytes at once, where 64 slow clients could otherwise hold 1 GiB. At least
  // max_body_bytes, or the largest allowed body could never be read.
  std::size_t max_buffered_body_bytes = 256u << 20;
  // HTTP/2 streams one gRPC connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS):
  // a call opened and left waiting holds its state in the transport until it ends or the
  // connection closes. Clients queue calls beyond it; one that opens more anyway is refused.
  int grpc_max_concurrent_streams = 100;
  int max_json_depth = 32;
  std::size_t max_header_bytes = 16u << 10;        // request line and headers together
  std::chrono::milliseconds header_timeout{5000};  // the whole header, from its first byte
  std::chrono::milliseconds read_timeout{5000};    // the whole body, after the header
  std::chrono::milliseconds write_timeout{5000};   // the whole response
  // From a request's first byte until a handler takes it (header, body, wait for a handler).
  std::chrono::milliseconds request_timeout{60000};
  std::chrono::seconds keep_alive_timeout{5};  // idle between two requests
  int keep_alive_max_requests = 1000;

  // ---- Execution
  int inference_threads = 0;  // the runtime's TBB arena; 0: one per core
  int max_in_flight = 256;    // requests admitted by the runtime at once, all models together
  std::string swap_policy = "migrate";  // "migrate" or "pin"

  // ---- Backends in worker processes (docs/operators.md, "Backends that crash")
  // Backend id -> whether its generations run in a worker process ("process": true) or in the
  // server ("none"); "*" stands for every id not named. Empty: every backend in the server.
  std::map<std::string, bool, std::less<>> backend_isolation;
  struct WorkerLimits {
    // A call into an isolated backend running longer kills its worker; 0: no limit.
    std::chrono::milliseconds execute_timeout{60000};
    std::size_t memory_limit_bytes = 0;  // a worker's resident memory past it kills it; 0: none
    int slots = 4;                       // calls one worker runs at once
    std::size_t slot_bytes = 64u << 20;  // the largest request or reply of one call
    // An active generation's worker that died is restarted, until it died max_crashes times
    // within crash_window: then the previous build is rolled back to.
    int max_crashes = 3;
    std::chrono::seconds crash_window{60};
  } worker;
  // Where each request whose worker died is kept, with a line that replays it (serving/
  // crash_capture.hpp); empty: nothing is written.
  std::filesystem::path crash_dir;

  // ---- Hot reload
  bool watch_backends = true;  // apply backend files dropped into the backend directories
  std::chrono::milliseconds watch_debounce{200};
  std::chrono::milliseconds rescan_interval{30000};
  // What a new file of a registered backend does: "immediate" (it takes every request once every
  // network is prepared on it) or "progressive" (a rollout: shadow, canary steps, then promoted
  // or rolled back by the numbers of `rollout`; docs/hot-reload.md, "Progressive rollout").
  std::string deploy_policy = "immediate";
  RolloutPolicy rollout;  // the default policy of every progressive rollout
  // Where the server keeps what must outlive it (docs/operators.md, "Crash loops and state_dir");
  // empty: nothing. With it, a deploy the process does not survive by crash_grace is not loaded
  // again at the next start (SUSPECTED_CRASH), and the copy a rollback loads lives there.
  std::filesystem::path state_dir;
  std::chrono::seconds crash_grace{60};  // config key crash_grace_s

  // ---- Trust (docs/operators.md, "Securing the backend directory")
  // SHA-256 digests (lowercase hex) of the only backend content that may load; nullopt: any.
  // An empty list trusts nothing. At most one of this and trusted_backends_file is set.
  std::optional<std::vector<std::string>> trusted_backends;
  // A file of such digests in sha256sum's format, re-read when it changes; empty: none.
  std::filesystem::path trusted_backends_file;
  // Ed25519 public keys (PEM files): content with a valid detached signature (<file>.sig) by one
  // of them is trusted too. nullopt: signatures are not looked at.
  std::optional<std::vector<std::filesystem::path>> trusted_signing_keys;
};

// The grpc_listen value that turns gRPC off.
inline constexpr char kGrpcOff[] = "off";

// The built-in defaults, with `models` set to the compile-time example repository.
ServeConfig DefaultServeConfig();

// Applies the keys of JSON config file `file` over `config`. An unknown key, a wrong type or an
// out-of-range value is kInvalidArgument naming the file and the key; a missing or unreadable
// file is kNotFound / kInvalidArgument. Relative paths in the file are relative to its folder.
Status ApplyConfigFile(const std::filesystem::path& file, ServeConfig& config);
// The same for the file's text, already read: `file` names it in messages and is the base of its
// relative paths. The seam tests/fuzz/server_config_fuzz.cpp drives without a file.
Status ApplyConfigText(std::string_view text, const std::filesystem::path& file,
                       ServeConfig& config);

// The trust policy `config` asks for: null when none of trusted_backends, trusted_backends_file
// and trusted_signing_keys is set; else the allowlist (its file read now), the signing keys
// (read now), or content trusted by either. kInvalidArgument naming the key and the entry, line
// or key file when it cannot be built.
Result<std::shared_ptr<const loader::TrustPolicy>> MakeTrustPolicy(const ServeConfig& config);

// Every config key with its default, as "key: default" lines (for --help and tests).
std::vector<std::string> DescribeConfigKeys();

// `config` as a JSON object of the config file's keys (what `serve --check-config` prints).
// A key left at a default that has no value of its own (`backends`: the default backend paths,
// `backend_isolation`, the trust keys, the directories) is null; a set admin token is shown as
// "(set)", never in clear. Every other value is as the config file writes it: the object without
// its null keys and `admin_token`, applied over the defaults, gives the same config again but the
// admin token (tests/fuzz/server_config_fuzz.cpp checks it).
std::string ConfigToJson(const ServeConfig& config);

struct ListenAddress {
  std::string host;  // without IPv6 brackets
  int port = 0;
  std::string ToString() const;  // "HOST:PORT", brackets around IPv6 hosts
};
// "127.0.0.1:8000", "localhost:0", "[::1]:8000". kInvalidArgument naming the problem.
Result<ListenAddress> ParseListenAddress(std::string_view text);

// True for 127.0.0.0/8, ::1 and "localhost": the addresses only this machine can reach.
bool IsLoopbackHost(std::string_view host);

}  // namespace backplane::server
