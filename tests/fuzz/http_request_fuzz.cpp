// libFuzzer target for the HTTP transport's framing (server/http/request_framing.cpp): bytes as
// a client sends them on a connection, through the Beast parser set up as the server sets it up
// (header and body limits), the server's checks of each header and body (transfer coding, Host,
// Content-Length over the limit, chunked bodies), then the routing of each request's target
// (percent-decoding, the routes' patterns). Requests follow each other as pipelined requests do,
// until one is refused or asks to close. No socket: Beast's parser takes the bytes directly, as
// its read algorithms hand it what the socket gave, unconsumed bytes kept for the next call.
//
// Checked (a difference aborts with both readings on stderr): how the bytes arrive does not
// change what is served. The connection is read three times: all bytes in one read, one byte per
// read, three bytes per read. Each must hand on the same requests in the same order (method,
// target, decoded path, body, the routes matched and what they captured) and end the same way
// (refused with the same status and message, closed by a request, or at the end of the bytes),
// but for one legitimate difference: a request the client never finished may be refused early in
// one reading and waited for until the client leaves in another (see Same).
// Seeds: corpus/http_request; dictionary: http_request.dict.
#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

// The bytes a client sent, delivered `chunk` at a time as a socket's reads would hand them over;
// what the parser has not consumed stays buffered, as in Beast's read algorithms.
class Stream {
 public:
  Stream(std::string_view bytes, std::size_t chunk) : bytes_(bytes), chunk_(chunk) {}
  std::string_view Buffered() const { return bytes_.substr(consumed_, delivered_ - consumed_); }
  void Consume(std::size_t used) { consumed_ += used; }
  // The next read; false at the end of the stream.
  bool Deliver() {
    if (delivered_ == bytes_.size())
      return false;
    delivered_ = std::min(bytes_.size(), delivered_ + chunk_);
    return true;
  }
  bool AtEnd() const { return consumed_ == bytes_.size(); }

 private:
  std::string_view bytes_;
  std::size_t chunk_;
  std::size_t consumed_ = 0;
  std::size_t delivered_ = 0;
};

// Feeds what `stream` delivers to `parser` until `done` says it has what it needs, or the bytes
// end (the client stopped sending: end of stream, as the connection sees it). As Beast's read
// algorithms do: the parser gets every byte buffered, and after need_more it gets nothing until
// more bytes came. `at_least`: how many bytes to have buffered before each put, when the stream
// still has them.
template <typename Done>
boost::beast::error_code Feed(RequestParser& parser, Stream& stream, std::size_t at_least,
                              Done done) {
  boost::beast::error_code error;
  while (!done()) {
    const std::string_view buffered = stream.Buffered();
    if (buffered.size() < at_least && stream.Deliver())
      continue;
    std::size_t used = 0;
    error = http::error::need_more;
    if (!buffered.empty()) {
      error = {};
      used = parser.put(boost::asio::buffer(buffered.data(), buffered.size()), error);
      stream.Consume(used);
    }
    if (error == http::error::need_more) {
      if (stream.Deliver()) {
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

// Trap: Beast 1.74 asserts (BOOST_ASSERT, in builds without NDEBUG such as this one) when a chunked
// body's first chunk is its last ("0\r\n"), it has no end of trailers yet, and the next put
// holds fewer than 5 bytes: basic_parser::parse_chunk_header expects the CRLF of a chunk before
// it. Release builds read on correctly. So bodies are put 5 bytes at least (the split points still
// move a byte at a time); headers from the first byte.
constexpr std::size_t kHeaderBytesPerPut = 1;
constexpr std::size_t kBodyBytesPerPut = 5;

// What the server makes of a connection: each request handed on, one line each (as the handler
// sees it, with the route it matches), then how the connection ended.
struct Outcomes {
  std::vector<std::string> served;
  std::string ending;  // "refused <status> <message>", "left" (mid-request), "closed", "end"
};

Outcomes Serve(std::string_view bytes, std::size_t chunk) {
  static const HttpLimits limits = FuzzLimits();
  Outcomes outcomes;
  Stream stream(bytes, chunk);
  stream.Deliver();
  while (!stream.AtEnd()) {
    RequestParser parser;
    PrepareForHeader(parser, limits);
    auto error = Feed(parser, stream, kHeaderBytesPerPut, [&] { return parser.is_header_done(); });
    if (error == http::error::partial_message || error == http::error::end_of_stream)
      return outcomes.ending = "left", outcomes;  // the client left: nobody to answer
    if (auto refusal = CheckRequestHeader(error, parser, limits)) {
      outcomes.ending = "refused " + std::to_string(refusal->status) + " " + refusal->message;
      return outcomes;  // answered, then the connection closes
    }
    if (!parser.is_done()) {
      PrepareForBody(parser, limits);
      parser.eager(true);  // as http::read does: the whole body
      error = Feed(parser, stream, kBodyBytesPerPut, [&] { return parser.is_done(); });
      if (error == http::error::partial_message || error == http::error::end_of_stream)
        return outcomes.ending = "left", outcomes;
      if (auto refusal = CheckRequestBody(error, limits)) {
        outcomes.ending = "refused " + std::to_string(refusal->status) + " " + refusal->message;
        return outcomes;
      }
    }
    const auto message = parser.release();
    const auto target = message.target();
    const std::string path = DecodedPath(std::string_view(target.data(), target.size()));
    std::string outcome = std::string(message.method_string()) + " " + std::string(target) +
                          " -> " + path + " body " + std::to_string(message.body().size()) + ":" +
                          message.body();
    for (std::size_t i = 0; i < Routes().size(); ++i) {
      if (const auto captured = Routes()[i].Match(path)) {
        outcome += " route " + std::to_string(i);
        for (const std::string& part : *captured)
          outcome += " [" + part + "]";
      }
    }
    outcomes.served.push_back(std::move(outcome));
    if (!message.keep_alive())
      return outcomes.ending = "closed", outcomes;
  }
  return outcomes.ending = "end", outcomes;
}

// The same, but for an incomplete request at the end: Beast may find an error in a header or a
// chunked body before it is complete when it has more of it at once (a duplicate Content-Length
// with the header's end not yet read), so a request the client never finished may be refused
// in one reading and waited for, until the client leaves, in another. Either way it is not
// served and the connection closes.
bool Same(const Outcomes& a, const Outcomes& b) {
  if (a.served != b.served)
    return false;
  auto refused = [](const std::string& ending) { return ending.starts_with("refused "); };
  return a.ending == b.ending || (a.ending == "left" && refused(b.ending)) ||
         (refused(a.ending) && b.ending == "left");
}

std::string Show(const Outcomes& outcomes) {
  std::string text;
  for (const std::string& outcome : outcomes.served)
    text += "  " + outcome + "\n";
  return text + "  then " + outcomes.ending + "\n";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const auto whole = Serve(bytes, bytes.size());
  // Byte by byte: every split a slow client or a small socket read can make. Three at a time:
  // splits inside CRLF pairs and chunk-size lines that are not at every byte.
  for (const std::size_t chunk : {std::size_t{1}, std::size_t{3}}) {
    const auto split = Serve(bytes, chunk);
    if (!Same(whole, split)) {
      std::fprintf(stderr,
                   "http_request_fuzz: the same bytes give other requests when they arrive %zu "
                   "byte(s) at a time:\nin one read:\n%s%zu at a time:\n%s",
                   chunk, Show(whole).c_str(), chunk, Show(split).c_str());
      std::abort();
    }
  }
  return 0;
}
