// libFuzzer target for the `backplane serve` config file (server/config/server_config.cpp): any
// text must give a config or an error naming the file, never a crash or a hang. Checked (a
// difference aborts):
//  - an error names the file;
//  - an accepted config renders back (ConfigToJson, what `serve --check-config` prints) as a JSON
//    object that, less its null keys (defaults that have no value of their own) and admin_token
//    (shown as "(set)", never in clear), applied over the defaults from the same file name,
//    is accepted and gives the same config: its rendering is the same once the admin token is
//    carried over. The rendering shows every field, so the same rendering is the same value.
// Seeds: corpus/server_config; dictionary: server_config.dict (every key).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "config/server_config.hpp"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "server_config_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace backplane::server;
  constexpr const char* kFile = "/fuzz/serve.json";
  ServeConfig config = DefaultServeConfig();
  const backplane::Status applied =
      ApplyConfigText(std::string_view(reinterpret_cast<const char*>(data), size), kFile, config);
  if (!applied.ok()) {
    if (applied.message().find(kFile) == std::string::npos)
      Fail("the error does not name the file:", applied.ToString());
    return 0;
  }
  const std::string rendered = ConfigToJson(config);
  auto document = nlohmann::json::parse(rendered, nullptr, /*allow_exceptions=*/false);
  if (!document.is_object())
    Fail("the rendering is no JSON object:", rendered);

  nlohmann::json file = nlohmann::json::object();
  for (const auto& [key, value] : document.items()) {
    if (!value.is_null() && key != "admin_token")
      file[key] = value;
  }
  ServeConfig again = DefaultServeConfig();
  const backplane::Status reapplied = ApplyConfigText(file.dump(), kFile, again);
  if (!reapplied.ok())
    Fail("the rendering, applied again, is refused:", reapplied.ToString() + "\n" + file.dump(2));
  again.admin_token = config.admin_token;
  const std::string rendered_again = ConfigToJson(again);
  if (rendered_again != rendered)
    Fail("the rendering, applied again, gives another config:",
         "first:\n" + rendered + "\nagain:\n" + rendered_again);
  return 0;
}
