#include "backplane/core/logging.hpp"

#include <map>
#include <memory>
#include <mutex>

namespace backplane {

spdlog::logger& ModuleLogger(const std::string& name) {
  static std::mutex& mutex = *new std::mutex;
  // Leaked on purpose (see the header): spdlog's own registry is destroyed at exit.
  static auto& loggers = *new std::map<std::string, std::shared_ptr<spdlog::logger>>;
  std::lock_guard lock(mutex);
  auto& logger = loggers[name];
  if (logger == nullptr) {
    auto base = spdlog::default_logger();
    logger = std::make_shared<spdlog::logger>(name, base->sinks().begin(), base->sinks().end());
    logger->set_level(spdlog::get_level());
    spdlog::register_logger(logger);
  }
  return *logger;
}

}  // namespace backplane
