// The HTTP/1.1 server: HttpServer::Core (loop, acceptor, admission, routing, stop) and the
// public HttpServer over it. Each socket's Connection is connection.cpp; what the two halves
// share is http_server_core.hpp. Routing (path_pattern.cpp) and the plain values
// (http_values.cpp) live apart.
#include <sys/resource.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/string.hpp>
#include <future>
#include <latch>
#include <tuple>

#include "backplane/core/thread_name.hpp"
#include "http/http_server_core.hpp"

namespace backplane::server {

spdlog::logger& HttpLog() {
  static spdlog::logger& logger = ModuleLogger("backplane.http");
  return logger;
}

namespace {

// Equal-time comparison: a token check must not tell an attacker how many leading bytes match.
bool TokensEqual(std::string_view given, std::string_view expected) {
  if (expected.empty())
    return false;
  unsigned char difference = given.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < given.size(); ++i)
    difference |= static_cast<unsigned char>(given[i] ^ expected[i % expected.size()]);
  return difference == 0;
}

}  // namespace

class HttpServer::Core::AsyncSlot {
 public:
  explicit AsyncSlot(Core& core) : core_(core) {}
  AsyncSlot(const AsyncSlot&) = delete;
  AsyncSlot& operator=(const AsyncSlot&) = delete;
  // The next waiting request starts here, on the thread that freed the slot (starting only
  // queues work): at many connections that served more requests/s than a hop through its I/O
  // thread (bench/http_bench.sh). Not when this thread is already starting one: a chain of requests
  // answered at once would recurse without bound; that one goes to its own strand.
  ~AsyncSlot() {
    asio::any_io_executor executor;
    std::function<void(std::shared_ptr<AsyncSlot>)> start;
    {
      MutexLock lock(core_.async_mutex);
      if (core_.async_waiting.empty()) {
        --core_.async_running;
        return;
      }
      std::tie(executor, start) = std::move(core_.async_waiting.front());
      core_.async_waiting.pop_front();
    }
    thread_local bool starting = false;
    if (starting) {
      asio::post(executor, [&core = core_, start = std::move(start)] {
        start(std::make_shared<AsyncSlot>(core));
      });
      return;
    }
    starting = true;
    start(std::make_shared<AsyncSlot>(core_));
    starting = false;
  }

 private:
  Core& core_;
};

void HttpServer::Core::StartAsync(asio::any_io_executor executor,
                                  std::function<void(std::shared_ptr<AsyncSlot>)> start) {
  {
    MutexLock lock(async_mutex);
    if (async_running >= limits.threads) {
      async_waiting.emplace_back(std::move(executor), std::move(start));
      return;
    }
    ++async_running;
  }
  start(std::make_shared<AsyncSlot>(*this));
}

namespace {

// What an asynchronous handler answers through. Answers once (a handler may answer, then
// throw); frees the handler slot with the answer; and when the last copy is dropped unanswered
// (a handler bug), answers 500 rather than leave the client waiting. Thread-safe.
class OnceAnswer {
 public:
  OnceAnswer(HttpServer::Responder respond, std::shared_ptr<HttpServer::Core::AsyncSlot> slot)
      : respond_(std::move(respond)), slot_(std::move(slot)) {}
  ~OnceAnswer() {
    Answer(HttpResponse::Error(500, "internal error: the request was dropped unanswered"));
  }
  OnceAnswer(const OnceAnswer&) = delete;
  OnceAnswer& operator=(const OnceAnswer&) = delete;

  void Answer(HttpResponse response) {
    if (answered_.exchange(true))
      return;
    respond_(std::move(response));
    slot_.reset();
  }

 private:
  // Trap: released with this object, after the slot. The responder holds the connection, and
  // Stop destroys the core (which the slot's release locks) once the last connection is gone.
  const HttpServer::Responder respond_;
  std::shared_ptr<HttpServer::Core::AsyncSlot> slot_;  // reset by the one Answer that runs
  std::atomic<bool> answered_{false};
};

// Runs a handler. Handlers report expected failures as responses; an exception is a bug, answered
// with 500 rather than allowed to take down the thread it ran on. Returns that 500, or nothing
// when the handler returned. Messages name the route, not the path the client sent.
template <typename Call>
std::optional<HttpResponse> RunHandler(const Route& route, Call&& call) {
  try {
    call();
    return std::nullopt;
  } catch (const std::exception& e) {
    HttpLog().error("{} {}: unexpected exception in a handler: {}", route.method, route.path,
                    e.what());
    return HttpResponse::Error(500, std::string("internal error: ") + e.what());
  } catch (...) {
    HttpLog().error("{} {}: unexpected exception in a handler", route.method, route.path);
    return HttpResponse::Error(500, "internal error: unknown exception");
  }
}

}  // namespace

