// The isolation module's logger, "backplane.isolation" (private to isolation/src).
#pragma once

#include "backplane/core/logging.hpp"

namespace backplane::isolation {

inline spdlog::logger& IsolationLog() {
  static spdlog::logger& logger = ModuleLogger("backplane.isolation");
  return logger;
}

}  // namespace backplane::isolation
