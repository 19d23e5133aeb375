#include "rollout_router.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "backplane/core/crossing_time.hpp"
#include "loaded_network.hpp"

namespace backplane {

RolloutRouter::RolloutRouter(std::function<void(const CrashedRequest&)> on_crashed_request)
    : on_crashed_request_(std::move(on_crashed_request)) {}

RoutedRequest RolloutRouter::RouteDuringRollout(NetworkId id,
                                                std::shared_ptr<const LoadedNetwork> network,
                                                std::string_view routing_key) const {
  RoutedRequest routed{.id = id, .network = std::move(network)};
  const auto routes = routes_.Load();
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

Result<std::vector<Tensor>> RolloutRouter::Execute(const RoutedRequest& routed,
                                                   std::span<const ConstTensorView> inputs) {
  if (routed.route == nullptr)
    return routed.network->Execute(inputs);
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

void RolloutRouter::StartShadow(scheduler::RequestScheduler& scheduler, const RoutedRequest& routed,
                                std::span<const ConstTensorView> inputs, std::vector<Tensor>* owned,
                                const std::vector<Tensor>& stable_outputs) const {
  const std::shared_ptr<const CandidateRoute>& route = routed.route;
  // A request of its own: it needs a slot like any other and never waits for one (the sample is
  // skipped). At most one per arena thread is queued or running, so that shadows can neither
  // queue work without bound nor take the slots (max_in_flight) that clients' requests need.
  // Nor does it take a turn among the network's instances (NetworkOptions::instances): it answers
  // nobody, so waiting in that queue would only delay the clients behind it, and it starts while
  // its stable request still holds its turn (with one instance it could never have one). The
  // bound above and the shadow sampling rate are what limit the cores it takes.
  const int limit = std::max(1, scheduler.options().max_threads > 0
                                    ? scheduler.options().max_threads
                                    : static_cast<int>(std::thread::hardware_concurrency()));
  if (!route->meter->BeginShadow(limit)) {
    route->meter->RecordShadowSkipped();
    return;
  }
  auto admission = scheduler.Admit();
  if (!admission.ok()) {
    route->meter->EndShadow();
    route->meter->RecordShadowSkipped();
    return;
  }
  std::vector<Tensor> shadow_inputs;
  if (owned != nullptr) {
    shadow_inputs = std::move(*owned);  // the stable run is done with them
  } else {
    for (const auto& view : inputs)
      shadow_inputs.push_back(Tensor::CopyOf(view));
  }
  const NetworkId id = routed.id;
  const auto bound = route->networks.find(id);
  // `this` outlives it: the router outlives the scheduler's requests.
  auto work = [this, route, id, candidate = bound->second, inputs = std::move(shadow_inputs),
               stable = stable_outputs] {
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
  scheduler.Enqueue(
      std::move(admission).value(),
      [work = std::make_shared<decltype(work)>(std::move(work))] { return (*work)(); },
      [meter = route->meter](Status) { meter->EndShadow(); });  // run or not, it is over
}

Status RolloutRouter::SetTraffic(std::string_view backend_id, const RolloutTraffic& traffic) const {
  const auto routes = routes_.Load();
  const auto it = routes->find(backend_id);
  if (it == routes->end()) {
    return NotFound("this runtime has no candidate generation of backend " +
                    std::string(backend_id));
  }
  it->second->meter->SetTraffic(traffic);
  return Status::Ok();
}

std::optional<RolloutStats> RolloutRouter::Stats(std::string_view backend_id) const {
  const auto routes = routes_.Load();
  const auto it = routes->find(backend_id);
  if (it == routes->end())
    return std::nullopt;
  RolloutStats stats = it->second->meter->Snapshot();
  stats.backend_id = it->first;
  stats.networks = it->second->networks.size();
  return stats;
}

void RolloutRouter::Update(const std::function<void(CandidateRoutes&)>& change) {
  MutexLock lock(update_mutex_);
  auto routes = std::make_shared<CandidateRoutes>(*routes_.Load());
  change(*routes);
  const bool under_way = !routes->empty();
  // Routes first, then the flag: a request that sees the flag set finds the routes it describes.
  // A request that still sees it clear after the last rollout ended finds no route, as before.
  routes_.Publish(std::move(routes));
  under_way_.store(under_way, std::memory_order_release);
}

}  // namespace backplane
