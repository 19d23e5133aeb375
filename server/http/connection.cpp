// One accepted connection of the HTTP server: a request read within its limits, routed through
// the Core's admission, answered exactly once, then the next (keep-alive) or a close. The Core,
// which accepts connections and stops them, is http_server.cpp; what the two share is
// http_server_core.hpp.
#include <array>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>

#include "http/http_server_core.hpp"
#include "http/request_framing.hpp"

namespace backplane::server {

namespace http = boost::beast::http;

namespace {

std::string Milliseconds(std::chrono::milliseconds duration) {
  return std::to_string(duration.count()) + " ms";
}

}  // namespace

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
    core_.metrics.in_flight.fetch_add(1);
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
    core_.metrics.body_budget_refusals.fetch_add(1, std::memory_order_relaxed);
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
    if (const auto mark = target.find('?'); mark != target.npos)
      request.query = std::string(target.substr(mark + 1));
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
    if (HttpLog().should_log(spdlog::level::debug))
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
    HttpLog().debug("{}: {} {}", client_, response.status, response.body);
    Respond({std::move(response), /*close=*/true, /*linger=*/true});
  }

  void Respond(Answer answer) {
    body_reservation_.Release();  // the handler is done with the body
    if (core_.stopping())
      answer.close = true;
    const HttpResponse& response = answer.response;
    core_.metrics.CountResponse(response.status);
    if (!request_line_.empty()) {
      HttpLog().debug("{} {} -> {}", client_, request_line_, response.status);
      request_line_.clear();
    }
    if (in_flight_) {
      core_.metrics.in_flight.fetch_sub(1);
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
      core_.metrics.in_flight.fetch_sub(1);
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

void ServeConnection(HttpServer::Core& core, tcp::socket socket, std::uint64_t id) {
  auto connection = std::make_shared<Connection>(core, std::move(socket), id);
  core.Register(id, connection);
  connection->Start();
}

void StopConnection(std::shared_ptr<Connection> connection) {
  Connection* raw = connection.get();
  asio::post(raw->executor(), [connection = std::move(connection)] { connection->OnStop(); });
}

}  // namespace backplane::server
