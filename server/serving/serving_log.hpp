// The server's logger, "backplane.server", beside the library's module loggers. main() installs
// the stderr logger before anything logs, so it gets that logger's sinks.
#pragma once

#include "backplane/core/logging.hpp"

namespace backplane::server {

inline spdlog::logger& Log() {
  static spdlog::logger& logger = ModuleLogger("backplane.server");
  return logger;
}

}  // namespace backplane::server
