// The registry module's logger, "backplane.registry" (private to registry/src).
#pragma once

#include "backplane/core/logging.hpp"

namespace backplane::registry_detail {

inline spdlog::logger& Log() {
  static spdlog::logger& logger = ModuleLogger("backplane.registry");
  return logger;
}

}  // namespace backplane::registry_detail
