// The HTTP transport's values: responses, the status for a failed Status, JSON bodies read
// within a nesting limit, and the limits taken from the server's configuration.
#include "http/http_server.hpp"
#include "http/json_depth.hpp"

#include "backplane/core/quoted.hpp"

namespace backplane::server {
using nlohmann::json;

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
      return 400;
    case StatusCode::kUnimplemented:
      return 501;  // as gRPC's UNIMPLEMENTED maps to HTTP: the two transports answer alike
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

namespace {

// nlohmann's message without its "[json.exception...] " prefix, the token it quotes ("last read:
// '...'", "number overflow parsing '...'") bounded as Quoted bounds it: a 1 MiB literal or
// number would otherwise come back whole.
std::string JsonErrorMessage(const std::string& what) {
  const auto start = what.find("] ");
  std::string message = start == std::string::npos ? what : what.substr(start + 2);
  const auto open = message.find('\'');
  const auto close = message.rfind('\'');
  if (open == std::string::npos || close <= open)
    return message;
  return message.substr(0, open) +
         Quoted(std::string_view(message).substr(open + 1, close - open - 1)) +
         message.substr(close + 1);
}

}  // namespace

Result<json> ParseJsonBody(std::string_view body, int max_depth) {
  BACKPLANE_RETURN_IF_ERROR(CheckJsonDepth(body, max_depth));
  if (body.empty())
    return InvalidArgument("malformed JSON: the request body is empty");
  try {
    return json::parse(body);
  } catch (const json::out_of_range& e) {
    // A number beyond double's range ("1e400"): nlohmann throws out_of_range 406, "number
    // overflow parsing '1e400'". A bad request, not a server error; name the token and where.
    const std::string what = e.what();
    std::string message = JsonErrorMessage(what);
    const auto quote = what.find('\'');
    if (quote != std::string::npos) {
      const auto token = what.substr(quote + 1, what.rfind('\'') - quote - 1);
      const auto at = body.find(token);
      if (!token.empty() && at != std::string_view::npos)
        message += " at byte " + std::to_string(at);
    }
    return InvalidArgument("malformed JSON: " + message);
  } catch (const json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." → from "parse".
    return InvalidArgument("malformed JSON: " + JsonErrorMessage(e.what()));
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("malformed JSON: ") + e.what());
  }
}

HttpLimits HttpLimitsFrom(const ServeConfig& config) {
  return {.io_threads = config.io_threads,
          .threads = config.http_threads,
          .max_body_bytes = config.max_body_bytes,
          .max_buffered_body_bytes = config.max_buffered_body_bytes,
          .max_header_bytes = config.max_header_bytes,
          .max_json_depth = config.max_json_depth,
          .header_timeout = config.header_timeout,
          .read_timeout = config.read_timeout,
          .write_timeout = config.write_timeout,
          .request_timeout = config.request_timeout,
          .keep_alive_timeout = config.keep_alive_timeout,
          .keep_alive_max_requests = config.keep_alive_max_requests,
          .max_connections = config.max_connections,
          .listen_backlog = config.listen_backlog};
}

}  // namespace backplane::server
