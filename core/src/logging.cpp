#include "backplane/core/logging.hpp"

#include <map>
#include <memory>

#include "backplane/core/thread_annotations.hpp"

namespace backplane {

spdlog::logger& ModuleLogger(const std::string& name) {
  static Mutex& mutex = *new Mutex;
  // Leaked on purpose (see the header): spdlog's own registry is destroyed at exit. A pointer,
  // not a reference: the analysis checks BACKPLANE_PT_GUARDED_BY through it but nothing through a
  // reference.
  static auto* const loggers BACKPLANE_PT_GUARDED_BY(mutex) =
      new std::map<std::string, std::shared_ptr<spdlog::logger>>;
  MutexLock lock(mutex);
  auto& logger = (*loggers)[name];
  if (logger == nullptr) {
    auto base = spdlog::default_logger();
    logger = std::make_shared<spdlog::logger>(name, base->sinks().begin(), base->sinks().end());
    logger->set_level(spdlog::get_level());
    spdlog::register_logger(logger);
  }
  return *logger;
}

}  // namespace backplane
