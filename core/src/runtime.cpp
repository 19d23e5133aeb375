#include "backplane/core/runtime.hpp"

#include <algorithm>

#include "backplane/loader/logging.hpp"
#include "loaded_network.hpp"

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

  std::unique_ptr<Runtime> runtime(new Runtime(registry, options));
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

Runtime::Runtime(std::shared_ptr<BackendRegistry> registry, RuntimeOptions& options)
    : registry_(std::move(registry)),
      default_preferences_(std::move(options.default_preferences)),
      scheduler_(options.scheduler) {}

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

Result<NetworkId> Runtime::LoadNetwork(Network network, NetworkOptions options) {
  std::vector<std::string> preferences = options.backend_preferences.empty()
                                             ? default_preferences_
                                             : std::move(options.backend_preferences);
  if (preferences.empty()) {
    // Every backend, in registration order (static ones first, then directory order).
    for (const auto& id : registry_->BackendIds()) {
      if (backends_.contains(id))
        preferences.push_back(id);
    }
  }
  // An id this runtime lacks is skipped, as ArmNN's Optimize skips unavailable backends: a
  // preference list like "GpuAcc,CpuRef" must work on machines without GpuAcc.
  std::vector<std::shared_ptr<loader::BackendInstance>> backends;
  std::string missing;
  for (const auto& id : preferences) {
    if (auto backend = Backend(id)) {
      backends.push_back(std::move(backend));
    } else {
      missing += (missing.empty() ? "" : ", ") + id;
    }
  }
  if (backends.empty()) {
    std::string have;
    for (const auto& known : BackendIds())
      have += (have.empty() ? "" : ", ") + known;
    return NotFound("network " + network.name + ": backend preference " + missing +
                    " names no backend of this runtime (have: " + have + ")");
  }
  if (!missing.empty()) {
    Log()->warn("network {}: skipping preferred backend(s) this runtime does not have: {}",
                network.name, missing);
  }

  std::lock_guard lock(networks_mutex_);
  const NetworkId id = next_network_id_++;
  for (auto& [backend_id, slot] : backends_) {
    if (slot.context == nullptr)
      continue;
    Status before = loader::GuardBackendCall(backend_id, "BeforeLoadNetwork",
                                             [&] { return slot.context->BeforeLoadNetwork(id); });
    if (!before.ok()) {
      return Status(before.code(), "backend " + backend_id + " refused to load network " +
                                       network.name + ": " + before.message());
    }
  }
  const std::string name = network.name;
  auto loaded = LoadedNetwork::Create(std::move(network), backends);
  if (!loaded.ok()) {
    return Status(loaded.error().code(), "network " + name + ": " + loaded.error().message());
  }
  for (auto& [backend_id, slot] : backends_) {
    if (slot.context == nullptr)
      continue;
    Status after = loader::GuardBackendCall(backend_id, "AfterLoadNetwork",
                                            [&] { return slot.context->AfterLoadNetwork(id); });
    if (!after.ok()) {
      Log()->warn("backend {}: AfterLoadNetwork({}) failed: {}", backend_id, id, after.message());
    }
  }
  auto updated = std::make_shared<NetworkMap>(*networks_.load());
  updated->emplace(id, std::shared_ptr<const LoadedNetwork>(std::move(loaded).value()));
  networks_.store(std::move(updated));
  Log()->info("loaded network {} ({}) with {} layer(s)", id, name,
              (*networks_.load()).at(id)->placement().size());
  return id;
}

Status Runtime::UnloadNetwork(NetworkId id) {
  std::lock_guard lock(networks_mutex_);
  auto current = networks_.load();
  if (!current->contains(id))
    return NotFound("no network " + std::to_string(id) + " is loaded");
  for (auto& [backend_id, slot] : backends_) {
    if (slot.context == nullptr)
      continue;
    Status before = loader::GuardBackendCall(backend_id, "BeforeUnloadNetwork",
                                             [&] { return slot.context->BeforeUnloadNetwork(id); });
    if (!before.ok()) {
      return FailedPrecondition("network " + std::to_string(id) + " stays loaded: backend " +
                                backend_id + " refused to unload it: " + before.message());
    }
  }
  auto updated = std::make_shared<NetworkMap>(*current);
  updated->erase(id);
  networks_.store(std::move(updated));
  for (auto& [backend_id, slot] : backends_) {
    if (slot.context == nullptr)
      continue;
    Status after = loader::GuardBackendCall(backend_id, "AfterUnloadNetwork",
                                            [&] { return slot.context->AfterUnloadNetwork(id); });
    if (!after.ok()) {
      Log()->warn("backend {}: AfterUnloadNetwork({}) failed: {}", backend_id, id, after.message());
    }
  }
  return Status::Ok();
}