void HttpServer::Core::InvokeAsync(const Route& route, HttpRequest request,
                                   HttpServer::Responder respond, std::shared_ptr<AsyncSlot> slot) {
  auto once = std::make_shared<OnceAnswer>(std::move(respond), std::move(slot));
  auto failure = RunHandler(route, [&] {
    route.async_handler(std::move(request),
                        [once](HttpResponse response) { once->Answer(std::move(response)); });
  });
  if (failure)
    once->Answer(std::move(*failure));
}

std::variant<const Route*, HttpResponse> HttpServer::Core::Find(HttpRequest& request,
                                                                const std::string& client) {
  const Route* found = nullptr;
  for (const Route& route : routes) {
    if (route.method != request.method)
      continue;
    if (auto captured = route.pattern.Match(request.path)) {
      found = &route;
      request.params = std::move(*captured);
      break;
    }
  }
  if (found == nullptr) {
    HttpLog().debug("{} {} {} -> 404", client, request.method, request.path);
    return HttpResponse::Error(404, "no route for " + request.method + " " + request.path);
  }
  if (found->access == Access::kAdmin && !admin_token.empty()) {
    const std::string authorization = request.header("Authorization");
    constexpr std::string_view kBearer = "Bearer ";
    // The auth-scheme is case-insensitive (RFC 9110 §11.1): "bearer" and "BEARER" are Bearer.
    const std::string_view scheme = std::string_view(authorization).substr(0, kBearer.size());
    const bool bearer =
        boost::beast::iequals({scheme.data(), scheme.size()}, {kBearer.data(), kBearer.size()});
    if (!bearer) {
      HttpResponse response =
          HttpResponse::Error(401, request.method + " " + request.path +
                                       " needs the admin token: send 'Authorization: Bearer "
                                       "<token>' (--admin-token or BACKPLANE_ADMIN_TOKEN)");
      response.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"backplane admin\"");
      return response;
    }
    if (!TokensEqual(std::string_view(authorization).substr(kBearer.size()), admin_token)) {
      if (ShouldLogRefusal(client)) {
        HttpLog().warn(
            "refused {} {} from {}: wrong admin token (logged once a minute per address)",
            request.method, request.path, client);
      }
      return HttpResponse::Error(403, "wrong admin token");
    }
  }
  return found;
}

HttpResponse HttpServer::Core::Invoke(const Route& route, const HttpRequest& request) {
  HttpResponse response;
  auto failure = RunHandler(route, [&] { response = route.handler(request); });
  return failure ? std::move(*failure) : std::move(response);
}

bool HttpServer::Core::ShouldLogRefusal(const std::string& client) {
  constexpr std::size_t kMaxAddresses = 1024;
  const auto now = Clock::now();
  MutexLock lock(refusals_mutex);
  auto found = last_refusal_logged.find(client);
  if (found != last_refusal_logged.end()) {
    if (now - found->second < std::chrono::minutes(1))
      return false;
    found->second = now;
    return true;
  }
  if (last_refusal_logged.size() >= kMaxAddresses) {
    std::erase_if(last_refusal_logged,
                  [&](const auto& entry) { return now - entry.second >= std::chrono::minutes(1); });
    // Still full: a flood from many addresses; forget them all rather than grow.
    if (last_refusal_logged.size() >= kMaxAddresses)
      last_refusal_logged.clear();
  }
  last_refusal_logged.emplace(client, now);
  return true;
}

void HttpServer::Core::LogAtMostEverySecond(std::string_view what) {
  MutexLock lock(log_mutex_);
  const auto now = Clock::now();
  if (now - last_accept_log_ < std::chrono::seconds(1))
    return;
  last_accept_log_ = now;
  HttpLog().warn("{}", what);
}

void HttpServer::Core::Register(std::uint64_t id, std::weak_ptr<Connection> connection) {
  MutexLock lock(connections_mutex);
  connections.emplace(id, std::move(connection));
}

void HttpServer::Core::Unregister(std::uint64_t id) {
  MutexLock lock(connections_mutex);
  connections.erase(id);
  open_connections.fetch_sub(1);
  connections_gone.notify_all();
}

