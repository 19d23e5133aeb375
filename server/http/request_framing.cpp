#include "http/request_framing.hpp"

#include <arpa/inet.h>
#include <boost/beast/core/string.hpp>

#include <boost/beast/http/error.hpp>
#include <cstdint>
#include <limits>
#include <string_view>

#include "backplane/core/quoted.hpp"

namespace backplane::server {
namespace http = boost::beast::http;
namespace {

// Beast 1.74's string_view is Boost's.
std::string_view View(boost::beast::string_view text) {
  return {text.data(), text.size()};
}

bool IsDecimalDigit(char c) {
  return c >= '0' && c <= '9';
}

bool IsHexDigit(char c) {
  return IsDecimalDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// RFC 3986 2.3 unreserved and 2.2 sub-delims: what a reg-name holds besides pct-encoded octets.
bool IsRegNameChar(char c) {
  return IsDecimalDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         std::string_view("-._~!$&'()*+,;=").find(c) != std::string_view::npos;
}

// RFC 3986 3.2.2 reg-name (an IPv4 address is one too), not empty: RFC 9110 4.2.1 has an "http"
// URI with an empty host rejected as invalid.
bool IsRegName(std::string_view name) {
  if (name.empty())
    return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '%') {
      if (i + 2 >= name.size() || !IsHexDigit(name[i + 1]) || !IsHexDigit(name[i + 2]))
        return false;
      i += 2;
    } else if (!IsRegNameChar(name[i])) {
      return false;
    }
  }
  return true;
}

// RFC 3986 3.2.2 IP-literal without its brackets: an IPv6 address or "v" 1*HEXDIG "." 1*(...).
bool IsIpLiteral(std::string_view literal) {
  if (!literal.empty() && (literal[0] == 'v' || literal[0] == 'V')) {
    const std::size_t dot = literal.find('.');
    if (dot == std::string_view::npos || dot < 2 || dot + 1 == literal.size())
      return false;
    for (std::size_t i = 1; i < dot; ++i) {
      if (!IsHexDigit(literal[i]))
        return false;
    }
    for (const char c : literal.substr(dot + 1)) {
      if (!IsRegNameChar(c) && c != ':')
        return false;
    }
    return true;
  }
  // inet_pton wants a terminated string; the longest IPv6 text is 45 characters.
  char text[INET6_ADDRSTRLEN] = {};
  if (literal.size() >= sizeof text)
    return false;
  literal.copy(text, literal.size());
  in6_addr address;
  return inet_pton(AF_INET6, text, &address) == 1;
}

// RFC 3986 3.2.3 port: digits, here at most 65535 (an empty port is allowed, as the RFC says).
bool IsPort(std::string_view port) {
  if (port.size() > 5)
    return false;
  unsigned value = 0;
  for (const char c : port) {
    if (!IsDecimalDigit(c))
      return false;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  return value <= 65535;
}

}  // namespace

bool IsValidHostHeader(std::string_view value) {
  std::string_view host = value;
  std::string_view port;
  if (!value.empty() && value.front() == '[') {
    const std::size_t close = value.find(']');
    if (close == std::string_view::npos || !IsIpLiteral(value.substr(1, close - 1)))
      return false;
    const std::string_view rest = value.substr(close + 1);
    if (rest.empty())
      return true;
    return rest.front() == ':' && IsPort(rest.substr(1));
  }
  // A reg-name holds no ':', so the first one starts the port.
  if (const std::size_t colon = value.find(':'); colon != std::string_view::npos) {
    host = value.substr(0, colon);
    port = value.substr(colon + 1);
    if (!IsPort(port))
      return false;
  }
  return IsRegName(host);
}

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
      return FramingRefusal{501, "transfer coding " + Quoted(View(coding->value())) +
                                     " is not supported (only chunked)"};
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
  // RFC 9112 3.2: "a Host header field with an invalid field value" is a 400 too, in any version.
  if (const auto host = header.find(http::field::host);
      host != header.end() && !IsValidHostHeader(View(host->value()))) {
    return FramingRefusal{400, "invalid Host header " + Quoted(View(host->value())) +
                                   ": a host name, an IPv4 address or a bracketed IPv6 address, "
                                   "with an optional :port (RFC 9112 3.2, RFC 3986 3.2.2)"};
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
