// The loader module's logger, "backplane.loader" (private to loader/src).
#pragma once

#include "backplane/loader/logging.hpp"

namespace backplane::loader {

inline const std::shared_ptr<spdlog::logger>& Log() {
  static const auto logger = ModuleLogger("backplane.loader");
  return logger;
}

}  // namespace backplane::loader
