// libFuzzer target for the `backplane serve` config file (server/config/server_config.cpp): any
// text must give a config or an error naming the file and the key, never a crash or a hang; an
// accepted config renders back (`serve --check-config`). Seeds: corpus/server_config; dictionary:
// server_config.dict (every key).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "config/server_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace backplane::server;
  ServeConfig config = DefaultServeConfig();
  const backplane::Status applied = ApplyConfigText(
      std::string_view(reinterpret_cast<const char*>(data), size), "/fuzz/serve.json", config);
  volatile std::size_t sink = applied.ok() ? ConfigToJson(config).size() : applied.message().size();
  (void)sink;
  return 0;
}
