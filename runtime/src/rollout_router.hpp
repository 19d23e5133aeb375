// The request path's side of progressive rollouts: which binding of a network a request runs on
// while a backend id it uses has a candidate generation, the measuring of those requests, and the
// shadow runs. Owns the rollouts' routes; knows nothing of the Runtime that publishes them (the
// runtime's slot changes bind networks on a candidate and hand the route over here). Private to
// the runtime.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "backplane/core/published.hpp"
#include "backplane/core/tensor.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/runtime/runtime.hpp"
#include "backplane/scheduler/request_scheduler.hpp"
#include "rollout_meter.hpp"

namespace backplane {

// Which binding a request runs on: the network's own, or one of a rollout's trial bindings of it
// (the candidate's or the baseline's), and whether it is also run on the candidate in shadow.
struct RoutedRequest {
  NetworkId id = 0;
  std::shared_ptr<const LoadedNetwork> network;
  std::shared_ptr<const CandidateRoute> route;  // null: no rollout concerns this request
  RolloutArm arm = RolloutArm::kStable;
  bool shadow = false;  // only on the stable arm
  // The binding the request would have had without the rollout (set on a trial arm): where a
  // trial arm's crash is run again.
  std::shared_ptr<const LoadedNetwork> stable;
  // RolloutRouter's option epoch when the request was routed: a shadow run is compared only when
  // no option update began or was under way since (its stable run and its shadow run may
  // otherwise have seen different values of an option that changes outputs).
  uint64_t options_epoch = 0;
  // The call's per-call options (Runtime::CallOptions), null when none; owned by the caller for
  // the request's run. Every binding the request runs on gets them, a shadow run a copy.
  const CallOptions* call_options = nullptr;
};

// Runs rollouts' shadow runs one after another on a thread of its own, started with the first
// and outside the runtime's arena: a shadow run answers nobody, so it must hold none of the
// threads or request slots that clients' requests need. Its parallel kernels run serially (a
// one-slot arena of its own), so a candidate that burns cores takes one at most, and only while
// its one run lasts. Why not a lower priority too: at nice 19 on a machine whose other
// processes kept the cores busy, the thread got so little time that a rollout gathered a
// handful of samples a second, and a canary request waiting for a lock of the candidate's that
// a shadow run held would have waited on that starved thread. Thread-safe.
class ShadowRunner {
 public:
  // Called with true to run, or with false when dropped unrun (the runner is being destroyed).
  using Run = std::function<void(bool run)>;
  ShadowRunner() = default;
  // Drops the queued runs and waits for the running one.
  ~ShadowRunner();
  ShadowRunner(const ShadowRunner&) = delete;
  ShadowRunner& operator=(const ShadowRunner&) = delete;

  void Post(Run run) BACKPLANE_EXCLUDES(mutex_);

 private:
  void Loop() BACKPLANE_EXCLUDES(mutex_);

  Mutex mutex_;
  std::condition_variable_any wake_;  // waits on mutex_ itself
  // At most one per rollout: RolloutMeter::BeginShadow bounds it.
  std::deque<Run> queue_ BACKPLANE_GUARDED_BY(mutex_);
  bool stopping_ BACKPLANE_GUARDED_BY(mutex_) = false;
  std::thread thread_ BACKPLANE_GUARDED_BY(mutex_);  // started by the first Post
};

// Thread-safe. Route and Execute are the request path: with no rollout under way, Route is one
// atomic load and hands the network back as it came. The control plane (the runtime's commits and
// option updates) changes the routes with Update, copy-modify-publish, one change at a time.
class RolloutRouter {
 public:
  // `on_crashed_request`: told of a shadow run whose candidate worker died (RuntimeOptions::
  // on_crashed_request); may be empty.
  explicit RolloutRouter(std::function<void(const CrashedRequest&)> on_crashed_request);

  // The option epoch now: read before a request takes its network binding, and given to Route.
  uint64_t options_epoch() const { return options_epoch_.load(std::memory_order_seq_cst); }

  // Whether request `id`, about to run on `network`, runs on a candidate instead, and whether it
  // is shadowed; `routing_key` keeps a request id on one generation (RolloutMeter).
  // `options_epoch`: options_epoch() from before `network` was read (a request may keep a binding
  // from before an option update and be routed after it: its shadow run must not be compared).
  RoutedRequest Route(NetworkId id, std::shared_ptr<const LoadedNetwork> network,
                      std::string_view routing_key, uint64_t options_epoch) const {
    // The no-rollout case: every request of a runtime without a candidate pays this load and no
    // more (no lock, no reference count). A request that reads it just before a candidate is
    // published runs on the stable binding, as one that started a moment earlier would.
    if (!under_way_.load(std::memory_order_acquire))
      return {.id = id, .network = std::move(network)};
    return RouteDuringRollout(id, std::move(network), routing_key, options_epoch);
  }

  // Runs a routed request on its binding: measured on its arm when it has a rollout (the backend
  // code's time, without crossings to a worker process; in `micros` when not null). A baseline
  // run whose worker died (kCrashed) loses the rollout its baseline: nothing more is routed to
  // it; the caller runs the request again as it does a candidate's.
  static Result<std::vector<Tensor>> Execute(const RoutedRequest& routed,
                                             std::span<const ConstTensorView> inputs,
                                             double* micros = nullptr);
  // After a successful stable run of a request sampled for shadowing (routed.shadow), which took
  // `stable_micros`: its run on the candidate, on the shadow runner, compared with
  // `stable_outputs` and never answered. `inputs` owned by the caller (`owned` null) are copied;
  // `owned` ones are moved from. Skipped (and counted) while the rollout's previous shadow run is
  // queued or running, or when `scheduler` has a client request waiting for a thread (the
  // sampled request, which is done, not counted).
  void StartShadow(const scheduler::RequestScheduler& scheduler, const RoutedRequest& routed,
                   std::span<const ConstTensorView> inputs, std::vector<Tensor>* owned,
                   const std::vector<Tensor>& stable_outputs, double stable_micros) const;

  // Around an option update (backend or network options): the shadow runs of requests routed
  // before it ended are not compared (counted as skipped), since the two generations' instances
  // and bindings are updated one after the other. Called by the control plane, one update at a
  // time.
  void BeginOptionUpdate() { options_epoch_.fetch_add(1, std::memory_order_seq_cst); }
  void EndOptionUpdate() { options_epoch_.fetch_add(1, std::memory_order_seq_cst); }

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
                                   std::string_view routing_key, uint64_t options_epoch) const;

  const std::function<void(const CrashedRequest&)> on_crashed_request_;
  // Odd while an option update is under way (Begin/EndOptionUpdate).
  std::atomic<uint64_t> options_epoch_{0};
  // Set after the routes it describes are published: true while any backend id has a rollout.
  std::atomic<bool> under_way_{false};
  Published<CandidateRoutes> routes_;
  // Serialises Update: two commits must not publish copies of the same routes.
  Mutex update_mutex_;
  // Last: destroyed first, waiting for a running shadow run while what it uses still lives.
  mutable ShadowRunner shadow_runner_;
};

}  // namespace backplane
