#include "http/path_pattern.hpp"

#include <cassert>

namespace backplane::server {

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

// "/a/b" → {"a", "b"}; "/" → {""}; "/a/" → {"a", ""}.
std::vector<std::string_view> Segments(std::string_view path) {
  std::vector<std::string_view> segments;
  if (path.starts_with('/'))
    path.remove_prefix(1);
  for (std::size_t start = 0;;) {
    const auto slash = path.find('/', start);
    segments.push_back(path.substr(start, slash - start));
    if (slash == std::string_view::npos)
      return segments;
    start = slash + 1;
  }
}

std::vector<std::string> OwnedSegments(std::string_view pattern) {
  std::vector<std::string> segments;
  for (std::string_view segment : Segments(pattern))
    segments.emplace_back(segment);
  return segments;
}

}  // namespace

std::string DecodedPath(std::string_view target) {
  target = target.substr(0, target.find('?'));
  std::string path;
  path.reserve(target.size());
  for (std::size_t i = 0; i < target.size(); ++i) {
    if (target[i] == '%' && i + 2 < target.size() && HexValue(target[i + 1]) >= 0 &&
        HexValue(target[i + 2]) >= 0) {
      path.push_back(static_cast<char>(HexValue(target[i + 1]) * 16 + HexValue(target[i + 2])));
      i += 2;
    } else {
      path.push_back(target[i]);
    }
  }
  return path;
}

PathPattern::PathPattern(std::string_view pattern) {
  const auto open = pattern.find('[');
  if (open == std::string_view::npos) {
    variants_.push_back(OwnedSegments(pattern));
  } else {
    const auto close = pattern.find(']', open);
    assert(close != std::string_view::npos && "unclosed [ in a route pattern");
    const std::string head(pattern.substr(0, open));
    const std::string optional(pattern.substr(open + 1, close - open - 1));
    const std::string tail(pattern.substr(close + 1));
    variants_.push_back(OwnedSegments(head + optional + tail));
    variants_.push_back(OwnedSegments(head + tail));
  }
  // Counted on the longer variant: a capture of an absent part is still a place in params.
  for (const auto& segment : variants_.front())
    captures_ += segment == "{}" ? 1 : 0;
}

std::optional<std::vector<std::string>> PathPattern::Match(std::string_view path) const {
  const std::vector<std::string_view> segments = Segments(path);
  for (const auto& variant : variants_) {
    if (variant.size() != segments.size())
      continue;
    std::vector<std::string> captured;
    bool matches = true;
    for (std::size_t i = 0; matches && i < variant.size(); ++i) {
      if (variant[i] != "{}")
        matches = variant[i] == segments[i];
      else if ((matches = !segments[i].empty()))
        captured.emplace_back(segments[i]);
    }
    if (matches) {
      captured.resize(captures_);
      return captured;
    }
  }
  return std::nullopt;
}

}  // namespace backplane::server
