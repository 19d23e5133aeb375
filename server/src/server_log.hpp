// The server's logger, "backplane.server", beside the library's backplane.loader,
// backplane.registry and backplane.runtime. It copies the sinks of spdlog's default logger on
// first use: main() installs the stderr logger before anything logs.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>

namespace backplane::server {

inline const std::shared_ptr<spdlog::logger>& Log() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    if (auto existing = spdlog::get("backplane.server"))
      return existing;
    auto created = spdlog::default_logger()->clone("backplane.server");
    spdlog::register_logger(created);
    return created;
  }();
  return logger;
}

}  // namespace backplane::server
