#include "http_server.hpp"

#include <httplib.h>

#include <charconv>

#include "metrics.hpp"
#include "server_log.hpp"

namespace backplane::server {
using nlohmann::json;

namespace {

std::string_view ReasonPhrase(int status) {
  switch (status) {
    case 400:
      return "bad request";
    case 401:
      return "unauthorized";
    case 403:
      return "forbidden";
    case 404:
      return "not found";
    case 405:
      return "method not allowed";
    case 408:
      return "request timeout";
    case 409:
      return "conflict";
    case 413:
      return "request body too large";
    case 414:
      return "request URI too long";
    case 416:
      return "range not satisfiable";
    case 431:
      return "request headers too large";
    case 500:
      return "internal server error";
    case 503:
      return "service unavailable";
    default:
      return "error";
  }
}

// Counts a request as in flight for its whole life in a handler, the body read included (so
// that graceful shutdown can be observed waiting for it).
class InFlight {
 public:
  explicit InFlight(std::atomic<int64_t>& gauge) : gauge_(gauge) { gauge_.fetch_add(1); }
  ~InFlight() { gauge_.fetch_sub(1); }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::atomic<int64_t>& gauge_;
};

// Equal-time comparison: a token check must not tell an attacker how many leading bytes match.
bool TokensEqual(std::string_view given, std::string_view expected) {
  if (expected.empty())
    return false;
  unsigned char difference = given.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < given.size(); ++i)
    difference |= static_cast<unsigned char>(given[i] ^ expected[i % expected.size()]);
  return difference == 0;
}

HttpRequest MakeRequest(const httplib::Request& raw) {
  HttpRequest request;
  request.method = raw.method;
  request.path = raw.path;
  for (std::size_t i = 1; i < raw.matches.size(); ++i)
    request.params.push_back(raw.matches[i].str());
  request.header = [&raw](std::string_view name) {
    return raw.get_header_value(std::string(name).c_str());
  };
  return request;
}

void WriteResponse(const HttpResponse& response, httplib::Response& raw) {
  raw.status = response.status;
  for (const auto& [name, value] : response.headers)
    raw.set_header(name.c_str(), value);
  raw.set_content(response.body, response.content_type.c_str());
}

// Reads the whole body, at most `limit` bytes, or says why not.
Result<std::string, HttpResponse> ReadBody(const httplib::Request& raw,
                                           const httplib::ContentReader& reader,
                                           std::size_t limit) {
  const bool chunked = raw.get_header_value("Transfer-Encoding") == "chunked";
  const bool has_length = raw.has_header("Content-Length");
  // HTTP/1.1: a request with neither has no body. cpp-httplib 0.11 would instead read until the
  // client closes the connection (a `curl -X POST` without data would hang until the timeout),
  // so the reader is not called at all.
  if (!chunked && !has_length)
    return std::string();
  std::string body;
  std::size_t declared = 0;
  if (has_length) {
    const std::string text = raw.get_header_value("Content-Length");
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), declared);
    if (error != std::errc() || end != text.data() + text.size())
      return HttpResponse::Error(400, "malformed Content-Length '" + text + "'");
    if (declared > limit) {
      // cpp-httplib (payload_max_length = limit) discards such a body unread; let it, so that
      // the connection stays in sync for the next request.
      (void)reader([](const char*, std::size_t) { return true; });
      return HttpResponse::Error(413, "request body of " + std::to_string(declared) +
                                          " bytes exceeds the limit of " + std::to_string(limit) +
                                          " bytes (max_body_bytes)");
    }
    body.reserve(declared);
  }
  bool too_large = false;
  const bool complete = reader([&](const char* data, std::size_t size) {
    if (body.size() + size > limit) {
      too_large = true;  // a chunked body has no length to check up front
      return false;
    }
    body.append(data, size);
    return true;
  });
  if (too_large) {
    return HttpResponse::Error(413, "request body exceeds the limit of " + std::to_string(limit) +
                                        " bytes (max_body_bytes)");
  }
  if (!complete)
    return HttpResponse::Error(400, "request body incomplete or malformed");
  return body;
}

}  // namespace

// ---- HttpResponse -------------------------------------------------------------------------

