// The loader module's logger, "backplane.loader" (private to loader/src).
#pragma once

#include "backplane/core/logging.hpp"

namespace backplane::loader {

inline spdlog::logger& Log() {
  static spdlog::logger& logger = ModuleLogger("backplane.loader");
  return logger;
}

}  // namespace backplane::loader
