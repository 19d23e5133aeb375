#include "rollout_router.hpp"

#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>
#include <utility>

#include "backplane/core/crossing_time.hpp"
#include "backplane/core/thread_name.hpp"
#include "loaded_network.hpp"
#include "runtime_log.hpp"

namespace backplane {

ShadowRunner::~ShadowRunner() {
  std::thread thread;
  std::deque<Run> dropped;
  {
    MutexLock lock(mutex_);
    stopping_ = true;
    dropped.swap(queue_);
    thread = std::move(thread_);
  }
  wake_.notify_all();
  for (Run& run : dropped)
    run(false);
  if (thread.joinable())
    thread.join();
}

void ShadowRunner::Post(Run run) {
  {
    MutexLock lock(mutex_);
    if (!stopping_) {
      queue_.push_back(std::move(run));
      if (!thread_.joinable())
        thread_ = std::thread([this] { Loop(); });
      wake_.notify_one();
      return;
    }
  }
  run(false);  // the runner is going
}

void ShadowRunner::Loop() {
  NameThisThread("bp-shadow");
  // One slot, this thread's: a shadow run's parallel kernels (IHost::ParallelFor) run serially
  // here instead of taking the runtime arena's workers.
  tbb::task_arena arena(/*max_concurrency=*/1, /*reserved_for_masters=*/1);
  while (true) {
    Run run;
    {
      MutexLock lock(mutex_);
      while (!stopping_ && queue_.empty())
        wake_.wait(mutex_);
      if (stopping_)
        return;  // the destructor drops what is queued
      run = std::move(queue_.front());
      queue_.pop_front();
    }
    // Host code (backend calls catch their own): an exception here would end the process.
    try {
      arena.execute([&] { run(true); });
    } catch (const std::exception& e) {
      RuntimeLog().error("shadow run threw: {}", e.what());
    }
  }
}

namespace {

// A rollout's shadow run claimed (RolloutMeter::BeginShadow), given back on every way out of the
// run, a throw included (the runner catches and logs it): a claim never given back would end the
// rollout's shadow runs for good. A run that started and ends without its outcome recorded (it
// threw) is counted as skipped and its clock stopped, so that it is neither missing from the
// counts nor taken for a timeout later.
class ShadowClaim {
 public:
  explicit ShadowClaim(RolloutMeter& meter) : meter_(meter) {}
  ~ShadowClaim() {
    if (running_)
      meter_.ShadowDiscarded(0);
    meter_.EndShadow();
  }
  ShadowClaim(const ShadowClaim&) = delete;
  ShadowClaim& operator=(const ShadowClaim&) = delete;

  // The run starts now: its timeout counts from here (RolloutMeter::ShadowStarted).
  void Start() {
    meter_.ShadowStarted();
    running_ = true;
  }
  // Its outcome was recorded (RecordShadow or ShadowDiscarded).
  void Recorded() { running_ = false; }

 private:
  RolloutMeter& meter_;
  bool running_ = false;
};

// A run on the rollout's baseline failed: a crash (its worker died) loses the baseline.
void NoteBaselineFailure(const CandidateRoute& route, const Status& error) {
  if (error.reason() == LoadReason::kCrashed && route.meter->LoseBaseline()) {
    RuntimeLog().warn(
        "backend {}: baseline generation {} crashed; its share runs on the stable generation {} "
        "from now on, and the candidate is judged against that: {}",
        route.backend_id, route.baseline.generation, route.stable_generation, error.message());
  }
}

}  // namespace

RolloutRouter::RolloutRouter(std::function<void(const CrashedRequest&)> on_crashed_request)
    : on_crashed_request_(std::move(on_crashed_request)) {}

RoutedRequest RolloutRouter::RouteDuringRollout(NetworkId id,
                                                std::shared_ptr<const LoadedNetwork> network,
                                                std::string_view routing_key,
                                                uint64_t options_epoch) const {
  RoutedRequest routed{.id = id, .network = std::move(network)};
  routed.options_epoch = options_epoch;
  const auto routes = routes_.Load();
  for (const auto& [backend_id, route] : *routes) {
    // Still on the generation the trial arms were bound beside (not moved off it since).
    if (!route->candidate.networks.contains(id) ||
        routed.network->GenerationOn(backend_id) != route->stable_generation)
      continue;
    routed.route = route;
    routed.arm = route->meter->ChooseArm(routing_key);
    if (routed.arm == RolloutArm::kStable) {
      routed.shadow = route->meter->SampleShadow();
    } else {
      // Both trial arms bind the same networks (Runtime::PrepareChange); were one to lack it,
      // the request would stay on its stable binding.
      const auto& trial = route->trial(routed.arm).networks;
      const auto on_trial = trial.find(id);
      if (on_trial != trial.end())
        routed.stable = std::exchange(routed.network, on_trial->second);
      else
        routed.arm = RolloutArm::kStable;
    }
    break;  // one rollout per request: the first backend id (by id) that has one for it
  }
  return routed;
}

Result<std::vector<Tensor>> RolloutRouter::Execute(const RoutedRequest& routed,
                                                   std::span<const ConstTensorView> inputs,
                                                   double* micros_out) {
  if (routed.route == nullptr)
    return routed.network->Execute(inputs, routed.call_options);
  // Judged on the backend code's time: crossings to worker processes (a sandboxed candidate's
  // every call) are left out.
  const auto start = std::chrono::steady_clock::now();
  const auto crossed_before = ThreadCrossingTime();
  auto result = routed.network->Execute(inputs, routed.call_options);
  const double micros =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start -
                                                (ThreadCrossingTime() - crossed_before))
          .count();
  if (micros_out != nullptr)
    *micros_out = micros;
  RolloutMeter& meter = *routed.route->meter;
  meter.RecordExecution(routed.arm, micros, result.ok() ? Status::Ok() : result.error());
  if (routed.arm == RolloutArm::kBaseline && !result.ok())
    NoteBaselineFailure(*routed.route, result.error());
  return result;
}

