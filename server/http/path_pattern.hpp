// Routing of the HTTP transport: request targets to decoded paths, and the segment patterns
// routes are registered with (HttpServer::Get). Value types, thread-compatible.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::server {

// The path of a request target: the query cut off, %XX decoded (routes match decoded paths). A
// malformed escape is kept as it is.
std::string DecodedPath(std::string_view target);

// A route's path pattern: "/v2/models/{}[/versions/{}]/infer". "{}" captures one non-empty
// segment; one "[...]" part may be absent. Matched segment by segment, with no backtracking: a
// request's cost is the number of its segments.
class PathPattern {
 public:
  explicit PathPattern(std::string_view pattern);

  // The captured segments (one per "{}" of the whole pattern, "" for those of an absent part),
  // or nullopt when `path` is not one of the pattern's.
  std::optional<std::vector<std::string>> Match(std::string_view path) const;

 private:
  // The pattern with its optional part, and without it.
  std::vector<std::vector<std::string>> variants_;
  std::size_t captures_ = 0;
};

}  // namespace backplane::server
