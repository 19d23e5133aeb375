// HttpServer's insides, shared by its two halves: http_server.cpp (the Core: loop, acceptor,
// admission, routing, stop) and connection.cpp (the Connection on each socket's strand). Private
// to the http room: nothing outside server/http includes this.
//
// The two are one state machine across two files: a connection's every step goes through the
// core's admission and routing, and Stop waits on the connections. What each half may touch of
// the other is this header: the Core's members below, and of a Connection only ServeConnection
// and StopConnection.
#pragma once

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core/error.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "backplane/core/logging.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "http/body_budget.hpp"
#include "http/http_server.hpp"
#include "http/path_pattern.hpp"
#include "metrics/http_metrics.hpp"

namespace backplane::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = boost::asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// The transport's logger ("backplane.http"): connections, refusals, handler bugs.
spdlog::logger& HttpLog();

// A route as registered (HttpServer::Get, Post, Put, PostAsync), before Start only.
struct Route {
  std::string method;
  std::string path;  // the pattern as registered, for messages
  PathPattern pattern;
  HttpServer::Access access;
  HttpServer::Handler handler;             // on a handler thread, or
  HttpServer::AsyncHandler async_handler;  // on the I/O thread, answering later
};

// What a connection answers: a handler's response, or an error of the transport itself.
struct Answer {
  HttpResponse response;
  bool close = false;   // send `Connection: close`, then close
  bool linger = false;  // the request's body may be unread: drain before closing (see Linger)
  bool say_keep_alive = false;  // an HTTP/1.0 client asked for keep-alive and gets it
};

class Connection;

// Serves an accepted socket: a Connection registered with `core` under `id`, reading its first
// request. Any thread.
void ServeConnection(HttpServer::Core& core, tcp::socket socket, std::uint64_t id);
// Tells a live connection that the server stops (posted to its strand): idle, it closes now; in
// a request, it answers that one with `Connection: close`. Any thread.
void StopConnection(std::shared_ptr<Connection> connection);

// Thread-safe. Owns the event loop, its I/O threads, the handler pool, the acceptor and the
// registry of live connections. Connections refer to it by reference: Stop waits until every
// connection is gone before the loop and the pool are torn down.
class HttpServer::Core {
 public:
  Core(HttpLimits limits, std::string admin_token, HttpMetrics& metrics)
      : limits(limits),
        admin_token(std::move(admin_token)),
        metrics(metrics),
        body_budget(limits.max_buffered_body_bytes, &metrics.buffered_body_bytes),
        loop(limits.io_threads),
        handler_pool(static_cast<std::size_t>(limits.threads)) {}

  // Routing and the admin check, cheap enough for the I/O thread: the route, with the request's
  // params filled in, or the refusal to answer at once (404, 401, 403).
  std::variant<const Route*, HttpResponse> Find(HttpRequest& request, const std::string& client);
  // A synchronous route's handler, with an exception answered as 500; on a handler thread.
  HttpResponse Invoke(const Route& route, const HttpRequest& request);

  // Asynchronous requests are handled `limits.threads` at once, like synchronous ones: the rest
  // wait in arrival order (at most one per connection) and start as slots free. `start` runs now
  // on this thread, or later on the thread that frees a slot (or its connection's strand); it
  // gets the slot, which starts the next waiting request when the last copy of it is gone.
  class AsyncSlot;
  void StartAsync(asio::any_io_executor executor,
                  std::function<void(std::shared_ptr<AsyncSlot>)> start);
  // An asynchronous route's handler, called on the thread that got the slot. Its responder
  // answers once and frees the slot with the answer; an exception is answered as 500.
  void InvokeAsync(const Route& route, HttpRequest request, HttpServer::Responder respond,
                   std::shared_ptr<AsyncSlot> slot);
  Result<ListenAddress> Start(const ListenAddress& address);
  void Stop();

  void Accept();
  void OnAccepted(beast::error_code error, tcp::socket socket);
  void TakeConnection(tcp::socket socket);  // serves it, or refuses it over max_connections
  void Register(std::uint64_t id, std::weak_ptr<Connection> connection);
  void Unregister(std::uint64_t id);
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  // A warning, at most one a second of all that come here: a flood must not fill the log.
  void LogAtMostEverySecond(std::string_view what);

  const HttpLimits limits;
  const std::string admin_token;
  HttpMetrics& metrics;       // the transport's own counters, owned by ServerMetrics
  std::vector<Route> routes;  // written before Start only
  // Outlives every connection (Stop waits for them), so every reservation taken from it.
  BodyBudget body_budget;

  // Declared before the loop so that connections destroyed with the loop can still unregister.
  Mutex connections_mutex;
  std::condition_variable_any connections_gone;  // waits on the Mutex itself: analysed as held
  std::unordered_map<std::uint64_t, std::weak_ptr<Connection>> connections
      BACKPLANE_GUARDED_BY(connections_mutex);
  std::atomic<std::uint64_t> next_connection_id{0};
  std::atomic<int> open_connections{0};

  // A wrong admin token is logged once per client address per minute: a scanner must not be
  // able to fill the log. Bounded: entries older than a minute go when the map is full.
  Mutex refusals_mutex;
  std::unordered_map<std::string, Clock::time_point> last_refusal_logged
      BACKPLANE_GUARDED_BY(refusals_mutex);

  Mutex async_mutex;
  int async_running BACKPLANE_GUARDED_BY(async_mutex) = 0;
  std::deque<std::pair<asio::any_io_executor, std::function<void(std::shared_ptr<AsyncSlot>)>>>
      async_waiting BACKPLANE_GUARDED_BY(async_mutex);

  asio::io_context loop;
  // The handler pool outlives no connection: joined in Stop, destroyed before the loop.
  asio::thread_pool handler_pool;

 private:
  bool ShouldLogRefusal(const std::string& client);
  void NameHandlerThreads();

  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::optional<tcp::acceptor> acceptor_;  // on its own strand
  std::optional<asio::strand<asio::io_context::executor_type>> accept_strand_;
  std::optional<asio::steady_timer> accept_retry_;
  std::vector<std::thread> io_threads_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> started_{false};
  Mutex log_mutex_;
  Clock::time_point last_accept_log_ BACKPLANE_GUARDED_BY(log_mutex_){};
};

}  // namespace backplane::server