void HttpServer::Core::Accept() {
  acceptor_->async_accept(
      asio::make_strand(loop),
      asio::bind_executor(*accept_strand_, [this](beast::error_code error, tcp::socket socket) {
        OnAccepted(error, std::move(socket));
      }));
}

void HttpServer::Core::TakeConnection(tcp::socket socket) {
  if (open_connections.load() >= limits.max_connections) {
    // Over max_connections: accept, answer 503 and close, so that the client learns why
    // instead of waiting in the backlog. One non-blocking write of a small response: if the
    // socket cannot take it, the client gets a plain close.
    static const std::string kRefusal = [] {
      const std::string body =
          R"({"error":"too many connections: the server is at max_connections"})";
      return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
             "Content-Length: " +
             std::to_string(body.size()) + "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" + body;
    }();
    beast::error_code ignored;
    socket.non_blocking(true, ignored);
    socket.write_some(asio::buffer(kRefusal.data(), kRefusal.size()), ignored);
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    metrics.CountResponse(503);
    LogAtMostEverySecond("refused a connection: " + std::to_string(limits.max_connections) +
                         " connections open (max_connections)");
  } else {
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);  // else Nagle + delayed ACK: 40 ms stalls
    ServeConnection(*this, std::move(socket), next_connection_id.fetch_add(1));
  }
}

void HttpServer::Core::OnAccepted(beast::error_code error, tcp::socket socket) {
  if (error == asio::error::operation_aborted || stopping() || !acceptor_->is_open())
    return;
  if (error) {
    // EMFILE/ENFILE: out of descriptors. Retrying at once would spin; the pending connection
    // waits in the backlog meanwhile.
    LogAtMostEverySecond("accept failed: " + error.message() +
                         " (raise the fd limit or lower max_connections)");
    accept_retry_->expires_after(std::chrono::milliseconds(50));
    accept_retry_->async_wait(asio::bind_executor(*accept_strand_, [this](beast::error_code e) {
      if (!e && !stopping())
        Accept();
    }));
    return;
  }
  TakeConnection(std::move(socket));
  // Drain the kernel's accept queue now rather than one connection per loop turn: with a
  // thousand clients connecting at once, a slow drain overflows the backlog and the clients
  // that overflow retry their SYN a second (then three) later.
  for (int i = 0; i < 256; ++i) {
    tcp::socket next(asio::make_strand(loop));
    beast::error_code again;
    acceptor_->accept(next, again);
    if (again)
      break;  // would_block: empty; anything else shows again on the async accept
    TakeConnection(std::move(next));
  }
  Accept();
}

Result<ListenAddress> HttpServer::Core::Start(const ListenAddress& address) {
  // Each connection is a descriptor: raise the soft limit to the hard one, and say so when
  // max_connections cannot fit.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
    if (files.rlim_cur < files.rlim_max) {
      files.rlim_cur = files.rlim_max;
      (void)setrlimit(RLIMIT_NOFILE, &files);
      (void)getrlimit(RLIMIT_NOFILE, &files);
    }
    // Some descriptors go to backends, the log, the watcher: keep a margin of 64.
    if (files.rlim_cur != RLIM_INFINITY &&
        static_cast<rlim_t>(limits.max_connections) + 64 > files.rlim_cur) {
      HttpLog().warn(
          "max_connections is {} but the process may open only {} files (ulimit -n): accepts "
          "beyond that fail until connections close",
          limits.max_connections, files.rlim_cur);
    }
  }

  const auto unavailable = [&](const std::string& why) {
    return Status(StatusCode::kUnavailable,
                  "cannot listen on " + address.ToString() + ": " + why +
                      " (address in use, not an address of this machine, or no permission)");
  };
  beast::error_code error;
  tcp::resolver resolver(loop);
  const auto endpoints =
      resolver.resolve(address.host, std::to_string(address.port),
                       tcp::resolver::passive | tcp::resolver::numeric_service, error);
  if (error)
    return unavailable(error.message());
  std::string last_error = "no address";
  for (const auto& entry : endpoints) {
    tcp::acceptor acceptor(loop);
    acceptor.open(entry.endpoint().protocol(), error);
    if (error) {
      last_error = error.message();
      continue;
    }
    // SO_REUSEADDR allows a restart while old connections sit in TIME_WAIT; no SO_REUSEPORT,
    // with which a second server on the same port would silently take part of the connections.
    acceptor.set_option(tcp::acceptor::reuse_address(true), error);
    acceptor.bind(entry.endpoint(), error);
    if (!error)
      acceptor.listen(limits.listen_backlog, error);
    if (error) {
      last_error = error.message();
      continue;
    }
    acceptor_.emplace(std::move(acceptor));
    break;
  }
  if (!acceptor_)
    return unavailable(last_error);
  ListenAddress bound = address;
  bound.port = acceptor_->local_endpoint().port();

  NameHandlerThreads();                  // before the first accept: nothing else is in the pool yet
  acceptor_->non_blocking(true, error);  // for the draining accepts of OnAccepted
  accept_strand_.emplace(asio::make_strand(loop));
  accept_retry_.emplace(*accept_strand_);
  work_.emplace(loop.get_executor());
  asio::dispatch(*accept_strand_, [this] { Accept(); });
  for (int i = 0; i < limits.io_threads; ++i)
    io_threads_.emplace_back([this] {
      NameThisThread("bp-http-io");
      loop.run();
    });
  started_.store(true);
  return bound;
}

