// libFuzzer target for the HTTP transport's framing (server/http/request_framing.cpp): bytes as
// a client sends them on a connection, through the Beast parser set up as the server sets it up
// (header and body limits), the server's checks of each header and body (transfer coding, Host,
// Content-Length over the limit, chunked bodies), then the routing of each request's target
// (percent-decoding, the routes' patterns). Requests follow each other as pipelined requests do,
// until one is refused or asks to close. No socket: Beast's parser takes the bytes directly, as
// its read algorithms hand it what the socket gave. Seeds: corpus/http_request; dictionary:
// http_request.dict.
#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "http/path_pattern.hpp"
#include "http/request_framing.hpp"

namespace {

using namespace backplane::server;
namespace http = boost::beast::http;

// The server's route patterns (rest_routes.cpp, admin_api.cpp): matching is ours.
const std::vector<PathPattern>& Routes() {
  static const std::vector<PathPattern> routes = [] {
    std::vector<PathPattern> patterns;
    for (const char* pattern :
         {"/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/{}[/versions/{}]",
          "/v2/models/{}[/versions/{}]/ready", "/v2/models/{}[/versions/{}]/infer",
          "/v2/models/{}[/versions/{}]/placement", "/v2/repository/index",
          "/v2/repository/models/{}/load", "/v2/repository/models/{}/unload", "/v2/backends",
          "/v2/backends/{}", "/v2/backends/{}/rollback", "/metrics"}) {
      patterns.emplace_back(pattern);
    }
    return patterns;
  }();
  return routes;
}

// Small limits, so that the fuzzer reaches them with small inputs.
HttpLimits FuzzLimits() {
  HttpLimits limits;
  limits.max_header_bytes = 1024;
  limits.max_body_bytes = 4096;
  return limits;
}

// Feeds `rest` to `parser` until `done` says it has what it needs, or the bytes end (the client
// stopped sending: end of stream, as the connection sees it). Consumes what the parser took.
template <typename Done>
boost::beast::error_code Feed(RequestParser& parser, std::string_view& rest, Done done) {
  boost::beast::error_code error;
  while (!done()) {
    const std::size_t used = parser.put(boost::asio::buffer(rest.data(), rest.size()), error);
    rest.remove_prefix(used);
    if (error == http::error::need_more) {
      if (!rest.empty() && used > 0) {
        error = {};
        continue;
      }
      parser.put_eof(error);
      if (!error)  // a body delimited by the end of the stream; requests have none
        error = http::error::partial_message;
      return error;
    }
    if (error || used == 0)
      return error;
  }
  return error;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const HttpLimits limits = FuzzLimits();
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  volatile std::size_t sink = 0;
  while (!rest.empty()) {
    RequestParser parser;
    PrepareForHeader(parser, limits);
    auto error = Feed(parser, rest, [&] { return parser.is_header_done(); });
    if (error == http::error::partial_message || error == http::error::end_of_stream)
      return 0;  // the client left: nobody to answer
    if (auto refusal = CheckRequestHeader(error, parser, limits)) {
      sink = sink + refusal->message.size();
      return 0;  // answered, then the connection closes
    }
    if (!parser.is_done()) {
      PrepareForBody(parser, limits);
      parser.eager(true);  // as http::read does: the whole body
      error = Feed(parser, rest, [&] { return parser.is_done(); });
      if (error == http::error::partial_message || error == http::error::end_of_stream)
        return 0;
      if (auto refusal = CheckRequestBody(error, limits)) {
        sink = sink + refusal->message.size();
        return 0;
      }
    }
    const auto message = parser.release();
    const auto target = message.target();
    const std::string path = DecodedPath(std::string_view(target.data(), target.size()));
    for (const auto& route : Routes()) {
      if (const auto captured = route.Match(path))
        sink = sink + captured->size();
    }
    sink = sink + message.body().size();
    if (!message.keep_alive())
      return 0;
  }
  return 0;
}
