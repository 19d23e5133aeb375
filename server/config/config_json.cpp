#include "config/config_json.hpp"

#include <string>

namespace backplane::server {

Result<nlohmann::json> ParseConfigJson(std::string_view text, std::string_view what,
                                       bool comments) {
  using nlohmann::json;
  // The callback sees every value with its depth. Past the limit it throws, which ends the parse
  // there: returning false would only discard the value while the parser walked on through the
  // rest (a million-deep file took seconds). The exception never leaves this function.
  struct TooDeep {};
  const json::parser_callback_t limit_depth = [](int depth, json::parse_event_t, json&) {
    if (depth > kMaxConfigJsonDepth)
      throw TooDeep{};
    return true;
  };
  json document;
  try {
    document = json::parse(text, limit_depth, /*allow_exceptions=*/false, comments);
  } catch (const TooDeep&) {
    return InvalidArgument(std::string(what) + " nests JSON deeper than " +
                           std::to_string(kMaxConfigJsonDepth) +
                           " levels (a config file needs 3 at most)");
  }
  if (document.is_discarded())
    return InvalidArgument(std::string(what) + " is not valid JSON");
  return document;
}

}  // namespace backplane::server