HttpResponse HttpResponse::Json(const json& body, int status) {
  HttpResponse response;
  response.status = status;
  // Replace invalid UTF-8 (e.g. from a file name) instead of throwing.
  response.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return response;
}

HttpResponse HttpResponse::Error(int status, std::string_view message) {
  return Json({{"error", message}}, status);
}

HttpResponse HttpResponse::FromStatus(const Status& status) {
  HttpResponse response = Error(HttpStatusFor(status.code()), status.message());
  if (response.status == 503)
    response.headers.emplace_back("Retry-After", "1");
  return response;
}

int HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kUnimplemented:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kAlreadyExists:
    case StatusCode::kFailedPrecondition:
      return 409;
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 504;
    case StatusCode::kInternal:
      return 500;
  }
  return 500;
}

Result<json> ParseJsonBody(std::string_view body, int max_depth) {
  // Nesting depth outside strings; a string's brackets do not count, escaped quotes do not end
  // it. Invalid JSON is left to the parser.
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (std::size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return InvalidArgument("malformed JSON: nested deeper than " + std::to_string(max_depth) +
                               " levels at byte " + std::to_string(i) + " (max_json_depth)");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  if (body.empty())
    return InvalidArgument("malformed JSON: the request body is empty");
  try {
    return json::parse(body);
  } catch (const json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." → from "parse".
    std::string what = e.what();
    const auto start = what.find("] ");
    return InvalidArgument("malformed JSON: " +
                           (start == std::string::npos ? what : what.substr(start + 2)));
  }
}

HttpLimits HttpLimitsFrom(const ServeConfig& config) {
  return {.threads = config.http_threads,
          .max_body_bytes = config.max_body_bytes,
          .max_header_bytes = config.max_header_bytes,
          .max_json_depth = config.max_json_depth,
          .read_timeout = config.read_timeout,
          .write_timeout = config.write_timeout,
          .keep_alive_timeout = config.keep_alive_timeout,
          .keep_alive_max_requests = config.keep_alive_max_requests};
}

// ---- HttpServer ---------------------------------------------------------------------------

HttpServer::HttpServer(HttpLimits limits, std::string admin_token, ServerMetrics& metrics)
    : limits_(limits),
      admin_token_(std::move(admin_token)),
      metrics_(metrics),
      server_(std::make_unique<httplib::Server>()) {
  const int threads = limits_.threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_payload_max_length(limits_.max_body_bytes);
  const auto split = [](std::chrono::milliseconds duration) {
    return std::pair<time_t, time_t>(duration.count() / 1000, (duration.count() % 1000) * 1000);
  };
  server_->set_read_timeout(split(limits_.read_timeout).first, split(limits_.read_timeout).second);
  server_->set_write_timeout(split(limits_.write_timeout).first,
                             split(limits_.write_timeout).second);
  server_->set_keep_alive_timeout(limits_.keep_alive_timeout.count());
  server_->set_keep_alive_max_count(static_cast<std::size_t>(limits_.keep_alive_max_requests));
  // Without TCP_NODELAY a keep-alive client's small requests meet Nagle and delayed ACKs: 40 ms
  // stalls per request.
  server_->set_tcp_nodelay(true);
  // cpp-httplib's default socket options add SO_REUSEPORT, with which a second server started
  // on the same port binds too and silently takes part of the connections. SO_REUSEADDR alone
  // still allows a restart while old connections sit in TIME_WAIT.
  server_->set_socket_options([](socket_t socket) {
    int yes = 1;
    setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });

  // Runs after the headers are read, before routing and before any body is read.
  server_->set_pre_routing_handler([this](const httplib::Request& raw, httplib::Response& res) {
    std::size_t header_bytes = 0;
    for (const auto& [name, value] : raw.headers)
      header_bytes += name.size() + value.size() + 4;  // ": " and CRLF
    if (header_bytes > limits_.max_header_bytes) {
      WriteResponse(HttpResponse::Error(431, "request headers of " + std::to_string(header_bytes) +
                                                 " bytes exceed the limit of " +
                                                 std::to_string(limits_.max_header_bytes) +
                                                 " bytes (max_header_bytes)"),
                    res);
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Every error cpp-httplib answers by itself (no route, malformed request, oversized body...)
  // becomes a JSON error too. It also runs after our handlers' errors: keep their bodies.
  server_->set_error_handler([](const httplib::Request& raw, httplib::Response& res) {
    if (!res.body.empty())
      return;
    const std::string message = res.status == 404 ? "no route for " + raw.method + " " + raw.path
                                                  : std::string(ReasonPhrase(res.status));
    res.set_content(json({{"error", message}}).dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
  });
  server_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        Log().error("unexpected exception in a handler: {}", what);
        WriteResponse(HttpResponse::Error(500, "internal error: " + what), res);
      });
  server_->set_logger([this](const httplib::Request& raw, const httplib::Response& res) {
    metrics_.CountHttpResponse(res.status);
    Log().debug("{} {} {} -> {}", raw.remote_addr, raw.method, raw.path, res.status);
  });
}

HttpServer::~HttpServer() {
  Stop();
}

HttpResponse HttpServer::Dispatch(const Handler& handler, Access access,
                                  const HttpRequest& request) const {
  if (access == Access::kAdmin && !admin_token_.empty()) {
    const std::string authorization = request.header("Authorization");
    constexpr std::string_view kBearer = "Bearer ";
    if (!authorization.starts_with(kBearer)) {
      HttpResponse response =
          HttpResponse::Error(401, request.method + " " + request.path +
                                       " needs the admin token: send 'Authorization: Bearer "
                                       "<token>' (--admin-token or BACKPLANE_ADMIN_TOKEN)");
      response.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"backplane admin\"");
      return response;
    }
    if (!TokensEqual(std::string_view(authorization).substr(kBearer.size()), admin_token_)) {
      Log().warn("refused {} {}: wrong admin token", request.method, request.path);
      return HttpResponse::Error(403, "wrong admin token");
    }
  }
  // Handlers report expected failures as responses; an exception here is a bug, answered with
  // 500 rather than allowed to take down the connection thread.
  try {
    return handler(request);
  } catch (const std::exception& e) {
    Log().error("{} {}: unexpected exception: {}", request.method, request.path, e.what());
    return HttpResponse::Error(500, std::string("internal error: ") + e.what());
  }
}

void HttpServer::Get(const std::string& pattern, Handler handler) {
  server_->Get(pattern, [this, handler = std::move(handler)](const httplib::Request& raw,
                                                             httplib::Response& res) {
    InFlight in_flight(metrics_.http_in_flight);
    WriteResponse(Dispatch(handler, Access::kPublic, MakeRequest(raw)), res);
  });
}

void HttpServer::Post(const std::string& pattern, Access access, Handler handler) {
  server_->Post(pattern, WithBody(access, std::move(handler)));
}

void HttpServer::Put(const std::string& pattern, Access access, Handler handler) {
  server_->Put(pattern, WithBody(access, std::move(handler)));
}

HttpServer::BodyHandler HttpServer::WithBody(Access access, Handler handler) {
  return [this, access, handler = std::move(handler)](const httplib::Request& raw,
                                                      httplib::Response& res,
                                                      const httplib::ContentReader& reader) {
    InFlight in_flight(metrics_.http_in_flight);
    HttpRequest request = MakeRequest(raw);
    auto body = ReadBody(raw, reader, limits_.max_body_bytes);
    if (!body.ok())
      return WriteResponse(body.error(), res);
    request.body = std::move(body).value();
    WriteResponse(Dispatch(handler, access, request), res);
  };
}

Result<ListenAddress> HttpServer::Start(const ListenAddress& address) {
  ListenAddress bound = address;
  if (address.port == 0) {
    bound.port = server_->bind_to_any_port(address.host);
  } else if (!server_->bind_to_port(address.host, address.port)) {
    bound.port = -1;
  }
  if (bound.port <= 0) {
    return Status(StatusCode::kUnavailable,
                  "cannot listen on " + address.ToString() +
                      " (address in use, not an address of this machine, or no permission)");
  }
  listener_ = std::thread([this] { server_->listen_after_bind(); });
  // Wait for the accept loop: cpp-httplib's stop() does nothing before the loop runs, so a Stop
  // right after Start would otherwise leave the listener running forever.
  while (!server_->is_running())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return bound;
}

void HttpServer::Stop() {
  if (!listener_.joinable())
    return;
  server_->stop();
  listener_.join();  // returns once every handler running has answered
}

}  // namespace backplane::server
