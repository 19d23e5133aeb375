// One named spdlog logger per module ("backplane.loader", "backplane.registry", ...), sharing the
// default logger's sinks so that an embedder redirects everything by replacing the default logger.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace backplane {

// Thread-safe. Created on first use; the level follows spdlog's global level.
std::shared_ptr<spdlog::logger> ModuleLogger(const std::string& name);

}  // namespace backplane