Result<std::shared_ptr<const LoadedNetwork>> Runtime::FindNetwork(NetworkId id) const {
  auto networks = networks_.load();
  auto it = networks->find(id);
  if (it == networks->end())
    return NotFound("no network " + std::to_string(id) + " is loaded");
  return it->second;
}

Result<std::vector<LayerPlacement>> Runtime::GetPlacement(NetworkId id) const {
  auto network = FindNetwork(id);
  if (!network.ok())
    return std::move(network).error();
  return network.value()->placement();
}

Result<std::shared_ptr<const Network>> Runtime::GetNetwork(NetworkId id) const {
  auto network = FindNetwork(id);
  if (!network.ok())
    return std::move(network).error();
  // Aliasing constructor: the Network lives as long as its loaded network.
  return std::shared_ptr<const Network>(network.value(), &network.value()->network());
}

Result<std::vector<Tensor>> Runtime::Execute(NetworkId id,
                                             std::span<const ConstTensorView> inputs) {
  auto network = FindNetwork(id);
  if (!network.ok())
    return std::move(network).error();
  auto admission = scheduler_.Admit();
  if (!admission.ok())
    return std::move(admission).error();
  std::optional<Result<std::vector<Tensor>>> result;
  Status ran = scheduler_.RunInArena([&] {
    result.emplace(network.value()->Execute(inputs));
    return Status::Ok();
  });
  if (!ran.ok())
    return ran;
  return *std::move(result);
}

Result<std::vector<Tensor>> Runtime::ExecuteByName(NetworkId id, const NamedInputs& inputs) {
  auto network = FindNetwork(id);
  if (!network.ok())
    return std::move(network).error();
  const auto& expected = network.value()->network().inputs;
  std::string names;
  for (const auto& input : expected)
    names += (names.empty() ? "" : ", ") + input.name;
  for (const auto& [name, view] : inputs) {
    const bool known = std::any_of(expected.begin(), expected.end(),
                                   [&](const ValueInfo& input) { return input.name == name; });
    if (!known) {
      return InvalidArgument("network " + network.value()->network().name + " has no input '" +
                             name + "' (inputs: " + names + ")");
    }
  }
  std::vector<ConstTensorView> ordered;
  for (const auto& input : expected) {
    auto it = inputs.find(input.name);
    if (it == inputs.end()) {
      return InvalidArgument("input '" + input.name + "' is missing (network " +
                             network.value()->network().name + " takes: " + names + ")");
    }
    ordered.push_back(it->second);
  }
  return Execute(id, ordered);
}

void Runtime::ExecuteAsync(NetworkId id, std::vector<Tensor> inputs, ExecuteCallback done,
                           std::optional<scheduler::Clock::time_point> deadline) {
  auto network = FindNetwork(id);
  if (!network.ok())
    return done(std::move(network).error());
  auto admission = scheduler_.Admit();
  if (!admission.ok())
    return done(std::move(admission).error());
  // The request owns its inputs and the network binding it started with.
  auto request =
      std::make_shared<std::pair<std::vector<Tensor>, std::optional<Result<std::vector<Tensor>>>>>(
          std::move(inputs), std::nullopt);
  scheduler_.Enqueue(
      std::move(admission).value(),
      [request, loaded = std::move(network).value()] {
        std::vector<ConstTensorView> views;
        for (const auto& tensor : request->first)
          views.push_back(tensor.View());
        request->second.emplace(loaded->Execute(views));
        return Status::Ok();
      },
      [request, done = std::move(done)](Status status) {
        if (!status.ok())
          return done(std::move(status));
        done(*std::move(request->second));
      },
      deadline);
}

std::future<Result<std::vector<Tensor>>> Runtime::ExecuteAsync(
    NetworkId id, std::vector<Tensor> inputs,
    std::optional<scheduler::Clock::time_point> deadline) {
  auto promise = std::make_shared<std::promise<Result<std::vector<Tensor>>>>();
  auto future = promise->get_future();
  ExecuteAsync(
      id, std::move(inputs),
      [promise](Result<std::vector<Tensor>> result) { promise->set_value(std::move(result)); },
      deadline);
  return future;
}

}  // namespace backplane
