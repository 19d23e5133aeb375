// How the runtime binds its networks to backend slots, shared by everything that binds them (a
// load, an option update, a generation change of either policy): a slot for an instance, the
// networks on a backend id and their preferences, a network prepared anew on a set of instances
// and its new bindings published, and the probe that validates a migration.
#include <algorithm>
#include <thread>

#include "backplane/runtime/runtime.hpp"
#include "backplane/sdk/thread_limits.hpp"
#include "loaded_network.hpp"
#include "rollout_meter.hpp"

namespace backplane {

namespace {

// A deterministic input for every network input (dynamic dimensions taken as 1), spread over
// [-1, 1] so that offsets, scales and sign errors all show.
std::vector<Tensor> ProbeInputs(const Network& network) {
  std::vector<Tensor> inputs;
  uint32_t state = 0x9e3779b9u;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<double>(state >> 8) / static_cast<double>(1u << 24) * 2.0 - 1.0;
  };
  for (const auto& input : network.inputs) {
    TensorInfo info = input.info;
    for (auto& dim : info.shape)
      dim = dim < 0 ? 1 : dim;
    Tensor tensor(info);
    switch (info.type) {
      case DataType::kFloat32:
        for (auto& value : tensor.Elements<float>())
          value = static_cast<float>(next());
        break;
      case DataType::kFloat64:
        for (auto& value : tensor.Elements<double>())
          value = next();
        break;
      case DataType::kInt32:
        for (auto& value : tensor.Elements<int32_t>())
          value = static_cast<int32_t>(next() * 8);
        break;
      case DataType::kInt64:
        for (auto& value : tensor.Elements<int64_t>())
          value = static_cast<int64_t>(next() * 8);
        break;
      default:  // bytes: uint8, int8, bool
        for (auto& value : tensor.Elements<uint8_t>())
          value = next() > 0 ? 1 : 0;
    }
    inputs.push_back(std::move(tensor));
  }
  return inputs;
}

// The first output of `actual` that differs from `expected` by more than `tolerance`.
Status CompareOnProbe(const Network& network, const std::vector<Tensor>& expected,
                      const std::vector<Tensor>& actual, std::string_view backend_id,
                      double tolerance) {
  const auto& outputs = network.outputs;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const Tensor& want = expected[i];
    const Tensor& got = actual[i];
    if (want.info() != got.info()) {
      return {LoadReason::kValidationFailed,
              "network " + network.name + " output '" + outputs[i].name + "' is " +
                  ToString(got.info().shape) + " on the new generation of " +
                  std::string(backend_id) + ", " + ToString(want.info().shape) +
                  " on the active one"};
    }
    const double difference = MaxDifference(want, got);
    if (difference > tolerance) {
      return {LoadReason::kValidationFailed,
              "network " + network.name + " output '" + outputs[i].name + "' differs by " +
                  std::to_string(difference) + " on the new generation of " +
                  std::string(backend_id) + " (tolerance " + std::to_string(tolerance) + ")"};
    }
  }
  return Status::Ok();
}

}  // namespace

Runtime::Instances Runtime::InstancesFor(const std::vector<std::string>& preferences,
                                         const InstanceMap& instances, std::string* missing) {
  Instances ordered;
  for (const auto& id : preferences) {
    if (auto it = instances.find(id); it != instances.end()) {
      ordered.push_back(it->second);
    } else if (missing != nullptr) {
      *missing += (missing->empty() ? "" : ", ") + id;
    }
  }
  return ordered;
}

Result<Runtime::BackendSlot> Runtime::CreateSlot(std::shared_ptr<loader::BackendInstance> instance,
                                                 const BackendOptions* options) {
  // Options survive a swap: a new generation gets what this runtime set on the old one.
  if (options != nullptr) {
    Status status = CheckThreadCounts(*options, instance->DescribeOptions(), instance->id());
    if (status.ok())
      status = instance->UpdateOptions(*options);
    if (!status.ok())
      return status.WithContext("it refuses the options this runtime set: ");
  }
  auto context = instance->CreateBackendContext();
  if (!context.ok())
    return std::move(context).error();
  return BackendSlot{std::move(instance), std::move(context).value()};
}

std::vector<Runtime::Affected> Runtime::NetworksUsing(std::string_view id) const {
  std::vector<Affected> affected;
  for (const auto& [network_id, network] : *networks_.Load()) {
    if (network->Uses(id))
      affected.push_back({network_id, network, PreferencesOf(network_id, id)});
  }
  return affected;
}

