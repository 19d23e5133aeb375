// libFuzzer target for a model's config.json in the model repository
// (server/serving/model_repository.cpp): any text must give a config or an error naming the file,
// never a crash or a hang. Checked (a difference aborts):
//  - an error names the file;
//  - an accepted config renders back and parses to the same value. The product has no renderer
//    of a whole ModelConfig (the admin API and the repository index show parts of it), so this
//    file has one: every field, in the form ParseModelConfig documents ({"latest": N},
//    {"all": true}, {"specific": [...]}; dynamic_batching's three keys). ParseModelConfigText of
//    its text must accept it and give an equal ModelConfig (operator==);
//  - the value depends on the JSON value only, not on how it is spelled: the accepted text,
//    re-serialised by nlohmann (sorted keys, no spaces, non-ASCII escaped as \uXXXX), parses to
//    an equal ModelConfig too.
// Seeds: corpus/model_config (the example models' files); dictionary: model_config.dict.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "serving/model_repository.hpp"

namespace {

using namespace backplane::server;
using nlohmann::json;

constexpr const char* kFile = "/fuzz/model/config.json";

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "model_config_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

json Render(const ModelConfig& config) {
  json object = json::object();
  object["backends"] = config.backends;
  object["max_in_flight"] = config.max_in_flight;
  object["instances"] = config.instances;
  switch (config.version_policy.kind) {
    case VersionPolicy::Kind::kLatest:
      object["version_policy"] = {{"latest", config.version_policy.latest}};
      break;
    case VersionPolicy::Kind::kAll:
      object["version_policy"] = {{"all", true}};
      break;
    case VersionPolicy::Kind::kSpecific:
      object["version_policy"] = {{"specific", config.version_policy.versions}};
      break;
  }
  object["max_batch_size"] = config.max_batch_size;
  if (config.dynamic_batching) {
    object["dynamic_batching"] = {
        {"max_queue_delay_us", config.dynamic_batching->max_queue_delay_us},
        {"preferred_batch_sizes", config.dynamic_batching->preferred_batch_sizes},
        {"preserve_ordering", config.dynamic_batching->preserve_ordering}};
  }
  object["backend_options"] = json::object();
  for (const auto& [id, values] : config.backend_options)
    object["backend_options"][id] = values;
  return object;
}

// `text` must parse to `expected`.
void ExpectSame(const char* what, const std::string& text, const ModelConfig& expected,
                const std::string& first) {
  auto again = ParseModelConfigText(text, kFile);
  if (!again.ok())
    Fail(what, "refused: " + again.error().ToString() + "\nfirst: " + first + "\nagain: " + text);
  if (!(*again == expected))
    Fail(what, "another config: " + Render(*again).dump() + "\nfirst: " + Render(expected).dump() +
                   "\ntext: " + text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = ParseModelConfigText(text, kFile);
  if (!config.ok()) {
    if (config.error().message().find(kFile) == std::string::npos)
      Fail("the error does not name the file:", config.error().ToString());
    return 0;
  }
  const std::string first(text);
  ExpectSame("the rendered config, parsed again, is", Render(*config).dump(), *config, first);
  // The text was accepted, so nlohmann reads it (the parser under ParseModelConfigText).
  const json document = json::parse(text);
  ExpectSame("the text re-serialised, parsed again, is",
             document.dump(-1, ' ', /*ensure_ascii=*/true), *config, first);
  return 0;
}
