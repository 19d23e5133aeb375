// The framing rules of the HTTP transport apart from its sockets: how a request's parser is set
// up (the limits it reads under) and the answer to what it parsed, for the parts Beast leaves to
// the server. The connection (http_server.cpp) applies them to what it reads from a socket;
// tests/fuzz/http_request_fuzz.cpp applies them to bytes. Pure functions, thread-compatible.
#pragma once

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "http/http_server.hpp"

namespace backplane::server {

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// An error of the transport: answered with `status` and `message`, then the connection closes.
struct FramingRefusal {
  int status = 400;
  std::string message;
};

// Before the header: the request line and headers may take limits.max_header_bytes; the body's
// limit is lifted until CheckRequestHeader has seen Content-Length (for a 413 that names it).
void PrepareForHeader(RequestParser& parser, const HttpLimits& limits);

// The answer to a header as the parser left it: `error` is the parser's (none, or one of
// boost::beast::http::error; a transport error such as a timeout or end of stream is the
// caller's). A refusal for Beast's own findings (header over the limit 431, malformed or
// conflicting Content-Length 400, repeated Transfer-Encoding 400, any other malformed header
// 400) and for ours: a transfer coding other than chunked (501), an HTTP/1.1 request without
// exactly one Host or any request with an invalid one (400), a Content-Length over
// limits.max_body_bytes (413). nullopt: read the body under PrepareForBody.
std::optional<FramingRefusal> CheckRequestHeader(boost::beast::error_code error,
                                                 const RequestParser& parser,
                                                 const HttpLimits& limits);

// A Host header's value as RFC 9112 3.2 has it: uri-host [ ":" port ] of RFC 3986, that is a
// reg-name (an IPv4 address is one), an IPv6 address or IPvFuture in brackets; never empty (an
// "http" URI has a host, RFC 9110 4.2.1), no space or control character.
bool IsValidHostHeader(std::string_view value);

// After an accepted header: the body (Content-Length or chunked) may take max_body_bytes.
void PrepareForBody(RequestParser& parser, const HttpLimits& limits);

// The answer to a body as the parser left it (`error` as for CheckRequestHeader): over the limit
// 413, malformed (a bad chunk) 400; nullopt when it is complete.
std::optional<FramingRefusal> CheckRequestBody(boost::beast::error_code error,
                                               const HttpLimits& limits);

}  // namespace backplane::server
