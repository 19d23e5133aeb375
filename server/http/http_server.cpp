// The HTTP/1.1 server: HttpServer::Core (loop, acceptor, admission, routing, stop) and the
// Connection it runs on each socket's strand. Over 600 lines on purpose: the two are one state
// machine (a connection's every step goes through the core's admission and registry, and Stop
// waits on the connections), and splitting them would publish the core's internals in a header
// for no second user. Routing (path_pattern.cpp) and the plain values (http_values.cpp) live
// apart.
#include "http/http_server.hpp"

#include <sys/resource.h>

#include <array>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cassert>
#include <condition_variable>
#include <deque>
#include <future>
#include <latch>
#include <limits>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <variant>

#include "backplane/core/logging.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/core/thread_name.hpp"
#include "http/body_budget.hpp"
#include "http/path_pattern.hpp"
#include "http/request_framing.hpp"
#include "metrics/metrics.hpp"

namespace backplane::server {

namespace {
// The transport's logger: connections, refusals, handler bugs.
spdlog::logger& Log() {
  static spdlog::logger& logger = ModuleLogger("backplane.http");
  return logger;
}
}  // namespace
using nlohmann::json;

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;
using Clock = std::chrono::steady_clock;

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

std::string Milliseconds(std::chrono::milliseconds duration) {
  return std::to_string(duration.count()) + " ms";
}

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

}  // namespace

class Connection;

// ---- HttpServer::Core ---------------------------------------------------------------------