void RolloutRouter::StartShadow(const scheduler::RequestScheduler& scheduler,
                                const RoutedRequest& routed,
                                std::span<const ConstTensorView> inputs, std::vector<Tensor>* owned,
                                const std::vector<Tensor>& stable_outputs,
                                double stable_micros) const {
  const std::shared_ptr<const CandidateRoute>& route = routed.route;
  // Only capacity that no client request is waiting for: the requests admitted besides this one
  // (running, queued in the arena, or waiting for a network's turn) must leave an arena thread
  // idle. Checked when the run is queued; the runner's low priority covers the load that comes
  // while it runs. And one at a time per rollout, so that a slow candidate costs one run's
  // worth, whatever the sampling rate.
  const int threads = std::max(1, scheduler.options().max_threads > 0
                                      ? scheduler.options().max_threads
                                      : static_cast<int>(std::thread::hardware_concurrency()));
  // An option update began since the request was routed, or was under way then.
  const bool options_changed =
      routed.options_epoch % 2 != 0 ||
      options_epoch_.load(std::memory_order_seq_cst) != routed.options_epoch;
  if (options_changed || scheduler.in_flight() > static_cast<std::size_t>(threads) ||
      !route->meter->BeginShadow()) {
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
  const auto bound = route->candidate.networks.find(id);
  // The same input runs on the baseline after the candidate, its outcome unused: a shadow run
  // warms the candidate's code and data, and a canary judges the candidate against a baseline
  // that must be as warm (without this, at a 1 % share the candidate ran ten times as often as
  // the baseline and read faster than the same build).
  const auto on_baseline = route->baseline.networks.find(id);
  std::shared_ptr<const LoadedNetwork> baseline =
      on_baseline != route->baseline.networks.end() ? on_baseline->second : nullptr;
  // `this` outlives it: the runner is the router's, and its destructor waits for a running one.
  auto work = [this, route, id, candidate = bound->second, baseline = std::move(baseline),
               inputs = std::move(shadow_inputs), stable = stable_outputs, stable_micros,
               epoch = routed.options_epoch,
               call_options = routed.call_options != nullptr ? *routed.call_options
                                                             : CallOptions{}](bool run) {
    ShadowClaim claim(*route->meter);
    if (!run)
      return;
    std::vector<ConstTensorView> views;
    for (const auto& tensor : inputs)
      views.push_back(tensor.View());
    claim.Start();
    const auto start = std::chrono::steady_clock::now();
    const auto crossed_before = ThreadCrossingTime();
    auto result = candidate->Execute(views, &call_options);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    const double micros =
        std::chrono::duration<double, std::micro>(elapsed - (ThreadCrossingTime() - crossed_before))
            .count();
    // A shadow run answers nobody, but its input is a client's and may be what killed the worker.
    if (!result.ok() && result.error().reason() == LoadReason::kCrashed && on_crashed_request_)
      on_crashed_request_({.network = id, .inputs = views, .error = result.error()});
    const double elapsed_micros = std::chrono::duration<double, std::micro>(elapsed).count();
    if (options_epoch_.load(std::memory_order_seq_cst) != epoch)
      route->meter->ShadowDiscarded(elapsed_micros);  // the runs may have seen other values
    else
      route->meter->RecordShadow(result, stable, micros, stable_micros, elapsed_micros);
    claim.Recorded();
    if (baseline != nullptr && !route->meter->baseline_lost()) {
      auto warmed = baseline->Execute(views, &call_options);
      if (!warmed.ok()) {
        if (warmed.error().reason() == LoadReason::kCrashed && on_crashed_request_)
          on_crashed_request_({.network = id, .inputs = views, .error = warmed.error()});
        NoteBaselineFailure(*route, warmed.error());
      }
    }
  };
  shadow_runner_.Post(
      [work = std::make_shared<decltype(work)>(std::move(work))](bool run) { (*work)(run); });
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
  stats.networks = it->second->candidate.networks.size();
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
