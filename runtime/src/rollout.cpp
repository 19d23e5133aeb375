// The runtime's side of a progressive rollout: binding networks on a candidate generation,
// routing each request to one generation, and the shadow runs.
#include <algorithm>
#include <chrono>
#include <thread>

#include "backplane/core/crossing_time.hpp"
#include "backplane/runtime/runtime.hpp"
#include "loaded_network.hpp"
#include "rollout_meter.hpp"
#include "runtime_log.hpp"
#include "slot_change.hpp"

namespace backplane {

// One runtime's side of a candidate arriving (its slot, and the networks bound on it, prepared
// without the runtime's lock) or leaving (a rollback: nothing to prepare).
class Runtime::CandidateChange final : public SlotChange {
 public:
  CandidateChange(Runtime& runtime, uint64_t version, const BackendChange& change)
      : SlotChange(runtime, version, change.backend_id),
        generation_(change.next ? change.next->info().number : 0),
        stable_generation_(change.previous ? change.previous->info().number : 0) {}
  ~CandidateChange() override { ReleaseTurn(); }

  void Commit() override {
    runtime_.mutex_.AssertHeld();
    // Released outside every lock, when this change is dropped: the route's bindings go when the
    // last request on them ends, on the reaper.
    if (auto it = runtime_.candidate_backends_.find(id_);
        it != runtime_.candidate_backends_.end()) {
      replaced_ = std::move(it->second);
      runtime_.candidate_backends_.erase(it);
    }
    auto routes = std::make_shared<CandidateRoutes>(*runtime_.candidate_routes_.Load());
    routes->erase(id_);
    if (slot_) {
      placed_ = &runtime_.candidate_backends_.emplace(id_, *std::move(slot_)).first->second;
      slot_.reset();
      auto route = std::make_shared<CandidateRoute>();
      route->backend_id = id_;
      route->stable_generation = stable_generation_;
      route->candidate_generation = generation_;
      route->networks = std::move(networks_);
      route->meter = std::make_shared<RolloutMeter>(stable_generation_, generation_);
      bound_ = route->networks.size();
      routes->emplace(id_, std::move(route));
    }
    runtime_.candidate_routes_.Publish(std::move(routes));
    ++runtime_.state_version_;
  }

  void AfterCommit() override {
    TellLoadedAndReleaseTurn(placed_, hooked_, " candidate");
    if (generation_ != 0) {
      RuntimeLog().info(
          "backend {}: generation {} is a candidate beside {}; {} network(s) bound on it", id_,
          generation_, stable_generation_, bound_);
    } else if (replaced_) {
      RuntimeLog().info("backend {}: candidate dropped; its networks' bindings on it are released",
                        id_);
    }
  }

  std::optional<BackendSlot> slot_;
  std::map<NetworkId, std::shared_ptr<const LoadedNetwork>> networks_;
  std::vector<NetworkId> hooked_;  // networks the candidate's context heard BeforeLoadNetwork of

