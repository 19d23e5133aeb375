#include "backplane/core/runtime.hpp"

#include "backplane/loader/logging.hpp"

namespace backplane {

namespace {
const auto& Log() {
  static const auto logger = ModuleLogger("backplane.runtime");
  return logger;
}
}  // namespace

Result<std::unique_ptr<Runtime>> Runtime::Create(RuntimeOptions options) {
  std::shared_ptr<BackendRegistry> registry = std::move(options.registry);
  if (registry == nullptr) {
    auto created = BackendRegistry::Create({.backend_paths = std::move(options.backend_paths),
                                            .dynamic_backends = options.dynamic_backends});
    if (!created.ok())
      return std::move(created).error();
    registry = std::move(created).value();
  }

  std::unique_ptr<Runtime> runtime(new Runtime(registry));
  for (const auto& id : registry->BackendIds()) {
    auto instance = registry->CreateInstance(id);
    if (!instance.ok()) {
      Log()->error("backend {} not available to this runtime: {}", id, instance.error().message());
      continue;
    }
    auto context = instance.value()->CreateBackendContext();
    if (!context.ok()) {
      Log()->error("backend {} not available to this runtime: {}", id, context.error().message());
      continue;
    }
    runtime->backends_.emplace(
        id, BackendSlot{std::move(instance).value(), std::move(context).value()});
  }

  for (const auto& [id, changes] : options.backend_options) {
    auto it = runtime->backends_.find(id);
    if (it == runtime->backends_.end()) {
      return InvalidArgument("options given for backend " + id +
                             ", which this runtime does not have");
    }
    BACKPLANE_RETURN_IF_ERROR(it->second.instance->UpdateOptions(changes));
  }

  if (runtime->backends_.empty()) {
    std::string why = registry->directories().empty()
                          ? "dynamic loading is disabled or no backend directory is valid"
                          : std::to_string(registry->directories().size()) + " backend director" +
                                (registry->directories().size() == 1 ? "y" : "ies") + " searched";
    const auto rejected = registry->Rejected();
    if (!rejected.empty()) {
      why += "; " + std::to_string(rejected.size()) +
             " file(s) rejected, first: " + rejected.front().file.string() + ": " +
             std::string(loader::ToString(rejected.front().reason));
    }
    return FailedPrecondition("no backend is available (" + why + ")");
  }
  return runtime;
}

Runtime::Runtime(std::shared_ptr<BackendRegistry> registry) : registry_(std::move(registry)) {}

Runtime::~Runtime() = default;

std::vector<std::string> Runtime::BackendIds() const {
  std::vector<std::string> ids;
  for (const auto& [id, slot] : backends_)
    ids.push_back(id);
  return ids;
}

std::shared_ptr<loader::BackendInstance> Runtime::Backend(std::string_view id) const {
  auto it = backends_.find(id);
  return it == backends_.end() ? nullptr : it->second.instance;
}

Status Runtime::UpdateBackendOptions(std::string_view id, const BackendOptions& changes) {
  auto it = backends_.find(id);
  if (it == backends_.end())
    return NotFound("this runtime has no backend " + std::string(id));
  return it->second.instance->UpdateOptions(changes);
}

}  // namespace backplane
