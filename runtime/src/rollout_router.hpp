// The request path's side of progressive rollouts: which binding of a network a request runs on
// while a backend id it uses has a candidate generation, the measuring of those requests, and the
// shadow runs. Owns the rollouts' routes; knows nothing of the Runtime that publishes them (the
// runtime's slot changes bind networks on a candidate and hand the route over here). Private to
// the runtime.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "backplane/core/published.hpp"
#include "backplane/core/tensor.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/runtime/runtime.hpp"
#include "backplane/scheduler/request_scheduler.hpp"
#include "rollout_meter.hpp"

namespace backplane {

// Which binding a request runs on: the network's own, or a rollout's candidate binding of it, and
// whether it is also run on the candidate in shadow.
struct RoutedRequest {
  NetworkId id = 0;
  std::shared_ptr<const LoadedNetwork> network;
  std::shared_ptr<const CandidateRoute> route;  // null: no rollout concerns this request
  bool on_candidate = false;
  bool shadow = false;
  // The binding the request would have had without the rollout (set when on_candidate): where a
  // candidate's crash is run again.
  std::shared_ptr<const LoadedNetwork> stable;
};

// Thread-safe. Route and Execute are the request path: with no rollout under way, Route is one
// atomic load and hands the network back as it came. The control plane (the runtime's commits and
// option updates) changes the routes with Update, copy-modify-publish, one change at a time.
class RolloutRouter {
 public:
  // `on_crashed_request`: told of a shadow run whose candidate worker died (RuntimeOptions::
  // on_crashed_request); may be empty.
  explicit RolloutRouter(std::function<void(const CrashedRequest&)> on_crashed_request);

  // Whether request `id`, about to run on `network`, runs on a candidate instead, and whether it
  // is shadowed; `routing_key` keeps a request id on one generation (RolloutMeter).
  RoutedRequest Route(NetworkId id, std::shared_ptr<const LoadedNetwork> network,
                      std::string_view routing_key) const {
    // The no-rollout case: every request of a runtime without a candidate pays this load and no
    // more (no lock, no reference count). A request that reads it just before a candidate is
    // published runs on the stable binding, as one that started a moment earlier would.
    if (!under_way_.load(std::memory_order_acquire))
      return {.id = id, .network = std::move(network)};
    return RouteDuringRollout(id, std::move(network), routing_key);
  }

  // Runs a routed request on its binding: measured for its rollout when it has one (the backend
  // code's time, without crossings to a worker process).
  static Result<std::vector<Tensor>> Execute(const RoutedRequest& routed,
                                             std::span<const ConstTensorView> inputs);
  // After a successful stable run of a request sampled for shadowing (routed.shadow): queues its
  // run on the candidate in `scheduler` as a request of its own, compared with `stable_outputs`
  // and never answered. `inputs` owned by the caller (`owned` null) are copied; `owned` ones are
  // moved from. Skipped (and counted) when no slot is free. The router must outlive `scheduler`'s
  // requests.
  void StartShadow(scheduler::RequestScheduler& scheduler, const RoutedRequest& routed,
                   std::span<const ConstTensorView> inputs, std::vector<Tensor>* owned,
                   const std::vector<Tensor>& stable_outputs) const;

  // kNotFound when backend `backend_id` has no rollout here.
  Status SetTraffic(std::string_view backend_id, const RolloutTraffic& traffic) const;
  std::optional<RolloutStats> Stats(std::string_view backend_id) const;

  // The routes now, by backend id (a snapshot: what an update copies from).
  std::shared_ptr<const CandidateRoutes> routes() const { return routes_.Load(); }
  // Copies the routes, lets `change` edit the copy (begin, end or rebind a rollout) and publishes
  // it; requests started before keep the routes they read. The replaced routes (and the candidate
  // bindings only they held) are released by the last request using them.
  void Update(const std::function<void(CandidateRoutes&)>& change)
      BACKPLANE_EXCLUDES(update_mutex_);

 private:
  RoutedRequest RouteDuringRollout(NetworkId id, std::shared_ptr<const LoadedNetwork> network,
                                   std::string_view routing_key) const;

  const std::function<void(const CrashedRequest&)> on_crashed_request_;
  // Set after the routes it describes are published: true while any backend id has a rollout.
  std::atomic<bool> under_way_{false};
  Published<CandidateRoutes> routes_;
  // Serialises Update: two commits must not publish copies of the same routes.
  Mutex update_mutex_;
};

}  // namespace backplane
