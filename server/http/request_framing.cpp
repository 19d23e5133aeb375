#include "http/request_framing.hpp"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <cstdint>
#include <limits>

namespace backplane::server {
namespace http = boost::beast::http;

void PrepareForHeader(RequestParser& parser, const HttpLimits& limits) {
  parser.header_limit(
      static_cast<std::uint32_t>(std::min<std::size_t>(limits.max_header_bytes, UINT32_MAX)));
  // Not boost::none: Beast 1.74 compares the length with the optional, and none is less than
  // every length.
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
}

std::optional<FramingRefusal> CheckRequestHeader(boost::beast::error_code error,
                                                 const RequestParser& parser,
                                                 const HttpLimits& limits) {
  if (error == http::error::header_limit) {
    return FramingRefusal{431, "request headers exceed the limit of " +
                                   std::to_string(limits.max_header_bytes) +
                                   " bytes (max_header_bytes)"};
  }
  if (error == http::error::bad_content_length) {
    return FramingRefusal{400,
                          "malformed or conflicting Content-Length (or Content-Length with "
                          "Transfer-Encoding)"};
  }
  if (error == http::error::bad_transfer_encoding)
    return FramingRefusal{400, "Transfer-Encoding repeated or sent with Content-Length"};
  if (error)
    return FramingRefusal{400, "malformed request: " + error.message()};

  const auto& header = parser.get();
  // RFC 9112 6.1: a request whose transfer coding the server does not understand cannot be
  // framed: refuse it rather than read its body as the next request (Beast would take a request
  // with `Transfer-Encoding: gzip` as bodiless).
  const auto coding = header.find(http::field::transfer_encoding);
  if (coding != header.end()) {
    if (!boost::beast::iequals(coding->value(), "chunked")) {
      return FramingRefusal{501, "transfer coding '" + std::string(coding->value()) +
                                     "' is not supported (only chunked)"};
    }
    if (header.count(http::field::transfer_encoding) > 1)
      return FramingRefusal{400, "Transfer-Encoding repeated"};
  }
  // RFC 9112 3.2: an HTTP/1.1 request carries exactly one Host header, and a server answers 400
  // to one that does not.
  if (header.version() >= 11 && header.count(http::field::host) != 1) {
    return FramingRefusal{400, header.count(http::field::host) == 0
                                   ? "an HTTP/1.1 request needs a Host header (RFC 9112 3.2)"
                                   : "Host header repeated (RFC 9112 3.2)"};
  }
  if (const auto length = parser.content_length(); length && *length > limits.max_body_bytes) {
    return FramingRefusal{
        413, "request body of " + std::to_string(*length) + " bytes exceeds the limit of " +
                 std::to_string(limits.max_body_bytes) + " bytes (max_body_bytes)"};
  }
  return std::nullopt;
}

void PrepareForBody(RequestParser& parser, const HttpLimits& limits) {
  parser.body_limit(limits.max_body_bytes);
}

std::optional<FramingRefusal> CheckRequestBody(boost::beast::error_code error,
                                               const HttpLimits& limits) {
  if (error == http::error::body_limit) {
    return FramingRefusal{413, "request body exceeds the limit of " +
                                   std::to_string(limits.max_body_bytes) +
                                   " bytes (max_body_bytes)"};
  }
  if (error)
    return FramingRefusal{400, "malformed request body: " + error.message()};
  return std::nullopt;
}

}  // namespace backplane::server
