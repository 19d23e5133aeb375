// The loader module's logger, "backplane.loader" (private to loader/src).
#pragma once

#include "backplane/loader/logging.hpp"

namespace backplane::loader {

inline const std::shared_ptr<spdlog::logger>& Log() {
  // Never destroyed: the reaper thread may still log while static destructors run at exit.
  static const auto& logger =
      *new std::shared_ptr<spdlog::logger>(ModuleLogger("backplane.loader"));
  return logger;
}

}  // namespace backplane::loader