Result<std::shared_ptr<const LoadedNetwork>> Runtime::Reprepare(
    const Affected& network, const InstanceMap& instances,
    const OptionsByBackend* network_options) const {
  const Instances backends = InstancesFor(network.preferences, instances);
  if (backends.empty())
    return NotFound("no backend in its preference list");
  // The shape program settings (capacity, counters), the network's own options and its limit on
  // executions at once (the same object: requests on the old binding and the new take turns
  // together) carry over; the cache starts empty.
  auto prepared = LoadedNetwork::Create(
      network.network->shared_network(), backends, network.network->shape_program_options(),
      network_options != nullptr ? *network_options : network.network->network_options(),
      network.network->instances());
  if (!prepared.ok())
    return std::move(prepared).error();
  return Reaped(std::move(prepared).value());
}

void Runtime::PublishMoved(const MovedNetworks& moved) {
  if (moved.empty())
    return;
  // The replaced bindings go when the last request using them lets go, on the reaper (Reaped).
  auto updated = std::make_shared<NetworkMap>(*networks_.Load());
  for (const auto& [network_id, network] : moved)
    (*updated)[network_id] = network;
  networks_.Publish(std::move(updated));
}

std::vector<std::string> Runtime::PreferencesOf(NetworkId id, std::string_view arriving) const {
  auto it = preferences_.find(id);
  std::vector<std::string> preferences =
      it == preferences_.end() || it->second.empty() ? default_preferences_ : it->second;
  if (preferences.empty()) {
    // Every backend, in registration order (static ones first, then directory order), and the
    // one about to arrive, which neither the registry nor this runtime offers yet.
    for (const auto& backend_id : registry_->BackendIds()) {
      if (backends_.contains(backend_id) || backend_id == arriving)
        preferences.push_back(backend_id);
    }
    if (!arriving.empty() &&
        std::find(preferences.begin(), preferences.end(), arriving) == preferences.end())
      preferences.emplace_back(arriving);
  }
  return preferences;
}

Runtime::InstanceMap Runtime::CurrentInstances() const {
  InstanceMap instances;
  for (const auto& [id, slot] : backends_)
    instances.emplace(id, slot.instance);
  return instances;
}

Runtime::ContextList Runtime::CurrentContexts() const {
  ContextList contexts;
  for (const auto& [id, slot] : backends_) {
    if (slot.context != nullptr)  // a backend without a context
      contexts.push_back({id, slot.context.get(), slot.instance.get()});
  }
  return contexts;
}

std::shared_ptr<const LoadedNetwork> Runtime::Reaped(std::unique_ptr<LoadedNetwork> network) const {
  // Its workloads are backend code: the last request to let go of a replaced network must not
  // run their destructors on a request thread (docs/loading-rules.md rule 6).
  return loader::MakeReaped(std::move(network), registry_->loader().reaper());
}

Status Runtime::ValidateOnProbe(const LoadedNetwork& current, const LoadedNetwork& candidate,
                                std::string_view backend_id, double tolerance) {
  // The probe is two requests of this runtime: it waits for a slot among the requests in flight
  // like any other (a while, not forever: this is the registry's change sequence). It takes no
  // turn among the network's instances (NetworkOptions::instances): there is at most one probe
  // at a time in the whole runtime, and waiting behind the network's clients would hold up every
  // deploy and rollback of every backend for as long as that queue is.
  constexpr auto kWaitForSlot = std::chrono::seconds(2);
  const auto until = scheduler::Clock::now() + kWaitForSlot;
  std::optional<Result<scheduler::RequestScheduler::Admission>> admission;
  while (true) {
    admission.emplace(scheduler_.Admit());
    if (admission->ok() || scheduler::Clock::now() >= until)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!admission->ok()) {
    return {LoadReason::kValidationFailed,
            "the swap-validation probe of network " + current.network().name +
                " found no free request slot for 2 s: " + admission->error().message()};
  }
  const auto inputs = ProbeInputs(current.network());
  std::vector<ConstTensorView> views;
  for (const auto& input : inputs)
    views.push_back(input.View());
  std::optional<Result<std::vector<Tensor>>> expected;
  std::optional<Result<std::vector<Tensor>>> actual;
  BACKPLANE_RETURN_IF_ERROR(scheduler_.RunOnCallerThread([&] {
    expected.emplace(current.Execute(views));
    actual.emplace(candidate.Execute(views));
    return Status::Ok();
  }));
  if (!expected->ok())  // the current generation cannot run it: nothing to compare against
    return Status::Ok();
  if (!actual->ok()) {
    return {LoadReason::kValidationFailed,
            "network " + current.network().name +
                " fails on the probe input with the new generation of " + std::string(backend_id) +
                ": " + actual->error().message()};
  }
  return CompareOnProbe(current.network(), expected->value(), actual->value(), backend_id,
                        tolerance);
}

}  // namespace backplane
