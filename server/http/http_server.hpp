// The HTTP front: an event-driven HTTP/1.1 server on Boost.Beast/Asio with the server's limits
// (connections, header and body bytes, JSON depth, timeouts), JSON errors for every failure,
// bearer-token checks for admin routes, and graceful stop. Handlers see plain request/response
// values and never touch Beast. A synchronous handler runs on a pool of its own, never on the I/O
// threads; an asynchronous one (inference) is called on the I/O thread only to hand its work on.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "backplane/core/status.hpp"
#include "config/server_config.hpp"

namespace backplane::server {

struct HttpMetrics;

struct HttpRequest {
  std::string method;
  std::string path;
  std::vector<std::string> params;  // the route pattern's captures ("{}"), in order
  std::string query;                // the target after '?', not decoded; "" when none
  std::string body;                 // read in full, at most HttpLimits::max_body_bytes
  // "" when absent; a field sent on several lines, its values joined by ", " (RFC 9110 5.3).
  std::function<std::string(std::string_view name)> header;
  // request_timeout_ms from the request's first byte: work still queued then is not started.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

struct HttpResponse {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;

  static HttpResponse Json(const nlohmann::json& body, int status = 200);
  // {"error": message} with `status`.
  static HttpResponse Error(int status, std::string_view message);
  // The HTTP status for a failed Status (see HttpStatusFor) with its message.
  static HttpResponse FromStatus(const Status& status);
};

// kInvalidArgument → 400, kUnimplemented → 501, kNotFound → 404, kAlreadyExists and
// kFailedPrecondition → 409, kResourceExhausted and kUnavailable → 503, kDeadlineExceeded → 504,
// anything else → 500.
int HttpStatusFor(StatusCode code);

// Parses a request body as JSON, refusing nesting deeper than `max_depth` before parsing (a body
// of a million '[' would otherwise cost a million parser frames). kInvalidArgument naming the
// problem and where.
Result<nlohmann::json> ParseJsonBody(std::string_view body, int max_depth);

struct HttpLimits {
  int io_threads = 2;  // threads running the event loop (accept, read, write; never handlers)
  int threads = 32;    // requests handled at once, of each kind; the synchronous pool's threads
  std::size_t max_body_bytes = 16u << 20;
  // Bodies held at once, all connections together (body_budget.hpp); one that does not fit: 503.
  std::size_t max_buffered_body_bytes = 256u << 20;
  std::size_t max_header_bytes = 16u << 10;
  int max_json_depth = 32;
  std::chrono::milliseconds header_timeout{5000};    // the whole header, from its first byte
  std::chrono::milliseconds read_timeout{5000};      // the whole body, from the header's end
  std::chrono::milliseconds write_timeout{5000};     // the whole response
  std::chrono::milliseconds request_timeout{60000};  // first byte to the start of handling
  std::chrono::seconds keep_alive_timeout{5};        // idle between requests
  int keep_alive_max_requests = 1000;
  int max_connections = 10000;
  int listen_backlog = 1024;
};
HttpLimits HttpLimitsFrom(const ServeConfig& config);

// Routes are registered before Start and never after. Start, Stop and the destructor are called
// from one thread; handlers run concurrently (on the handler threads, or the I/O threads for
// asynchronous ones) and must be thread-safe. At most HttpLimits::threads requests of each kind
// are handled at once; the rest wait in arrival order. Each connection answers its requests in
// order, one at a time (pipelined requests wait in the connection's read buffer).
class HttpServer {
 public:
  // Admin routes require `Authorization: Bearer <token>` when a token is set.
  enum class Access { kPublic, kAdmin };
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  // Takes the response once, from any thread. A responder dropped unanswered answers 500 (a bug
  // in the handler, logged) and frees its slot: answer every request.
  using Responder = std::function<void(HttpResponse)>;
  // Called on an I/O thread (or, for a request that waited, the thread that freed its slot), so
  // it must not block: it hands the work on (inference goes to the runtime's scheduler) and
  // answers through the responder from wherever the work ends. Saves
  // the two thread hand-offs of the pool, the larger part of a small request's cost.
  using AsyncHandler = std::function<void(HttpRequest, Responder)>;

  // `metrics` are the transport's own counters (ServerMetrics::http); they outlive the server.
  HttpServer(HttpLimits limits, std::string admin_token, HttpMetrics& metrics);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // `pattern` is a path over the decoded path's segments: "{}" captures one non-empty segment,
  // one "[...]" part may be absent ("/v2/models/{}[/versions/{}]/infer"); the captures become
  // HttpRequest::params, "" for those of an absent part. The first route that matches answers.
  void Get(const std::string& pattern, Handler handler);
  void Post(const std::string& pattern, Access access, Handler handler);
  void Put(const std::string& pattern, Access access, Handler handler);
  void PostAsync(const std::string& pattern, Access access, AsyncHandler handler);

  // Binds and listens (port 0 picks a free one), then serves on the I/O threads. Returns the
  // address actually bound. kUnavailable when the address cannot be bound.
  Result<ListenAddress> Start(const ListenAddress& address);
  // Stops accepting and closes idle connections; every request whose header has arrived is
  // read, handled and answered (with `Connection: close`); then joins the threads.
  void Stop();

  // The server's state shared with its connections (http_server_core.hpp).
  class Core;

 private:
  std::unique_ptr<Core> core_;
};

}  // namespace backplane::server
