// libFuzzer target for a model's config.json in the model repository
// (server/serving/model_repository.cpp): any text must give a config or an error naming the file
// (checked), never a crash or a hang. Seeds: corpus/model_config (the example models' files);
// dictionary: model_config.dict.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "serving/model_repository.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace backplane::server;
  auto config = ParseModelConfigText(std::string_view(reinterpret_cast<const char*>(data), size),
                                     "/fuzz/model/config.json");
  if (!config.ok() &&
      config.error().message().find("/fuzz/model/config.json") == std::string::npos) {
    std::fprintf(stderr, "the error does not name the file: %s\n",
                 config.error().ToString().c_str());
    std::abort();
  }
  volatile std::size_t sink =
      config.ok() ? config->backends.size() + config->version_policy.versions.size() : 0;
  (void)sink;
  return 0;
}