// Thread-safe. Owns the event loop, its I/O threads, the handler pool, the acceptor and the
// registry of live connections. Connections refer to it by reference: Stop waits until every
// connection is gone before the loop and the pool are torn down.
class HttpServer::Core {
 public:
  Core(HttpLimits limits, std::string admin_token, ServerMetrics& metrics)
      : limits(limits),
        admin_token(std::move(admin_token)),
        metrics(metrics),
        body_budget(limits.max_buffered_body_bytes, &metrics.http_buffered_body_bytes),
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
  ServerMetrics& metrics;
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

class HttpServer::Core::AsyncSlot {
 public:
  explicit AsyncSlot(Core& core) : core_(core) {}
  AsyncSlot(const AsyncSlot&) = delete;
  AsyncSlot& operator=(const AsyncSlot&) = delete;
  // The next waiting request starts here, on the thread that freed the slot (starting only
  // queues work): at 1024 connections that made 5-10% more requests/s than a hop through its
  // I/O thread. Not when this thread is already starting one: a chain of requests answered at
  // once would recurse without bound; that one goes to its own strand.
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
    Log().error("{} {}: unexpected exception in a handler: {}", route.method, route.path, e.what());
    return HttpResponse::Error(500, std::string("internal error: ") + e.what());
  } catch (...) {
    Log().error("{} {}: unexpected exception in a handler", route.method, route.path);
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

// One accepted connection. Strand-only: every member is touched on the connection's strand,
// except the handler jobs (pooled or asynchronous), which read only the request they were given
// and post the response back.
// Keeps itself alive through the shared_ptrs its pending operations hold.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpServer::Core& core, tcp::socket socket, std::uint64_t id)
      : counted_(core, id),
        core_(core),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        id_(id) {
    beast::error_code error;
    const auto remote = socket_.remote_endpoint(error);
    client_ = error ? "unknown" : remote.address().to_string();
  }

  void Start() {
    asio::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->WaitForRequest(); });
  }
  asio::any_io_executor executor() { return socket_.get_executor(); }

  // Posted by Stop: an idle connection, or one still receiving a request's header, closes now;
  // one in a request finishes it first. Trap: only the socket closes here, since the pending
  // read may still use the parser (its completion can already be queued); Close, which frees
  // the parser, runs when that read completes (a use-after-free that HttpAsyncRouteTest's stop
  // test found under TSan).
  void OnStop() {
    if (phase_ == Phase::kIdle || phase_ == Phase::kReadingHeader)
      CloseSocket();  // the pending read ends with an error, and then closes the rest
  }

 private:
  enum class Phase { kIdle, kReadingHeader, kInRequest, kClosing, kClosed };
  static constexpr std::chrono::milliseconds kCancelRetry{10};

  const HttpLimits& limits() const { return core_.limits; }

  // Our own deadline rather than beast::tcp_stream's: that one closes the socket when it
  // expires, and a 408 could no longer be sent. Expiry cancels the pending operation, which
  // then completes with operation_aborted; Outcome tells the two apart.
  //
  // Lazy: re-arming a timer for every read and write (three per request) costs a timer-queue
  // update and a cancelled completion each, a large share of a small request. So one wait stays
  // pending; moving the deadline later only updates deadline_at_, and when the wait ends early
  // it waits again for the rest. Only a deadline earlier than the pending wait re-arms it.
  void ArmTimer(Clock::time_point when) {
    timed_out_ = false;
    deadline_at_ = when;
    if (!timer_waiting_ || when < timer_expiry_)
      StartTimer(when);
  }
  void DisarmTimer() { deadline_at_ = Clock::time_point::max(); }
  void StartTimer(Clock::time_point when) {
    timer_waiting_ = true;
    timer_expiry_ = when;
    const std::uint64_t generation = ++timer_generation_;
    timer_.expires_at(when);
    timer_.async_wait([self = shared_from_this(), generation](beast::error_code error) {
      self->OnTimer(error, generation);
    });
  }
  void OnTimer(beast::error_code error, std::uint64_t generation) {
    // A wait replaced by StartTimer completes too (operation_aborted): not ours to act on.
    if (generation != timer_generation_)
      return;
    timer_waiting_ = false;
    if (error || phase_ == Phase::kClosed || deadline_at_ == Clock::time_point::max())
      return;
    if (Clock::now() < deadline_at_)
      return StartTimer(deadline_at_);
    timed_out_ = true;
    beast::error_code ignored;
    socket_.cancel(ignored);
    // Trap: a cancel lands only on an operation still pending. When a read's completion was
    // already queued as the deadline passed (a trickling client's byte), the composed read goes
    // on with a new read that nothing cancels, and the connection would never time out (seen: 1
    // of 300 Slowloris connections under load). So cancel again until the operation has ended
    // (Outcome disarms; this wait then finds no deadline and stops).
    StartTimer(Clock::now() + kCancelRetry);
  }
  // The completion's error, with a cancellation by our timer reported as beast::error::timeout.
  beast::error_code Outcome(beast::error_code error) {
    DisarmTimer();
    if (error && timed_out_)
      return beast::error::timeout;
    return error;
  }

  // Between requests. A pipelined request already in the buffer is read at once; otherwise the
  // first byte must come within the keep-alive timeout (the header timeout for a connection's
  // first request), and from it the header timeout runs.
  void WaitForRequest() {
    phase_ = Phase::kIdle;
    if (core_.stopping())
      return Close();
    if (buffer_.size() > 0)
      return ReadHeader();
    ArmTimer(Clock::now() + (requests_served_ == 0
                                 ? limits().header_timeout
                                 : std::chrono::duration_cast<std::chrono::milliseconds>(
                                       limits().keep_alive_timeout)));
    socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](
                                                       beast::error_code error, std::size_t bytes) {
      // Idle timeout, client gone, or Stop (which may have closed the socket while this
      // completion was already queued, with bytes): nothing to answer.
      if (self->Outcome(error) || self->phase_ == Phase::kClosed)
        return self->Close();
      self->buffer_.commit(bytes);
      self->ReadHeader();
    });
  }

  void ReadHeader() {
    phase_ = Phase::kReadingHeader;
    request_started_ = Clock::now();
    deadline_ = request_started_ + limits().request_timeout;
    parser_.emplace();
    PrepareForHeader(*parser_, limits());
    ArmTimer(std::min(request_started_ + limits().header_timeout, deadline_));
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code error, std::size_t) {
                              self->OnHeader(self->Outcome(error));
                            });
  }

  void OnHeader(beast::error_code error) {
    if (phase_ == Phase::kClosed)
      return Close();  // Stop closed the socket: nobody to answer, even if the header arrived
    if (error == beast::error::timeout) {
      return Fail(408, "request header not received within " +
                           Milliseconds(limits().header_timeout) + " (header_timeout_ms)");
    }
    if (error == http::error::end_of_stream || error == http::error::partial_message ||
        (error &&
         error.category() != http::make_error_code(http::error::header_limit).category())) {
      return Close();  // the client left or the socket failed: nobody to answer
    }
    if (auto refusal = CheckRequestHeader(error, *parser_, limits()))
      return Fail(refusal->status, refusal->message);
    phase_ = Phase::kInRequest;
    const auto& header = parser_->get();
    core_.metrics.http_in_flight.fetch_add(1);
    in_flight_ = true;
    if (parser_->is_done())
      return Dispatch();
    if (!ReserveBody())
      return;
    // curl sends `Expect: 100-continue` for bodies over 1 KiB and waits a second for this.
    // Written synchronously: 25 bytes into a socket that has sent nothing yet never block.
    if (header.version() >= 11 && beast::iequals(header[http::field::expect], "100-continue")) {
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      beast::error_code ignored;
      asio::write(socket_, asio::buffer(kContinue.data(), kContinue.size()), ignored);
    }
    PrepareForBody(*parser_, limits());
    ArmTimer(std::min(Clock::now() + limits().read_timeout, deadline_));
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code error, std::size_t) {
                       self->OnBody(self->Outcome(error));
                     });
  }

  void OnBody(beast::error_code error) {
    if (chunk_refused_) {
      chunk_refused_ = false;
      return RefuseOverBudget(chunk_refusal_);
    }
    if (error == beast::error::timeout) {
      return Fail(408, "request body not received within " +
                           Milliseconds(std::min(limits().read_timeout, limits().request_timeout)) +
                           " (read_timeout_ms, request_timeout_ms)");
    }
    if (error == http::error::end_of_stream || error == http::error::partial_message ||
        (error && error.category() != http::make_error_code(http::error::body_limit).category())) {
      return Close();
    }
    if (auto refusal = CheckRequestBody(error, limits()))
      return Fail(refusal->status, refusal->message);
    Dispatch();
  }

  // Takes the body's bytes from the server's budget before any of them is read: a Content-Length
  // now, a chunked body chunk by chunk (chunk_header_ grows the reservation as each chunk's size
  // arrives; Beast has checked it against max_body_bytes first). The reservation is held until
  // the request is answered (the handler has the body, or what it was parsed into, till then),
  // or until the connection fails or closes. False when refused (answered 503 here).
  bool ReserveBody() {
    const auto length = parser_->content_length();
    auto reservation = core_.body_budget.TryReserve(length.value_or(0));
    if (!reservation) {
      RefuseOverBudget("request body of " + std::to_string(*length) + " bytes");
      return false;
    }
    body_reservation_ = std::move(*reservation);
    if (!length) {
      chunk_header_ = [this](std::uint64_t size, beast::string_view, beast::error_code& error) {
        if (body_reservation_.Grow(static_cast<std::size_t>(size)))
          return;
        chunk_refused_ = true;
        chunk_refusal_ = "chunk of " + std::to_string(size) + " bytes of a request body, after " +
                         std::to_string(body_reservation_.bytes()) + " bytes of it,";
        error = http::error::body_limit;  // ends the read; OnBody looks at chunk_refused_ first
      };
      parser_->on_chunk_header(chunk_header_);
    }
    return true;
  }

  // 503 with Retry-After: bodies held by other requests take the budget now; they are answered
  // or time out within request_timeout_ms, so a retry soon fits. `what` names the body.
  void RefuseOverBudget(const std::string& what) {
    core_.metrics.http_body_budget_refusals.fetch_add(1, std::memory_order_relaxed);
    const std::string message = what +
                                " does not fit: " + std::to_string(core_.body_budget.in_use()) +
                                " of the limit of " + std::to_string(core_.body_budget.limit()) +
                                " bytes of request bodies held at once are taken "
                                "(max_buffered_body_bytes); retry later";
    core_.LogAtMostEverySecond("refused a request from " + client_ + ": " + message +
                               " (logged at most once a second)");
    HttpResponse busy = HttpResponse::Error(503, message);
    busy.headers.emplace_back("Retry-After", "1");
    Fail(std::move(busy));
  }

  // Routes the request; a synchronous route's handler runs on a handler thread, an asynchronous
  // one is called here and answers from wherever its work ends. Either way the answer comes back
  // on this strand.
  void Dispatch() {
    auto message = std::make_shared<http::request<http::string_body>>(parser_->release());
    parser_.reset();
    const bool keep_alive = message->keep_alive() && !core_.stopping() &&
                            requests_served_ + 1 < limits().keep_alive_max_requests;
    head_only_ = message->method() == http::verb::head;
    const bool http10 = message->version() == 10;

    HttpRequest request;
    request.method = std::string(message->method_string());
    if (request.method == "HEAD")
      request.method = "GET";
    const auto target = message->target();
    request.path = DecodedPath(std::string_view(target.data(), target.size()));
    request.body = std::move(message->body());
    // A field sent on several lines reads as one value, the lines joined by ", " (RFC 9110
    // 5.3): a handler then sees "12, 13" for a repeated single-valued field and refuses it,
    // where taking the first line would let the two ends of a proxy disagree on the value.
    request.header = [message](std::string_view name) {
      std::string joined;
      const auto [first, last] = message->equal_range(beast::string_view(name.data(), name.size()));
      for (auto field = first; field != last; ++field) {
        if (field != first)
          joined += ", ";
        joined.append(field->value().data(), field->value().size());
      }
      return joined;
    };
    request.deadline = deadline_;

    // Called once, from any thread.
    HttpServer::Responder respond = [self = shared_from_this(), keep_alive,
                                     http10](HttpResponse response) {
      Answer answer{.response = std::move(response),
                    .close = !keep_alive,
                    .say_keep_alive = keep_alive && http10};
      asio::post(self->socket_.get_executor(), [self, answer = std::move(answer)]() mutable {
        self->Respond(std::move(answer));
      });
    };
    if (Log().should_log(spdlog::level::debug))
      request_line_ = request.method + " " + request.path;
    auto found = core_.Find(request, client_);
    if (auto* refusal = std::get_if<HttpResponse>(&found))
      return respond(std::move(*refusal));
    const Route& route = *std::get<const Route*>(found);
    if (route.async_handler) {
      return core_.StartAsync(
          executor(), [self = shared_from_this(), &route, request = std::move(request),
                       respond = std::move(respond)](
                          std::shared_ptr<HttpServer::Core::AsyncSlot> slot) mutable {
            if (Clock::now() > request.deadline)
              return respond(self->DeadlinePassedInQueue());
            self->core_.InvokeAsync(route, std::move(request), std::move(respond), std::move(slot));
          });
    }
    asio::post(core_.handler_pool, [self = shared_from_this(), &route, request = std::move(request),
                                    respond = std::move(respond)] {
      if (Clock::now() > request.deadline)
        return respond(self->DeadlinePassedInQueue());
      respond(self->core_.Invoke(route, request));
    });
  }

  // A request that waited for a handler past its deadline: the client has likely given up;
  // refused rather than handled.
  HttpResponse DeadlinePassedInQueue() const {
    HttpResponse busy = HttpResponse::Error(
        503, "no handler became free within the request deadline of " +
                 Milliseconds(limits().request_timeout) + " (request_timeout_ms)");
    busy.headers.emplace_back("Retry-After", "1");
    return busy;
  }

  // An error of the transport: answered, then the connection closes, draining a body that may
  // be left unread so that none of it is ever parsed as a request.
  void Fail(int status, const std::string& message) { Fail(HttpResponse::Error(status, message)); }
  void Fail(HttpResponse response) {
    phase_ = Phase::kClosing;
    parser_.reset();
    head_only_ = false;
    Log().debug("{}: {} {}", client_, response.status, response.body);
    Respond({std::move(response), /*close=*/true, /*linger=*/true});
  }

  void Respond(Answer answer) {
    body_reservation_.Release();  // the handler is done with the body
    if (core_.stopping())
      answer.close = true;
    const HttpResponse& response = answer.response;
    core_.metrics.CountHttpResponse(response.status);
    if (!request_line_.empty()) {
      Log().debug("{} {} -> {}", client_, request_line_, response.status);
      request_line_.clear();
    }
    if (in_flight_) {
      core_.metrics.http_in_flight.fetch_sub(1);
      in_flight_ = false;
    }
    out_.clear();
    out_ += "HTTP/1.1 ";
    out_ += std::to_string(response.status);
    out_ += ' ';
    const auto reason = http::obsolete_reason(static_cast<http::status>(response.status));
    out_.append(reason.data(), reason.size());
    out_ += "\r\nContent-Type: ";
    out_ += response.content_type;
    out_ += "\r\nContent-Length: ";
    out_ += std::to_string(response.body.size());
    out_ += "\r\n";
    for (const auto& [name, value] : response.headers) {
      out_ += name;
      out_ += ": ";
      out_ += value;
      out_ += "\r\n";
    }
    if (answer.close)
      out_ += "Connection: close\r\n";
    else if (answer.say_keep_alive)
      out_ += "Connection: keep-alive\r\n";
    out_ += "\r\n";
    // The body is moved, not appended: a response of hundreds of MB would otherwise exist twice.
    body_.clear();
    if (!head_only_)
      body_ = std::move(answer.response.body);
    const std::array<asio::const_buffer, 2> buffers{asio::buffer(out_), asio::buffer(body_)};
    ArmTimer(Clock::now() + limits().write_timeout);
    asio::async_write(socket_, buffers,
                      [self = shared_from_this(), close = answer.close, linger = answer.linger](
                          beast::error_code error, std::size_t) {
                        if (self->Outcome(error))
                          return self->Close();
                        ++self->requests_served_;
                        if (linger)
                          return self->Linger();
                        if (close)
                          return self->Close();
                        self->WaitForRequest();
                      });
  }

  // After an error with unread request bytes: stop sending, then read and discard for a short
  // while. Closing at once with unread data would send a reset, and the client could lose the
  // error response before reading it.
  void Linger() {
    phase_ = Phase::kClosing;
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    buffer_.clear();
    ArmTimer(Clock::now() +
             std::min<std::chrono::milliseconds>(limits().read_timeout, std::chrono::seconds(2)));
    DrainSome();
  }
  void DrainSome() {
    socket_.async_read_some(asio::buffer(drain_),
                            [self = shared_from_this()](beast::error_code error, std::size_t) {
                              if (error)
                                return self->Close();
                              self->DrainSome();
                            });
  }

  void Close() {
    phase_ = Phase::kClosing;
    // A body abandoned half-way (client gone, timeout): its bytes are freed with the parser.
    parser_.reset();
    body_reservation_.Release();
    if (in_flight_) {
      core_.metrics.http_in_flight.fetch_sub(1);
      in_flight_ = false;
    }
    CloseSocket();
  }
  // The socket and the timer, not what a pending read refers to (the buffer, the parser).
  void CloseSocket() {
    DisarmTimer();
    beast::error_code ignored;
    timer_.cancel();  // the pending wait holds this connection alive
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    phase_ = Phase::kClosed;
  }

  // Counts the connection open while it lives, and unregisters it when it is destroyed, which
  // wakes Stop when it is the last. Trap: Stop then destroys the io_context that socket_ and
  // timer_ belong to, and the budget body_reservation_ gives back to, so this member is declared
  // first and destroyed last: the connection's last reference may drop on another thread (a
  // runtime worker that answered it) while Stop waits.
  class Counted {
   public:
    Counted(HttpServer::Core& core, std::uint64_t id) : core_(core), id_(id) {
      core_.open_connections.fetch_add(1);
    }
    ~Counted() { core_.Unregister(id_); }
    Counted(const Counted&) = delete;
    Counted& operator=(const Counted&) = delete;

   private:
    HttpServer::Core& core_;
    const std::uint64_t id_;
  } counted_;
  HttpServer::Core& core_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  std::uint64_t timer_generation_ = 0;
  bool timer_waiting_ = false;
  Clock::time_point timer_expiry_;
  Clock::time_point deadline_at_ = Clock::time_point::max();
  bool timed_out_ = false;
  const std::uint64_t id_;
  std::string client_;
  beast::flat_buffer buffer_;
  // Declared before parser_ on purpose: members are destroyed in reverse order, so the parser
  // (which holds the body and refers to chunk_header_) goes first, and the budget gets the bytes
  // back once they are freed.
  BodyReservation body_reservation_;
  std::function<void(std::uint64_t, beast::string_view, beast::error_code&)> chunk_header_;
  bool chunk_refused_ = false;
  std::string chunk_refusal_;  // what RefuseOverBudget names, when chunk_refused_
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::kIdle;
  bool in_flight_ = false;
  bool head_only_ = false;
  int requests_served_ = 0;
  Clock::time_point request_started_;
  Clock::time_point deadline_;
  std::string request_line_;  // "METHOD path" for the debug log, when it is on
  std::string out_;           // the response's status line and headers
  std::string body_;          // its body, until written
  std::array<char, 8192> drain_{};
};

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
    Log().debug("{} {} {} -> 404", client, request.method, request.path);
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
        Log().warn("refused {} {} from {}: wrong admin token (logged once a minute per address)",
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
  Log().warn("{}", what);
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
    metrics.CountHttpResponse(503);
    LogAtMostEverySecond("refused a connection: " + std::to_string(limits.max_connections) +
                         " connections open (max_connections)");
  } else {
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);  // else Nagle + delayed ACK: 40 ms stalls
    const std::uint64_t id = next_connection_id.fetch_add(1);
    auto connection = std::make_shared<Connection>(*this, std::move(socket), id);
    Register(id, connection);
    connection->Start();
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
      Log().warn(
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
    for (auto& connection : live) {
      Connection* raw = connection.get();
      asio::post(raw->executor(), [connection] { connection->OnStop(); });
    }
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

HttpServer::HttpServer(HttpLimits limits, std::string admin_token, ServerMetrics& metrics)
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
