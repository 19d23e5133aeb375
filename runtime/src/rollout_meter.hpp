// One rollout's draws and counters (RolloutMeter: which generation a request runs on, whether it
// is shadowed, and what the rollout is judged by) and its route, the candidate bindings the
// RolloutRouter sends requests to. Private to the runtime.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/core/tensor.hpp"
#include "backplane/runtime/rollout.hpp"
#include "backplane/sdk/backend.hpp"

namespace backplane {

class LoadedNetwork;

// How far two runs' outputs are apart (a shadow sample, or the swap-validation probe).
struct OutputDivergence {
  bool shapes_differ = false;
  double max_abs = 0;
  double max_relative = 0;  // max_abs over the largest magnitude of the expected outputs
  bool argmax_differs = false;
};
// The largest difference between two outputs of the same type and shape (NaN against NaN is 0,
// NaN against a number infinite).
double MaxDifference(const Tensor& a, const Tensor& b);
OutputDivergence CompareOutputs(std::span<const Tensor> expected, std::span<const Tensor> actual);

// Thread-safe: lock-free counters, written by every request of the rollout, read by snapshots.
class RolloutMeter {
 public:
  RolloutMeter(uint64_t stable_generation, uint64_t candidate_generation);

  void SetTraffic(const RolloutTraffic& traffic);
  RolloutTraffic traffic() const;

  // A request's generation: with a key, the same key gets the same answer while the share stays
  // (and keeps it as the share grows); without, a fresh draw.
  bool ChooseCandidate(std::string_view key) const;
  // Whether a request that ran on the stable generation is also run in shadow.
  bool SampleShadow() const;

  void RecordExecution(bool on_candidate, double micros, const Status& status);
  void RecordShadowSkipped();
  // At most one shadow run of a rollout is queued or running: BeginShadow claims it (false when
  // it is taken), EndShadow gives it back, run or not. A slow candidate then costs one run at a
  // time however many requests are sampled.
  bool BeginShadow();
  void EndShadow();
  // The claimed shadow run starts now: its timeout counts from here.
  void ShadowStarted();
  // The shadow run ran but is not compared: counted as skipped (its timeout still counts).
  void ShadowDiscarded(double elapsed_micros);
  // `candidate` failed where the stable run did not: an error; else compared. `candidate_micros`
  // and `stable_micros`: the backend code's time of the shadow run and of the stable run of the
  // same request; `elapsed_micros`, the shadow run's wall time, judged against the timeout.
  void RecordShadow(const Result<std::vector<Tensor>>& candidate, const std::vector<Tensor>& stable,
                    double candidate_micros, double stable_micros, double elapsed_micros);

  // Also counts the running shadow run as timed out once it is past its timeout (so a hung
  // candidate shows before it returns, if it ever does).
  RolloutStats Snapshot() const;

 private:
  struct Arm {
    explicit Arm(uint64_t generation) : generation(generation) {}
    const uint64_t generation;
    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> errors{0};
    std::array<std::atomic<uint64_t>, LatencyHistogram::kBuckets> latency{};
  };
  static void RaiseTo(std::atomic<double>& maximum, double value);
  using Histogram = std::array<std::atomic<uint64_t>, LatencyHistogram::kBuckets>;
  static LatencyHistogram Read(const Histogram& histogram);
  // The shadow run is over: counted as timed out when past the timeout, unless already.
  void StopShadowClock(double elapsed_micros);
  // Counts the running shadow run as timed out when it is past the timeout and not yet counted.
  void CountOverdueShadow() const;

  std::atomic<uint32_t> candidate_basis_points_{0};  // of 10000
  std::atomic<uint32_t> shadow_basis_points_{0};
  std::atomic<double> shadow_tolerance_{0};
  Arm stable_;
  Arm candidate_;
  std::atomic<double> shadow_timeout_ms_{RolloutTraffic{}.shadow_timeout_ms};
  std::atomic<bool> shadow_in_flight_{false};
  // When the running shadow run started (steady clock, ns); 0: none running; kShadowCounted: it
  // was counted as timed out already (by a snapshot, while it ran). Exchanged, so that each run
  // is counted at most once and the count only grows (windows are differences of snapshots).
  static constexpr int64_t kShadowCounted = -1;
  mutable std::atomic<int64_t> shadow_started_ns_{0};
  mutable std::atomic<uint64_t> shadow_timeouts_{0};
  std::atomic<uint64_t> shadow_slower_{0};
  Histogram shadow_latency_{};
  Histogram shadow_stable_latency_{};
  std::atomic<uint64_t> shadow_samples_{0};
  std::atomic<uint64_t> shadow_errors_{0};
  std::atomic<uint64_t> shadow_skipped_{0};
  std::atomic<uint64_t> shadow_diverged_{0};
  std::atomic<uint64_t> shadow_argmax_{0};
  std::atomic<double> shadow_max_abs_{0};
  std::atomic<double> shadow_max_relative_{0};
};

// One backend id's rollout as the request path sees it: immutable once published (the meter's
// counters aside). Holds the candidate bindings: the last request using one releases it.
struct CandidateRoute {
  std::string backend_id;
  uint64_t stable_generation = 0;
  uint64_t candidate_generation = 0;
  std::map<NetworkId, std::shared_ptr<const LoadedNetwork>> networks;  // bound on the candidate
  std::shared_ptr<RolloutMeter> meter;
};
using CandidateRoutes = std::map<std::string, std::shared_ptr<const CandidateRoute>, std::less<>>;

}  // namespace backplane
