#include "config/config_json.hpp"

#include <string>

namespace backplane::server {

Result<nlohmann::json> ParseConfigJson(std::string_view text, std::string_view what,
                                       bool comments) {
  using nlohmann::json;
  // The callback sees every value with its depth; past the limit it discards the value, so the
  // document kept never nests deeper than the limit while the parser walks the rest.
  bool too_deep = false;
  const json::parser_callback_t limit_depth = [&too_deep](int depth, json::parse_event_t, json&) {
    if (depth > kMaxConfigJsonDepth)
      too_deep = true;
    return !too_deep;
  };
  json document = json::parse(text, limit_depth, /*allow_exceptions=*/false, comments);
  if (too_deep) {
    return InvalidArgument(std::string(what) + " nests JSON deeper than " +
                           std::to_string(kMaxConfigJsonDepth) +
                           " levels (a config file needs 3 at most)");
  }
  if (document.is_discarded())
    return InvalidArgument(std::string(what) + " is not valid JSON");
  return document;
}

}  // namespace backplane::server
