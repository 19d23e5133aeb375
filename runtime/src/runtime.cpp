#include "backplane/runtime/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "backplane/core/backend_call.hpp"
#include "backplane/core/backend_call_record.hpp"
#include "backplane/sdk/thread_limits.hpp"
#include "loaded_network.hpp"
#include "rollout_meter.hpp"
#include "rollout_router.hpp"
#include "runtime_log.hpp"

namespace backplane {

namespace {

std::string Join(const std::vector<std::string>& items) {
  std::string joined;
  for (const auto& item : items)
    joined += (joined.empty() ? "" : ", ") + item;
  return joined;
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
  // Attached in the registry's change sequence: no generation change slips in between. The
  // runtime is not shared yet, so its lock around backend code blocks nobody.
  runtime->subscription_ = registry->Subscribe(*runtime, [&] {
    MutexLock lock(runtime->mutex_);
    runtime->AttachBackends();
  });

  for (const auto& [id, changes] : options.backend_options) {
    if (runtime->Backend(id) == nullptr) {
      return InvalidArgument("options given for backend " + id +
                             ", which this runtime does not have");
    }
    BACKPLANE_RETURN_IF_ERROR(runtime->UpdateBackendOptions(id, changes));
  }

  if (runtime->BackendIds().empty()) {
    std::string why = registry->directories().empty()
                          ? "dynamic loading is disabled or no backend directory is valid"
                          : std::to_string(registry->directories().size()) + " backend director" +
                                (registry->directories().size() == 1 ? "y" : "ies") + " searched";
    const auto rejected = registry->Rejected();
    if (!rejected.empty()) {
      why += "; " + std::to_string(rejected.size()) +
             " file(s) rejected, first: " + rejected.front().file.string() + ": " +
             rejected.front().error.ToString();
    }
    return FailedPrecondition("no backend is available (" + why + ")");
  }
  return runtime;
}

Runtime::Runtime(std::shared_ptr<BackendRegistry> registry, RuntimeOptions& options)
    : registry_(std::move(registry)),
      default_preferences_(std::move(options.default_preferences)),
      swap_policy_(options.swap_policy),
      swap_validation_(std::move(options.swap_validation)),
      on_crashed_request_(std::move(options.on_crashed_request)),
      crash_retry_wait_(options.crash_retry_wait),
      router_(std::make_unique<RolloutRouter>(on_crashed_request_)),
      shape_program_builder_(std::make_shared<ShapeProgramBuilder>()),
      scheduler_(options.scheduler) {}

// Builds first: a running one uses a network's backends, which must outlive it; the requests
// still in flight then find the builder refusing and run layer by layer.
Runtime::~Runtime() {
  shape_program_builder_->Shutdown();
}

void Runtime::AttachBackends() {
  for (const auto& id : registry_->BackendIds()) {
    auto instance = registry_->CreateInstance(id);
    if (!instance.ok()) {
      RuntimeLog().error("backend {} not available to this runtime: {}", id,
                         instance.error().message());
      continue;
    }
    auto slot = CreateSlot(std::move(instance).value(), nullptr);
    if (!slot.ok()) {
      RuntimeLog().error("backend {} not available to this runtime: {}", id,
                         slot.error().message());
      continue;
    }
    backends_.emplace(id, std::move(slot).value());
  }
}

std::vector<std::string> Runtime::BackendIds() const {
  MutexLock lock(mutex_);
  std::vector<std::string> ids;
  for (const auto& [id, slot] : backends_)
    ids.push_back(id);
  return ids;
}

std::shared_ptr<loader::BackendInstance> Runtime::Backend(std::string_view id) const {
  MutexLock lock(mutex_);
  auto it = backends_.find(id);
  return it == backends_.end() ? nullptr : it->second.instance;
}

namespace {

// Marks an option update for the rollout router from before the first instance or binding
// changes to after the last is published: shadow runs straddling it are not compared.
class OptionUpdateMark {
 public:
  explicit OptionUpdateMark(RolloutRouter& router) : router_(router) {
    router_.BeginOptionUpdate();
  }
  ~OptionUpdateMark() { router_.EndOptionUpdate(); }
  OptionUpdateMark(const OptionUpdateMark&) = delete;
  OptionUpdateMark& operator=(const OptionUpdateMark&) = delete;

