// The runtime module's logger, "backplane.runtime" (private to runtime/src).
#pragma once

#include "backplane/core/logging.hpp"

namespace backplane {

inline spdlog::logger& RuntimeLog() {
  static spdlog::logger& logger = ModuleLogger("backplane.runtime");
  return logger;
}

}  // namespace backplane