// asio's pool has no hook for its threads' start: one task per thread names it, each waiting
// until all have run, so that no thread takes two (the pool has exactly limits.threads threads,
// and nothing else is queued yet: Start calls this before the first accept).
void HttpServer::Core::NameHandlerThreads() {
  const auto threads = static_cast<std::ptrdiff_t>(limits.threads);
  auto all_named = std::make_shared<std::latch>(threads);
  for (std::ptrdiff_t i = 0; i < threads; ++i) {
    asio::post(handler_pool, [all_named] {
      NameThisThread("bp-http-handler");
      all_named->arrive_and_wait();
    });
  }
  all_named->wait();
}

void HttpServer::Core::Stop() {
  if (!started_.exchange(false))
    return;
  stopping_.store(true, std::memory_order_release);
  // 1. No new connections: the listening socket closes (clients get refused from now on).
  std::promise<void> closed;
  asio::dispatch(*accept_strand_, [this, &closed] {
    beast::error_code ignored;
    acceptor_->close(ignored);
    accept_retry_->cancel();
    closed.set_value();
  });
  closed.get_future().wait();
  // 2. Idle connections close; those in a request finish it and answer with Connection: close.
  {
    std::vector<std::shared_ptr<Connection>> live;
    {
      MutexLock lock(connections_mutex);
      for (auto& [id, weak] : connections) {
        if (auto connection = weak.lock())
          live.push_back(std::move(connection));
      }
    }
    for (auto& connection : live)
      StopConnection(std::move(connection));
  }
  // 3. Wait for the last connection. Handlers are not interrupted (they hold no deadline of
  // ours); a client that stops reading is cut off by the write timeout.
  {
    MutexLock lock(connections_mutex);
    connections_gone.wait(connections_mutex, [&] { return open_connections.load() == 0; });
  }
  work_.reset();
  loop.stop();
  for (auto& thread : io_threads_)
    thread.join();
  io_threads_.clear();
  handler_pool.join();
}

// ---- HttpServer ---------------------------------------------------------------------------

HttpServer::HttpServer(HttpLimits limits, std::string admin_token, HttpMetrics& metrics)
    : core_(std::make_unique<Core>(limits, std::move(admin_token), metrics)) {}

HttpServer::~HttpServer() {
  Stop();
}

void HttpServer::Get(const std::string& pattern, Handler handler) {
  core_->routes.push_back(
      {"GET", pattern, PathPattern(pattern), Access::kPublic, std::move(handler)});
}

void HttpServer::Post(const std::string& pattern, Access access, Handler handler) {
  core_->routes.push_back({"POST", pattern, PathPattern(pattern), access, std::move(handler)});
}

void HttpServer::Put(const std::string& pattern, Access access, Handler handler) {
  core_->routes.push_back({"PUT", pattern, PathPattern(pattern), access, std::move(handler)});
}

void HttpServer::PostAsync(const std::string& pattern, Access access, AsyncHandler handler) {
  core_->routes.push_back(
      {"POST", pattern, PathPattern(pattern), access, nullptr, std::move(handler)});
}

Result<ListenAddress> HttpServer::Start(const ListenAddress& address) {
  return core_->Start(address);
}

void HttpServer::Stop() {
  core_->Stop();
}

}  // namespace backplane::server
