// One named spdlog logger per module ("backplane.loader", "backplane.registry", ...), sharing the
// default logger's sinks so that an embedder redirects everything by replacing the default logger
// before the first message.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace backplane {

// Thread-safe. Created on first use with the default logger's sinks and spdlog's global level,
// and never destroyed: the reaper thread may still log while static destructors run at exit.
// Modules keep the reference in a function-local static (see the modules' Log()).
spdlog::logger& ModuleLogger(const std::string& name);

}  // namespace backplane
