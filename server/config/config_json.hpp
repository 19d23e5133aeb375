// The JSON of configuration files (the serve config file, a model's config.json), parsed with a
// nesting limit. Such a file nests three levels at most; without a limit, a file of a million
// '[' parses (nlohmann's parser keeps its stack on the heap) but every later dump() of the value,
// as error messages do, recurses once per level and overflows the stack.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "backplane/core/status.hpp"

namespace backplane::server {

// Deeper than any config file needs (3), far below what a dump() of the value could overflow.
inline constexpr int kMaxConfigJsonDepth = 16;

// The document of `text`; `what` starts every message ("config file /etc/serve.json").
// kInvalidArgument "<what> is not valid JSON" or "<what> nests JSON deeper than 16 levels ...".
// `comments`: allow // and /* */ comments (the serve config file does).
Result<nlohmann::json> ParseConfigJson(std::string_view text, std::string_view what, bool comments);

}  // namespace backplane::server