 private:
  RolloutRouter& router_;
};

}  // namespace

Status Runtime::UpdateBackendOptions(std::string_view id, const BackendOptions& changes) {
  // The turn, throughout: the instance stays this runtime's, and no load, unload or generation
  // change commits until the networks re-prepared below are switched.
  MutexLock turn(backend_mutex_);
  const OptionUpdateMark mark(*router_);
  std::shared_ptr<loader::BackendInstance> instance;
  std::vector<Affected> affected;
  InstanceMap instances;
  // During a rollout of `id`, its trial arms' instances (the candidate's, and the baseline's when
  // it has one): a good build must not diverge from the stable one because an option that
  // changes outputs reached only the stable instance, and a baseline that did not get it would
  // not be the stable build any more.
  struct TrialInstance {
    RolloutArm arm;
    std::shared_ptr<loader::BackendInstance> instance;
  };
  std::vector<TrialInstance> trials;
  // Every rollout's trial bindings of networks on `id` (a rollout of another backend id binds
  // the network's layers on `id` too), with the instances they are prepared on.
  struct TrialBinding {
    std::shared_ptr<const CandidateRoute> route;
    RolloutArm arm;
    Affected network;
    InstanceMap instances;
  };
  std::vector<TrialBinding> trial_bindings;
  {
    MutexLock lock(mutex_);
    auto it = backends_.find(id);
    if (it == backends_.end())
      return NotFound("this runtime has no backend " + std::string(id));
    instance = it->second.instance;
    instances = CurrentInstances();
    // Only networks bound to this very instance: under kPin a network may still run on an older
    // generation, whose instance this update does not reach (and must not move it).
    for (auto& network : NetworksUsing(id)) {
      if (network.network->GenerationOn(id) == instance->generation_number())
        affected.push_back(std::move(network));
    }
    // Published with mutex_ held: these are the routes of the slots committed.
    const auto routes = router_->routes();
    if (auto found = routes->find(id); found != routes->end()) {
      for (RolloutArm arm : found->second->trial_arms())
        trials.push_back({arm, found->second->trial(arm).instance});
    }
    for (const auto& [routed_id, route] : *routes) {
      for (RolloutArm arm : route->trial_arms()) {
        const TrialBindings& trial = route->trial(arm);
        InstanceMap on_trial = instances;
        on_trial.insert_or_assign(routed_id, trial.instance);
        for (const auto& [network_id, bound] : trial.networks) {
          if (bound->Uses(id))
            trial_bindings.push_back(
                {route, arm, {network_id, bound, PreferencesOf(network_id)}, on_trial});
        }
      }
    }
  }
  // What to restore when a network does not prepare with the new values.
  BackendOptions previous;
  for (const auto& [key, value] : changes) {
    auto current = instance->GetOption(key);
    if (current.ok())
      previous.emplace(key, std::move(current).value());
  }
  // Thread counts within the CPUs this process may use, whether or not the backend checks
  // (sdk/thread_limits.hpp): refused before anything is applied.
  BACKPLANE_RETURN_IF_ERROR(CheckThreadCounts(changes, instance->DescribeOptions(), id));
  BACKPLANE_RETURN_IF_ERROR(instance->UpdateOptions(changes));
  std::size_t trials_applied = 0;  // trials[0, trials_applied) have the new values
  const auto restore = [&] {
    Status restored = instance->UpdateOptions(previous);
    for (std::size_t i = 0; restored.ok() && i < trials_applied; ++i)
      restored = trials[i].instance->UpdateOptions(previous);
    if (!restored.ok()) {
      RuntimeLog().error("backend {}: restoring its options after a failed update failed: {}", id,
                         restored.message());
    }
  };
  for (const TrialInstance& trial : trials) {
    Status applied = trial.instance->UpdateOptions(changes);
    if (!applied.ok()) {
      restore();
      return applied.WithContext("backend " + std::string(id) + ": options not applied: the " +
                                 "rollout's " + std::string(ArmName(trial.arm)) + " generation " +
                                 std::to_string(trial.instance->generation_number()) +
                                 " refused them: ");
    }
    ++trials_applied;
  }

  // An option may be read when a workload is created (CpuAcc's intra_op_threads sizes oneDNN's
  // kernels then), so every network on the instance is re-prepared with the new values, off the
  // request path, and switched as a swap switches: one pointer store each, requests in flight
  // finishing on the old bindings. Options read at Execute take effect at once anyway.
  MovedNetworks moved;
  for (const auto& network : affected) {
    auto reprepared = Reprepare(network, instances);
    if (!reprepared.ok()) {
      restore();
      return FailedPrecondition("backend " + std::string(id) + ": options not applied: network " +
                                network.network->network().name +
                                " does not prepare with them: " + reprepared.error().message());
    }
    moved.emplace(network.id, std::move(reprepared).value());
  }
  std::vector<std::shared_ptr<const LoadedNetwork>> rebound;
  for (const auto& binding : trial_bindings) {
    auto reprepared = Reprepare(binding.network, binding.instances);
    if (!reprepared.ok()) {
      restore();
      return FailedPrecondition(
          "backend " + std::string(id) + ": options not applied: network " +
          binding.network.network->network().name + " does not prepare with them on " +
          std::string(ArmName(binding.arm)) + " generation " +
          std::to_string(binding.route->trial(binding.arm).generation) + " of " +
          binding.route->backend_id + ": " + reprepared.error().message());
    }
    rebound.push_back(std::move(reprepared).value());
  }
  {
    MutexLock lock(mutex_);
    PublishMoved(moved);
    if (!trial_bindings.empty()) {
      // The same routes (meters, generations) with the trial bindings replaced; the turn keeps
      // every candidate change out, so each route is still the one read above.
      router_->Update([&](CandidateRoutes& routes) {
        for (std::size_t i = 0; i < trial_bindings.size(); ++i) {
          const TrialBinding& binding = trial_bindings[i];
          const std::string& routed_id = binding.route->backend_id;
          auto updated = std::make_shared<CandidateRoute>(*routes.at(routed_id));
          updated->trial(binding.arm).networks[binding.network.id] = std::move(rebound[i]);
          routes[routed_id] = std::move(updated);
        }
      });
    }
    auto& applied = applied_options_[std::string(id)];
    for (const auto& [key, value] : changes)
      applied.insert_or_assign(key, value);
    ++state_version_;  // a new generation being prepared must get these options too
  }
  if (!moved.empty() || !rebound.empty()) {
    RuntimeLog().info(
        "backend {}: options updated; {} network(s) re-prepared with them, {} rollout "
        "binding(s)",
        id, moved.size(), rebound.size());
  }
  return Status::Ok();
}

Status Runtime::UpdateNetworkOptions(NetworkId id, std::string_view backend_id,
                                     const BackendOptions& changes) {
  // The turn, as in UpdateBackendOptions: no load, unload or generation change commits between
  // reading the bindings and switching them.
  MutexLock turn(backend_mutex_);
  const OptionUpdateMark mark(*router_);
  Affected network;
  InstanceMap instances;
  // Each rollout's trial arm that bound the network, and the instances that binding uses.
  struct TrialBinding {
    std::shared_ptr<const CandidateRoute> route;
    RolloutArm arm;
    InstanceMap instances;
  };
  std::vector<TrialBinding> trials;
  {
    MutexLock lock(mutex_);
    const auto networks = networks_.Load();
    const auto it = networks->find(id);
    if (it == networks->end())
      return NotFound("no network " + std::to_string(id) + " is loaded");
    if (!backends_.contains(backend_id))
      return NotFound("this runtime has no backend " + std::string(backend_id));
    instances = CurrentInstances();
    // Re-preparing binds every layer to the current generations: a network pinned to an older
    // one would move.
    for (const LayerPlacement& layer : it->second->placement()) {
      const auto current = instances.find(layer.backend_id);
      if (current == instances.end() || layer.generation != current->second->generation_number()) {
        return FailedPrecondition("network " + it->second->network().name + " runs on " +
                                  layer.backend_id + " generation " +
                                  std::to_string(layer.generation) +
                                  ", not its active one (pinned): reload it to change its options");
      }
    }
    network = {id, it->second, PreferencesOf(id)};
    for (const auto& [routed_id, route] : *router_->routes()) {
      for (RolloutArm arm : route->trial_arms()) {
        const TrialBindings& trial = route->trial(arm);
        if (!trial.networks.contains(id))
          continue;
        InstanceMap on_trial = instances;
        on_trial.insert_or_assign(routed_id, trial.instance);
        trials.push_back({route, arm, std::move(on_trial)});
      }
    }
  }
  OptionsByBackend options = network.network->network_options();
  auto& own = options[std::string(backend_id)];
  for (const auto& [key, value] : changes)
    own.insert_or_assign(key, value);
  const std::string& name = network.network->network().name;
  const auto refuse = [&](const Status& why) {
    return why.WithContext("network " + name + ": options for backend " + std::string(backend_id) +
                           " not applied: ");
  };
  auto reprepared = Reprepare(network, instances, &options);
  if (!reprepared.ok())
    return refuse(reprepared.error());
  std::vector<std::shared_ptr<const LoadedNetwork>> on_trials;
  for (const auto& trial : trials) {
    auto bound = Reprepare(network, trial.instances, &options);
    if (!bound.ok()) {
      return refuse(
          bound.error().WithContext("on " + std::string(ArmName(trial.arm)) + " generation " +
                                    std::to_string(trial.route->trial(trial.arm).generation) +
                                    " of " + trial.route->backend_id + ": "));
    }
    on_trials.push_back(std::move(bound).value());
  }
  {
    MutexLock lock(mutex_);
    PublishMoved({{id, std::move(reprepared).value()}});
    if (!trials.empty()) {
      // The same routes (meters, generations) with this network's trial bindings replaced; the
      // turn keeps every candidate change out, so each route is still the one read above.
      router_->Update([&](CandidateRoutes& routes) {
        for (std::size_t i = 0; i < trials.size(); ++i) {
          const std::string& routed_id = trials[i].route->backend_id;
          auto updated = std::make_shared<CandidateRoute>(*routes.at(routed_id));
          updated->trial(trials[i].arm).networks[id] = std::move(on_trials[i]);
          routes[routed_id] = std::move(updated);
        }
      });
    }
    ++state_version_;  // a generation change being prepared must use the new values
  }
  RuntimeLog().info("network {}: options for backend {} updated; re-prepared with them", name,
                    backend_id);
  return Status::Ok();
}

Result<OptionsByBackend> Runtime::GetNetworkOptions(NetworkId id) const {
  auto network = FindNetwork(id);
  if (!network.ok())
    return std::move(network).error();
  return network->network_options();
}

Result<InstanceCounts> Runtime::GetNetworkInstances(NetworkId id) const {
  auto network = FindNetwork(id);
  if (!network.ok())
    return std::move(network).error();
  return network->instances()->counts();
}

Status Runtime::SetNetworkInstances(NetworkId id, std::size_t instances) {
  auto network = FindNetwork(id);
  if (!network.ok())
    return std::move(network).error();
  // Every binding of the network shares this one limit: nothing to re-prepare or publish.
  network->instances()->SetLimit(instances);
  RuntimeLog().info("network {}: instances set to {}", network->network().name, instances);
  return Status::Ok();
}

Result<NetworkId> Runtime::LoadNetwork(Network network, NetworkOptions options) {
  // Backend code below runs with the turn and without mutex_; nothing that the turn keeps out
  // (another load, an unload, a generation change's commit) changes what was read here.
  MutexLock turn(backend_mutex_);
  NetworkId id = 0;
  Instances backends;
  ContextList contexts;
  {
    MutexLock lock(mutex_);
    for (const auto& [backend_id, values] : options.backend_options) {
      if (!backends_.contains(backend_id)) {
        RuntimeLog().warn(
            "network {}: options for backend {}, which this runtime does not have, are kept "
            "unchecked",
            network.name, backend_id);
      }
    }
    id = next_network_id_;
    preferences_[id] = std::move(options.backend_preferences);
    const std::vector<std::string> preferences = PreferencesOf(id);
    std::string missing;
    backends = InstancesFor(preferences, CurrentInstances(), &missing);
    if (backends.empty()) {
      preferences_.erase(id);
      std::vector<std::string> have;
      for (const auto& [known, slot] : backends_)
        have.push_back(known);
      return NotFound("network " + network.name + ": backend preference " + missing +
                      " names no backend of this runtime (have: " + Join(have) + ")");
    }
    if (!missing.empty()) {
      RuntimeLog().warn("network {}: skipping preferred backend(s) this runtime does not have: {}",
                        network.name, missing);
    }
    contexts = CurrentContexts();
  }

  auto fail = [&](Status status) BACKPLANE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    preferences_.erase(id);
    return status;
  };
  for (const auto& [backend_id, context, instance] : contexts) {
    Status before = GuardBackendCall(
        backend_id, "BeforeLoadNetwork", [&, context = context, instance = instance] {
          const ScopedBackendCall hook(instance->CallSite("IBackendContext::BeforeLoadNetwork"));
          return context->BeforeLoadNetwork(id);
        });
    if (!before.ok()) {
      return fail(before.WithContext("backend " + backend_id + " refused to load network " +
                                     network.name + ": "));
    }
  }
  const std::string name = network.name;
  auto loaded = LoadedNetwork::Create(std::make_shared<const Network>(std::move(network)), backends,
                                      {.capacity = options.shape_program_capacity,
                                       .reaper = registry_->loader().reaper(),
                                       .builder = shape_program_builder_},
                                      std::move(options.backend_options),
                                      scheduler::ConcurrencyLimit::Create(options.instances));
  if (!loaded.ok())
    return fail(loaded.error().WithContext("network " + name + ": "));
  for (const auto& [backend_id, context, instance] : contexts) {
    Status after = GuardBackendCall(
        backend_id, "AfterLoadNetwork", [&, context = context, instance = instance] {
          const ScopedBackendCall hook(instance->CallSite("IBackendContext::AfterLoadNetwork"));
          return context->AfterLoadNetwork(id);
        });
    if (!after.ok())
      RuntimeLog().warn("backend {}: AfterLoadNetwork({}) failed: {}", backend_id, id,
                        after.message());
  }
  const std::size_t layers = loaded.value()->placement().size();
  const auto compiled =
      std::count_if(loaded.value()->placement().begin(), loaded.value()->placement().end(),
                    [](const LayerPlacement& layer) { return layer.compiled; });
  const auto per_shape =
      std::count_if(loaded.value()->placement().begin(), loaded.value()->placement().end(),
                    [](const LayerPlacement& layer) { return layer.compiled_per_input_shape; });
  {
    MutexLock lock(mutex_);
    ++next_network_id_;
    ++state_version_;  // a generation change being prepared must move this network too
    auto updated = std::make_shared<NetworkMap>(*networks_.Load());
    updated->emplace(id, Reaped(std::move(loaded).value()));
    networks_.Publish(std::move(updated));
  }
  RuntimeLog().info(
      "loaded network {} ({}) with {} layer(s), {} of them in compiled subgraphs, {} offered for "
      "compiling per input shape on first use",
      id, name, layers, compiled, per_shape);
  return id;
}

Status Runtime::UnloadNetwork(NetworkId id) {
  MutexLock turn(backend_mutex_);  // as in LoadNetwork: hooks run without mutex_
  ContextList contexts;
  {
    MutexLock lock(mutex_);
    if (!networks_.Load()->contains(id))
      return NotFound("no network " + std::to_string(id) + " is loaded");
    contexts = CurrentContexts();
  }
  for (const auto& [backend_id, context, instance] : contexts) {
    Status before = GuardBackendCall(
        backend_id, "BeforeUnloadNetwork", [&, context = context, instance = instance] {
          const ScopedBackendCall hook(instance->CallSite("IBackendContext::BeforeUnloadNetwork"));
          return context->BeforeUnloadNetwork(id);
        });
    if (!before.ok()) {
      return FailedPrecondition("network " + std::to_string(id) + " stays loaded: backend " +
                                backend_id + " refused to unload it: " + before.message());
    }
  }
  {
    MutexLock lock(mutex_);
    auto updated = std::make_shared<NetworkMap>(*networks_.Load());
    updated->erase(id);
    networks_.Publish(std::move(updated));
    preferences_.erase(id);
    ++state_version_;  // a generation change being prepared must not bring it back
  }
  for (const auto& [backend_id, context, instance] : contexts) {
    Status after = GuardBackendCall(
        backend_id, "AfterUnloadNetwork", [&, context = context, instance = instance] {
          const ScopedBackendCall hook(instance->CallSite("IBackendContext::AfterUnloadNetwork"));
          return context->AfterUnloadNetwork(id);
        });
    if (!after.ok())
      RuntimeLog().warn("backend {}: AfterUnloadNetwork({}) failed: {}", backend_id, id,
                        after.message());
  }
  return Status::Ok();
}

Result<std::shared_ptr<const LoadedNetwork>> Runtime::FindNetwork(NetworkId id) const {
  auto networks = networks_.Load();
  auto it = networks->find(id);
  if (it == networks->end())
    return NotFound("no network " + std::to_string(id) + " is loaded");
  return it->second;
}

Result<std::vector<LayerPlacement>> Runtime::GetPlacement(NetworkId id) const {
  auto network = FindNetwork(id);
  if (!network.ok())
    return std::move(network).error();
  return network->placement();
}

Result<ShapeProgramStats> Runtime::GetShapePrograms(NetworkId id) const {
  auto network = FindNetwork(id);
  if (!network.ok())
    return std::move(network).error();
  return network->shape_program_stats();
}

Result<std::shared_ptr<const Network>> Runtime::GetNetwork(NetworkId id) const {
  auto network = FindNetwork(id);
  if (!network.ok())
    return std::move(network).error();
  // The description its bindings on every generation share, not an alias into this binding: a
  // caller that keeps it (a server's model, for as long as the model serves) would otherwise
  // keep this binding's workloads, hence the generation it was loaded on, after a migration.
  return network->shared_network();
}

Status Runtime::CheckCallOptionsElsewhere(const LoadedNetwork& network,
                                          const CallOptions& call_options) const {
  for (const auto& [backend_id, values] : call_options) {
    if (network.CallOptionRulesFor(backend_id) != nullptr)
      continue;  // the binding checks these itself, as it runs
    const std::shared_ptr<loader::BackendInstance> instance = Backend(backend_id);
    if (instance == nullptr) {
      std::string known;
      for (const auto& have : BackendIds())
        known += (known.empty() ? "" : ", ") + have;
      return InvalidArgument("the call's options name backend " + backend_id +
                             ", which this runtime does not have (backends: " + known + ")");
    }
    if (values.empty())
      continue;
    BACKPLANE_RETURN_IF_ERROR(LoadedNetwork::CheckCallOptionValues(
        values, {instance->DescribeOptions(), instance->DescribeCallOptions()}, backend_id));
  }
  return Status::Ok();
}

Result<std::vector<Tensor>> Runtime::Execute(NetworkId id, std::span<const ConstTensorView> inputs,
                                             std::string_view routing_key,
                                             const CallOptions& call_options) {
  const uint64_t options_epoch = router_->options_epoch();  // before the binding is read
  auto network = FindNetwork(id);
  if (!network.ok())
    return std::move(network).error();
  std::shared_ptr<const LoadedNetwork> loaded = std::move(network).value();
  if (!call_options.empty())
    BACKPLANE_RETURN_IF_ERROR(CheckCallOptionsElsewhere(*loaded, call_options));
  RoutedRequest routed = router_->Route(id, std::move(loaded), routing_key, options_epoch);
  if (!call_options.empty())
    routed.call_options = &call_options;
  auto admission = scheduler_.Admit();
  if (!admission.ok())
    return std::move(admission).error();
  // The network's turn, waited for on this thread before it joins the arena, where a wait would
  // hold an arena slot that queued requests could use. Released when the run returns.
  const scheduler::ConcurrencyLimit::Slot turn = routed.network->instances()->AcquireBlocking();
  std::optional<Result<std::vector<Tensor>>> result;
  Status ran = scheduler_.RunOnCallerThread([&] {
    result.emplace(ExecuteRouted(routed, inputs, nullptr));
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
  const auto& expected = network->network().inputs;
  std::string names;
  for (const auto& input : expected)
    names += (names.empty() ? "" : ", ") + input.name;
  for (const auto& [name, view] : inputs) {
    const bool known =
        std::any_of(expected.begin(), expected.end(),
                    [&name = name](const ValueInfo& input) { return input.name == name; });
    if (!known) {
      return InvalidArgument("network " + network->network().name + " has no input '" + name +
                             "' (inputs: " + names + ")");
    }
  }
  std::vector<ConstTensorView> ordered;
  for (const auto& input : expected) {
    auto it = inputs.find(input.name);
    if (it == inputs.end()) {
      return InvalidArgument("input '" + input.name + "' is missing (network " +
                             network->network().name + " takes: " + names + ")");
    }
    ordered.push_back(it->second);
  }
  return Execute(id, ordered);
}

void Runtime::ExecuteAsync(NetworkId id, std::vector<Tensor> inputs, ExecuteCallback done,
                           std::optional<scheduler::Clock::time_point> deadline,
                           CallOptions call_options) {
  // std::function wants a copyable callable: the inputs ride in a shared_ptr, taken once.
  auto owned = std::make_shared<std::vector<Tensor>>(std::move(inputs));
  std::function<CallOptions()> options;
  if (!call_options.empty()) {
    options = [call_options = std::make_shared<const CallOptions>(std::move(call_options))] {
      return *call_options;
    };
  }
  ExecuteAsync(
      id, [owned]() -> Result<std::vector<Tensor>> { return std::move(*owned); }, std::move(done),
      deadline, {}, std::move(options));
}

void Runtime::ExecuteAsync(NetworkId id, InputsFactory make_inputs, ExecuteCallback done,
                           std::optional<scheduler::Clock::time_point> deadline,
                           std::function<std::string()> routing_key,
                           std::function<CallOptions()> call_options) {
  const uint64_t options_epoch = router_->options_epoch();  // before the binding is read
  auto network = FindNetwork(id);
  if (!network.ok())
    return done(std::move(network).error());
  auto admission = scheduler_.Admit();
  if (!admission.ok())
    return done(std::move(admission).error());
  // The request keeps the network binding it started with.
  const std::shared_ptr<scheduler::ConcurrencyLimit> instances = network->instances();
  auto result = std::make_shared<std::optional<Result<std::vector<Tensor>>>>();
  auto work = [this, id, result, make_inputs = std::move(make_inputs),
               routing_key = std::move(routing_key), call_options = std::move(call_options),
               loaded = std::move(network).value(), options_epoch] {
    auto inputs = make_inputs();
    if (!inputs.ok()) {
      result->emplace(std::move(inputs).error());
      return Status::Ok();
    }
    const CallOptions options = call_options ? call_options() : CallOptions{};
    if (!options.empty()) {
      if (Status refused = CheckCallOptionsElsewhere(*loaded, options); !refused.ok()) {
        result->emplace(std::move(refused));
        return Status::Ok();
      }
    }
    RoutedRequest routed =
        router_->Route(id, loaded, routing_key ? routing_key() : std::string(), options_epoch);
    if (!options.empty())
      routed.call_options = &options;
    std::vector<ConstTensorView> views;
    views.reserve(inputs->size());
    for (const auto& tensor : *inputs)
      views.push_back(tensor.View());
    result->emplace(ExecuteRouted(routed, views, &*inputs));
    return Status::Ok();
  };
  auto finish = [result, done = std::move(done)](Status status) {
    if (!status.ok())
      return done(std::move(status));
    done(*std::move(*result));
  };
  // The request waits for the network's turn before it is queued in the arena, as a callback:
  // waiting, it holds its admission (it counts among max_in_flight) but no thread. Its turn is
  // handed to it by the thread that ends an execution, which only queues it here. The inputs
  // are made within the turn: the parse is part of the request, as before.
  auto admitted =
      std::make_shared<scheduler::RequestScheduler::Admission>(std::move(admission).value());
  instances->Acquire(
      [this, admitted, work = std::move(work), finish = std::move(finish),
       deadline](Result<scheduler::ConcurrencyLimit::Slot> turn) mutable {
        if (!turn.ok()) {  // its deadline passed while it waited: `done` still runs on a worker
          scheduler_.Enqueue(
              std::move(*admitted), [why = turn.error()] { return why; }, std::move(finish));
          return;
        }
        // Released as soon as the execution ends, before `done`; or with the task, when the
        // deadline passes in the arena's queue and the work never runs.
        auto slot = std::make_shared<std::optional<scheduler::ConcurrencyLimit::Slot>>(
            std::move(turn).value());
        scheduler_.Enqueue(
            std::move(*admitted),
            [work = std::move(work), slot]() mutable {
              Status status = work();
              slot->reset();
              return status;
            },
            std::move(finish), deadline);
      },
      deadline);
}

Result<std::vector<Tensor>> Runtime::ExecuteRouted(const RoutedRequest& routed,
                                                   std::span<const ConstTensorView> inputs,
                                                   std::vector<Tensor>* owned) {
  double micros = 0;
  auto result = RolloutRouter::Execute(routed, inputs, &micros);
  if (!result.ok() && result.error().reason() == LoadReason::kCrashed)
    return RunAgainAfterCrash(routed, inputs, std::move(result).error());
  if (routed.shadow && result.ok())
    router_->StartShadow(scheduler_, routed, inputs, owned, result.value(), micros);
  return result;
}

Result<std::vector<Tensor>> Runtime::RunAgainAfterCrash(const RoutedRequest& routed,
                                                        std::span<const ConstTensorView> inputs,
                                                        Status crash) const {
  if (on_crashed_request_)
    on_crashed_request_({.network = routed.id, .inputs = inputs, .error = crash});
  // The run again is the same request: it keeps the turn among the network's instances that its
  // first run had (NetworkOptions::instances) and takes no second one, which with one instance
  // would wait for itself.
  // A trial arm's crash is the rollout's to judge (the crash supervisor rolls a candidate back;
  // a baseline that crashed routes nothing more, RolloutRouter::Execute): the client's request
  // runs where it would have without the rollout. The baseline's crash is told above as the
  // candidate's is: it is the stable build's crash on a client's input, which the stable
  // generation may meet next, so the crash journal wants it as much.
  if (routed.arm != RolloutArm::kStable)
    return routed.stable->Execute(inputs, routed.call_options);
  // A stable generation's: its worker is being restarted (or the build rolled back, or withdrawn
  // and the network moved along its preferences). Every such change gives the network a new
  // binding; until then there is nothing to run on but the dead worker.
  const auto until = std::chrono::steady_clock::now() + crash_retry_wait_;
  while (true) {
    auto current = FindNetwork(routed.id);
    if (!current.ok())  // unloaded meanwhile
      return crash;
    if (&*current != routed.network.get()) {
      auto again = current->Execute(inputs, routed.call_options);
      if (!again.ok())
        return again.error().WithContext("run again after a crash (" + crash.message() + "): ");
      return again;
    }
    if (std::chrono::steady_clock::now() >= until) {
      return crash.WithContext("not run again: network " + routed.network->network().name +
                               " did not move off the dead worker within " +
                               std::to_string(crash_retry_wait_.count()) + " ms: ");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Status Runtime::SetRolloutTraffic(std::string_view id, const RolloutTraffic& traffic) {
  return router_->SetTraffic(id, traffic);
}

std::optional<RolloutStats> Runtime::GetRolloutStats(std::string_view id) const {
  return router_->Stats(id);
}

std::future<Result<std::vector<Tensor>>> Runtime::ExecuteAsync(
    NetworkId id, std::vector<Tensor> inputs, std::optional<scheduler::Clock::time_point> deadline,
    CallOptions call_options) {
  auto promise = std::make_shared<std::promise<Result<std::vector<Tensor>>>>();
  auto future = promise->get_future();
  ExecuteAsync(
      id, std::move(inputs),
      [promise](Result<std::vector<Tensor>> result) { promise->set_value(std::move(result)); },
      deadline, std::move(call_options));
  return future;
}

}  // namespace backplane
