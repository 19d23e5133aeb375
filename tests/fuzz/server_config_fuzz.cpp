// libFuzzer target for the `backplane serve` config file (server/config/server_config.cpp): any
// text must give a config or an error naming the file (checked), never a crash or a hang; an
// accepted config renders back (`serve --check-config`) as a JSON object (checked). Not as a file
// that gives the same config again: the rendering describes some keys (backend_isolation, a set
// admin_token) rather than repeating them. Seeds: corpus/server_config; dictionary:
// server_config.dict (every key).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "config/server_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace backplane::server;
  ServeConfig config = DefaultServeConfig();
  const backplane::Status applied = ApplyConfigText(
      std::string_view(reinterpret_cast<const char*>(data), size), "/fuzz/serve.json", config);
  if (!applied.ok()) {
    if (applied.message().find("/fuzz/serve.json") == std::string::npos) {
      std::fprintf(stderr, "the error does not name the file: %s\n", applied.ToString().c_str());
      std::abort();
    }
    return 0;
  }
  const std::string rendered = ConfigToJson(config);
  const auto document = nlohmann::json::parse(rendered, nullptr, /*allow_exceptions=*/false);
  if (!document.is_object()) {
    std::fprintf(stderr, "the rendering is no JSON object:\n%s\n", rendered.c_str());
    std::abort();
  }
  return 0;
}