 private:
  const uint64_t generation_;  // 0: the candidate leaves
  const uint64_t stable_generation_;
  std::size_t bound_ = 0;
  std::optional<BackendSlot> replaced_;
  const BackendSlot* placed_ = nullptr;  // the new candidate slot, once committed
};

Result<std::unique_ptr<PreparedChange>> Runtime::PrepareCandidateChange(
    const BackendChange& change) {
  const std::string& id = change.backend_id;
  std::vector<Affected> affected;
  InstanceMap instances;
  std::optional<BackendOptions> options;
  uint64_t version = 0;
  {
    MutexLock lock(mutex_);
    version = state_version_;
    instances = CurrentInstances();
    if (auto it = applied_options_.find(id); it != applied_options_.end())
      options = it->second;
    // Only networks on the active generation take part: one pinned to an older one stays there.
    if (change.next != nullptr && change.previous != nullptr) {
      for (auto& network : NetworksUsing(id)) {
        if (network.network->GenerationOn(id) == change.previous->info().number)
          affected.push_back(std::move(network));
      }
    }
  }
  auto prepared = std::make_unique<CandidateChange>(*this, version, change);
  if (change.next == nullptr)
    return std::unique_ptr<PreparedChange>(std::move(prepared));

  const uint64_t generation = change.next->info().number;
  auto refuse = [&](const std::string& why) {
    return Status(LoadReason::kPrepareFailed,
                  "backend " + id + " generation " + std::to_string(generation) + ": " + why);
  };
  auto instance = registry_->loader().CreateInstance(change.next);
  if (!instance.ok())
    return std::move(instance).error();
  auto slot = CreateSlot(instance.share(), options ? &*options : nullptr);
  if (!slot.ok())
    return refuse(slot.error().message());
  instances.insert_or_assign(id, std::move(instance).value());
  for (const auto& network : affected) {
    auto bound = Reprepare(network, instances);
    if (!bound.ok()) {
      return refuse("network " + network.network->network().name +
                    " does not prepare on it: " + bound.error().message());
    }
    prepared->networks_.emplace(network.id, std::move(bound).value());
    if (slot.value().context != nullptr) {
      Status before = GuardBackendCall(id, "BeforeLoadNetwork", [&] {
        const ScopedBackendCall hook(
            slot.value().instance->CallSite("IBackendContext::BeforeLoadNetwork"));
        return slot.value().context->BeforeLoadNetwork(network.id);
      });
      if (!before.ok()) {
        return refuse("its context refuses network " + std::to_string(network.id) + ": " +
                      before.message());
      }
      prepared->hooked_.push_back(network.id);
    }
  }
  prepared->slot_ = std::move(slot).value();
  return std::unique_ptr<PreparedChange>(std::move(prepared));
}

Status Runtime::SetRolloutTraffic(std::string_view id, const RolloutTraffic& traffic) {
  const auto routes = candidate_routes_.Load();
  const auto it = routes->find(id);
  if (it == routes->end())
    return NotFound("this runtime has no candidate generation of backend " + std::string(id));
  it->second->meter->SetTraffic(traffic);
  return Status::Ok();
}

std::optional<RolloutStats> Runtime::GetRolloutStats(std::string_view id) const {
  const auto routes = candidate_routes_.Load();
  const auto it = routes->find(id);
  if (it == routes->end())
    return std::nullopt;
  RolloutStats stats = it->second->meter->Snapshot();
  stats.backend_id = it->first;
  stats.networks = it->second->networks.size();
  return stats;
}

Result<Runtime::Routed> Runtime::Route(NetworkId id, std::string_view routing_key) const {
  auto network = FindNetwork(id);
  if (!network.ok())
    return std::move(network).error();
  return Route(id, std::move(network).value(), routing_key);
}

Runtime::Routed Runtime::Route(NetworkId id, std::shared_ptr<const LoadedNetwork> network,
                               std::string_view routing_key) const {
  Routed routed{.id = id, .network = std::move(network)};
  const auto routes = candidate_routes_.Load();
  for (const auto& [backend_id, route] : *routes) {
    const auto bound = route->networks.find(id);
    // Still on the generation the candidate was bound beside (not moved off it since).
    if (bound == route->networks.end() ||
        routed.network->GenerationOn(backend_id) != route->stable_generation)
      continue;
    routed.route = route;
    if (route->meter->ChooseCandidate(routing_key)) {
      routed.stable = std::exchange(routed.network, bound->second);
      routed.on_candidate = true;
    } else {
      routed.shadow = route->meter->SampleShadow();
    }
    break;  // one rollout per request: the first backend id (by id) that has one for it
  }
  return routed;
}

Result<std::vector<Tensor>> Runtime::ExecuteRouted(const Routed& routed,
                                                   std::span<const ConstTensorView> inputs,
                                                   std::vector<Tensor>* owned) {
  auto result =
      routed.route == nullptr ? routed.network->Execute(inputs) : ExecuteMetered(routed, inputs);
  if (!result.ok() && result.error().reason() == LoadReason::kCrashed)
    return RunAgainAfterCrash(routed, inputs, std::move(result).error());
  if (routed.shadow && result.ok()) {
    std::vector<Tensor> shadow_inputs;
    if (owned != nullptr) {
      shadow_inputs = std::move(*owned);  // the stable run is done with them
    } else {
      for (const auto& view : inputs)
        shadow_inputs.push_back(Tensor::CopyOf(view));
    }
    std::vector<Tensor> stable_outputs;
    for (const auto& output : result.value())
      stable_outputs.push_back(output);
    StartShadow(routed.route, routed.id, std::move(shadow_inputs), std::move(stable_outputs));
  }
  return result;
}

Result<std::vector<Tensor>> Runtime::ExecuteMetered(const Routed& routed,
                                                    std::span<const ConstTensorView> inputs) {
  // Judged on the backend code's time: crossings to worker processes (a sandboxed candidate's
  // every call) are left out.
  const auto start = std::chrono::steady_clock::now();
  const auto crossed_before = ThreadCrossingTime();
  auto result = routed.network->Execute(inputs);
  const double micros =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start -
                                                (ThreadCrossingTime() - crossed_before))
          .count();
  routed.route->meter->RecordExecution(routed.on_candidate, micros,
                                       result.ok() ? Status::Ok() : result.error());
  return result;
}

