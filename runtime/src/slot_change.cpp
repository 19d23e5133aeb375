#include "slot_change.hpp"

#include "backplane/core/backend_call.hpp"
#include "backplane/core/backend_call_record.hpp"
#include "loaded_network.hpp"
#include "rollout_router.hpp"
#include "runtime_log.hpp"

namespace backplane {

Runtime::SlotChange::SlotChange(Runtime& runtime, Policy policy, uint64_t version,
                                const BackendChange& change)
    : runtime_(runtime),
      policy_(policy),
      version_(version),
      id_(change.backend_id),
      previous_generation_(change.previous ? change.previous->info().number : 0) {
  next_.generation = change.next ? change.next->info().number : 0;
}

void Runtime::SlotChange::BeginCommit() {
  turn_ = std::unique_lock<Mutex>(runtime_.backend_mutex_);
}

std::unique_lock<Mutex> Runtime::SlotChange::LockState() {
  return std::unique_lock<Mutex>(runtime_.mutex_);
}

bool Runtime::SlotChange::IsCurrent() const {
  runtime_.mutex_.AssertHeld();
  return runtime_.state_version_ == version_;
}

void Runtime::SlotChange::Commit() {
  runtime_.mutex_.AssertHeld();
  if (policy_ == Policy::kReplaceActive) {
    ReplaceActive();
  } else {
    BindBeside();
  }
  ++runtime_.state_version_;
}

void Runtime::SlotChange::ReplaceActive() {
  runtime_.mutex_.AssertHeld();
  runtime_.PublishMoved(next_.bindings);
  // The replaced slot (context, then instance) is released when this change is dropped, outside
  // every lock.
  if (auto it = runtime_.backends_.find(id_); it != runtime_.backends_.end()) {
    replaced_ = std::move(it->second);
    runtime_.backends_.erase(it);
  }
  // A new active generation (a promoted candidate among them) ends the id's rollout here, both
  // of its trial arms.
  if (auto it = runtime_.rollout_slots_.find(id_); it != runtime_.rollout_slots_.end()) {
    replaced_rollout_ = std::move(it->second);
    runtime_.rollout_slots_.erase(it);
    runtime_.router_->Update([&](CandidateRoutes& routes) { routes.erase(id_); });
  }
  if (next_.slot) {
    // Told in AfterCommit, which still holds the turn: the context and the networks stay.
    next_.placed = &runtime_.backends_.emplace(id_, *std::move(next_.slot)).first->second;
    next_.slot.reset();
  }
}

void Runtime::SlotChange::BindBeside() {
  runtime_.mutex_.AssertHeld();
  // Released outside every lock, when this change is dropped: the route's bindings go when the
  // last request on them ends, on the reaper.
  if (auto it = runtime_.rollout_slots_.find(id_); it != runtime_.rollout_slots_.end()) {
    replaced_rollout_ = std::move(it->second);
    runtime_.rollout_slots_.erase(it);
  }
  std::shared_ptr<CandidateRoute> route;
  if (next_.slot) {
    RolloutSlots& placed =
        runtime_.rollout_slots_.emplace(id_, RolloutSlots{.candidate = *std::move(next_.slot)})
            .first->second;
    next_.slot.reset();
    next_.placed = &placed.candidate;
    if (baseline_) {
      placed.baseline = *std::move(baseline_->slot);
      baseline_->slot.reset();
      baseline_->placed = &*placed.baseline;
    }
    route = std::make_shared<CandidateRoute>();
    route->backend_id = id_;
    route->stable_generation = previous_generation_;
    const auto arm = [](const PreparedSlot& prepared) {
      return TrialBindings{.generation = prepared.generation,
                           .instance = prepared.placed->instance,
                           .networks = prepared.bindings};
    };
    route->candidate = arm(next_);
    if (baseline_)
      route->baseline = arm(*baseline_);
    route->meter = std::make_shared<RolloutMeter>(previous_generation_, next_.generation,
                                                  route->baseline.generation);
  }
  runtime_.router_->Update([&](CandidateRoutes& routes) {
    routes.erase(id_);
    if (route != nullptr)
      routes.emplace(id_, std::move(route));
  });
}

void Runtime::SlotChange::AfterCommit() {
  // The new contexts heard BeforeLoadNetwork of their networks while this change was prepared;
  // now that they are committed they hear AfterLoadNetwork, outside every state lock.
  const bool beside = policy_ == Policy::kBindBeside;
  for (const PreparedSlot* prepared : {&next_, baseline_ ? &*baseline_ : nullptr}) {
    if (prepared == nullptr || prepared->placed == nullptr || prepared->placed->context == nullptr)
      continue;
    const BackendSlot& placed = *prepared->placed;
    const char* role = !beside ? "" : prepared == &next_ ? " candidate" : " baseline";
    for (NetworkId network_id : prepared->hooked) {
      Status after = GuardBackendCall(id_, "AfterLoadNetwork", [&] {
        const ScopedBackendCall hook(
            placed.instance->CallSite("IBackendContext::AfterLoadNetwork"));
        return placed.context->AfterLoadNetwork(network_id);
      });
      if (!after.ok()) {
        RuntimeLog().warn("backend {}{}: AfterLoadNetwork({}) failed: {}", id_, role, network_id,
                          after.message());
      }
    }
  }
  ReleaseTurn();
  const uint64_t generation = next_.generation;
  if (beside) {
    if (generation != 0 && baseline_) {
      RuntimeLog().info(
          "backend {}: generation {} is a candidate beside {} (baseline generation {}); {} "
          "network(s) bound on each",
          id_, generation, previous_generation_, baseline_->generation, next_.bindings.size());
    } else if (generation != 0) {
      RuntimeLog().info(
          "backend {}: generation {} is a candidate beside {}; {} network(s) bound on it", id_,
          generation, previous_generation_, next_.bindings.size());
    } else if (replaced_rollout_) {
      RuntimeLog().info("backend {}: candidate dropped{}; its networks' bindings on {} released",
                        id_, replaced_rollout_->baseline ? " with its baseline" : "",
                        replaced_rollout_->baseline ? "both are" : "it are");
    }
  } else if (generation == 0) {
    for (const auto& [network_id, network] : next_.bindings)
      RuntimeLog().info("network {} moved off withdrawn backend {}", network->network().name, id_);
  } else if (previous_generation_ != 0) {
    RuntimeLog().info("backend {}: generation {} replaces {}; {} network(s) moved ({})", id_,
                      generation, previous_generation_, next_.bindings.size(),
                      runtime_.swap_policy_ == SwapPolicy::kMigrate ? "migrate" : "pin");
  }
}

Status Runtime::SlotChange::PrepareSlot(
    PreparedSlot& into, const loader::GenerationLease& generation, std::string_view label,
    const std::vector<Affected>& affected, InstanceMap instances, const BackendOptions* options,
    const SwapValidation* validation, const std::vector<NetworkId>& hooked) {
  into.generation = generation->info().number;
  auto refuse = [&](LoadReason reason, const std::string& why) {
    return Status(reason, "backend " + id_ + " " + std::string(label) + " " +
                              std::to_string(into.generation) + ": " + why);
  };
  auto instance = runtime_.registry_->loader().CreateInstance(generation);
  if (!instance.ok())
    return std::move(instance).error();
  auto slot = CreateSlot(instance.share(), options);
  if (!slot.ok())
    return refuse(LoadReason::kPrepareFailed, slot.error().message());
  instances.insert_or_assign(id_, std::move(instance).value());

  // Every network concerned prepared now, so that the commit is one pointer store each.
  for (const auto& network : affected) {
    auto bound = runtime_.Reprepare(network, instances);
    if (!bound.ok()) {
      return refuse(LoadReason::kPrepareFailed,
                    "network " + network.network->network().name +
                        " does not prepare on it: " + bound.error().message());
    }
    if (validation != nullptr) {
      Status valid = runtime_.ValidateOnProbe(*network.network, *bound, id_, validation->tolerance);
      if (!valid.ok())
        return refuse(LoadReason::kValidationFailed, valid.message());
    }
    into.bindings.emplace(network.id, std::move(bound).value());
  }
  if (slot.value().context != nullptr) {
    for (NetworkId network_id : hooked) {
      Status before = GuardBackendCall(id_, "BeforeLoadNetwork", [&] {
        const ScopedBackendCall hook(
            slot.value().instance->CallSite("IBackendContext::BeforeLoadNetwork"));
        return slot.value().context->BeforeLoadNetwork(network_id);
      });
      if (!before.ok()) {
        return refuse(
            LoadReason::kPrepareFailed,
            "its context refuses network " + std::to_string(network_id) + ": " + before.message());
      }
      into.hooked.push_back(network_id);
    }
  }
  into.slot = std::move(slot).value();
  return Status::Ok();
}

// The one prepare path of every slot change; the policy decides which networks it concerns, and
// whether a new binding is validated (a migration replaces what clients get; a candidate's
// bindings are judged by its rollout instead).
Result<std::unique_ptr<PreparedChange>> Runtime::PrepareChange(const BackendChange& change) {
  using Policy = SlotChange::Policy;
  const Policy policy = change.target == BackendChange::Target::kCandidate ? Policy::kBindBeside
                                                                           : Policy::kReplaceActive;
  const std::string& id = change.backend_id;
  // What the change is prepared against, read under the lock. Everything that calls backend
  // code runs after it is released.
  std::vector<Affected> affected;
  std::vector<NetworkId> all_networks;
  InstanceMap instances;
  std::optional<BackendOptions> options;
  uint64_t version = 0;
  {
    MutexLock lock(mutex_);
    version = state_version_;
    instances = CurrentInstances();
    if (auto it = applied_options_.find(id); it != applied_options_.end())
      options = it->second;
    if (policy == Policy::kReplaceActive) {
      // A withdrawal moves every network off the id; a new generation moves them onto it
      // (kMigrate), including networks left on a withdrawn generation now that its file is back.
      // The new context hears of every network loaded.
      for (const auto& [network_id, network] : *networks_.Load())
        all_networks.push_back(network_id);
      if (change.next == nullptr || swap_policy_ == SwapPolicy::kMigrate)
        affected = NetworksUsing(id);
    } else if (change.next != nullptr && change.previous != nullptr) {
      // Only networks on the active generation take part: one pinned to an older one stays there.
      for (auto& network : NetworksUsing(id)) {
        if (network.network->GenerationOn(id) == change.previous->info().number)
          affected.push_back(std::move(network));
      }
    }
  }
  auto prepared = std::make_unique<SlotChange>(*this, policy, version, change);

  if (change.next == nullptr) {
    // A withdrawal: each network moved along its preferences where it can be. (A candidate
    // leaving concerns no network: its bindings go with its route.)
    instances.erase(id);
    for (const auto& network : affected) {
      auto moved = Reprepare(network, instances);
      if (!moved.ok()) {
        RuntimeLog().warn("network {} keeps running on withdrawn backend {} (generation {}): {}",
                          network.network->network().name, id, network.network->GenerationOn(id),
                          moved.error().message());
        continue;
      }
      prepared->next_.bindings.emplace(network.id, std::move(moved).value());
    }
    return std::unique_ptr<PreparedChange>(std::move(prepared));
  }

  if (policy == Policy::kBindBeside) {
    for (const auto& network : affected)
      all_networks.push_back(network.id);
  }
  const auto validation =
      policy == Policy::kReplaceActive ? swap_validation_.find(id) : swap_validation_.end();
  const BackendOptions* applied = options ? &*options : nullptr;
  BACKPLANE_RETURN_IF_ERROR(prepared->PrepareSlot(
      prepared->next_, change.next, "generation", affected, instances, applied,
      validation != swap_validation_.end() ? &validation->second : nullptr, all_networks));
  // The rollout's baseline: the stable build beside the candidate, prepared exactly as the
  // candidate is (it is judged against it), and refusing the change as the candidate would.
  if (policy == Policy::kBindBeside && change.baseline != nullptr) {
    // Assigned, not emplace()d: clang 14 decides whether a nested struct with member
    // initializers is default-constructible before its enclosing class is complete, and no.
    prepared->baseline_ = SlotChange::PreparedSlot{};
    BACKPLANE_RETURN_IF_ERROR(prepared->PrepareSlot(*prepared->baseline_, change.baseline,
                                                    "baseline generation", affected, instances,
                                                    applied, nullptr, all_networks));
  }
  return std::unique_ptr<PreparedChange>(std::move(prepared));
}

}  // namespace backplane
