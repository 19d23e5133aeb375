// The JSON nesting limit, checked on the text before any parser runs: a body of a million '['
// would otherwise cost a million parser frames (nlohmann's DOM and SAX parsers alike recurse).
#pragma once

#include <string>
#include <string_view>

#include "backplane/core/status.hpp"

namespace backplane::server {

// The refusal of a container opened at `byte` past `max_depth` levels: one message for this
// check and for the infer body's reader (json_events.cpp), which counts as it reads.
inline Status NestedTooDeep(int max_depth, std::size_t byte) {
  return InvalidArgument("malformed JSON: nested deeper than " + std::to_string(max_depth) +
                         " levels at byte " + std::to_string(byte) + " (max_json_depth)");
}

// Refuses nesting deeper than `max_depth` before anything is parsed: counted outside strings
// (a string's brackets do not count, escaped quotes do not end it). Invalid JSON is left to the
// parser.
inline Status CheckJsonDepth(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
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
      if (++depth > max_depth)
        return NestedTooDeep(max_depth, i);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return Status::Ok();
}

}  // namespace backplane::server