Result<std::vector<Tensor>> Runtime::RunAgainAfterCrash(const Routed& routed,
                                                        std::span<const ConstTensorView> inputs,
                                                        Status crash) const {
  if (on_crashed_request_)
    on_crashed_request_({.network = routed.id, .inputs = inputs, .error = crash});
  // The run again is the same request: it keeps the turn among the network's instances that its
  // first run had (NetworkOptions::instances) and takes no second one, which with one instance
  // would wait for itself.
  // A candidate's crash is the rollout's to judge (the crash supervisor rolls it back): the
  // client's request runs where it would have without the rollout.
  if (routed.on_candidate)
    return routed.stable->Execute(inputs);
  // A stable generation's: its worker is being restarted (or the build rolled back, or withdrawn
  // and the network moved along its preferences). Every such change gives the network a new
  // binding; until then there is nothing to run on but the dead worker.
  const auto until = std::chrono::steady_clock::now() + crash_retry_wait_;
  while (true) {
    auto current = FindNetwork(routed.id);
    if (!current.ok())  // unloaded meanwhile
      return crash;
    if (&*current != routed.network.get()) {
      auto again = current->Execute(inputs);
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

void Runtime::StartShadow(std::shared_ptr<const CandidateRoute> route, NetworkId id,
                          std::vector<Tensor> inputs, std::vector<Tensor> stable_outputs) {
  // A request of its own: it needs a slot like any other and never waits for one (the sample is
  // skipped). At most one per arena thread is queued or running, so that shadows can neither
  // queue work without bound nor take the slots (max_in_flight) that clients' requests need.
  // Nor does it take a turn among the network's instances (NetworkOptions::instances): it answers
  // nobody, so waiting in that queue would only delay the clients behind it, and it starts while
  // its stable request still holds its turn (with one instance it could never have one). The
  // bound above and the shadow sampling rate are what limit the cores it takes.
  const int limit = std::max(1, scheduler_.options().max_threads > 0
                                    ? scheduler_.options().max_threads
                                    : static_cast<int>(std::thread::hardware_concurrency()));
  if (!route->meter->BeginShadow(limit)) {
    route->meter->RecordShadowSkipped();
    return;
  }
  auto admission = scheduler_.Admit();
  if (!admission.ok()) {
    route->meter->EndShadow();
    route->meter->RecordShadowSkipped();
    return;
  }
  const auto bound = route->networks.find(id);
  // `this` outlives it: the scheduler, destroyed first, waits for what it runs.
  auto work = [this, route, id, candidate = bound->second, inputs = std::move(inputs),
               stable = std::move(stable_outputs)] {
    std::vector<ConstTensorView> views;
    for (const auto& tensor : inputs)
      views.push_back(tensor.View());
    auto result = candidate->Execute(views);
    // A shadow run answers nobody, but its input is a client's and may be what killed the worker.
    if (!result.ok() && result.error().reason() == LoadReason::kCrashed && on_crashed_request_)
      on_crashed_request_({.network = id, .inputs = views, .error = result.error()});
    route->meter->RecordShadow(std::move(result), stable);
    return Status::Ok();
  };
  scheduler_.Enqueue(
      std::move(admission).value(),
      [work = std::make_shared<decltype(work)>(std::move(work))] { return (*work)(); },
      [meter = route->meter](Status) { meter->EndShadow(); });  // run or not, it is over
}

}  // namespace backplane
