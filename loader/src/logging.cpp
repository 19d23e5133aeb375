#include "backplane/loader/logging.hpp"

#include <mutex>

namespace backplane {

std::shared_ptr<spdlog::logger> ModuleLogger(const std::string& name) {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  if (auto existing = spdlog::get(name))
    return existing;
  auto base = spdlog::default_logger();
  auto logger = std::make_shared<spdlog::logger>(name, base->sinks().begin(), base->sinks().end());
  logger->set_level(spdlog::get_level());
  spdlog::register_logger(logger);
  return logger;
}

}  // namespace backplane
