// One rollout's draws and counters (RolloutMeter: which arm a request runs on, whether it is
// shadowed, and what the rollout is judged by) and its route, the trial arms' bindings the
// RolloutRouter sends requests to. Private to the runtime.
#pragma once

#include <array>
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
namespace loader {
class BackendInstance;
}

// Where a request of a rollout runs: the stable generation, or one of the two trial arms beside
// it, the candidate and its baseline (the stable build loaded again and placed as the candidate
// is, so that the candidate is compared with the same code under the same conditions).
enum class RolloutArm { kStable, kCandidate, kBaseline };
// "stable", "candidate" or "baseline": how logs and messages name an arm.
std::string_view ArmName(RolloutArm arm);

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
  // `baseline_generation` 0: the rollout has no baseline (its share is ignored).
  RolloutMeter(uint64_t stable_generation, uint64_t candidate_generation,
               uint64_t baseline_generation = 0);

  // candidate_percent + baseline_percent is clamped to 100, the candidate's share first.
  void SetTraffic(const RolloutTraffic& traffic);
  RolloutTraffic traffic() const;

  // A request's arm: one point in [0, 10000) per request, the candidate's share at the bottom,
  // the baseline's above it, the stable generation's the rest. With a key, the same key gets the
  // same point, so it keeps its arm while the shares stay, and a key on the candidate stays
  // there as its share grows; without, a fresh draw. A lost baseline's share goes to the stable
  // generation.
  RolloutArm ChooseArm(std::string_view key) const;
  // Whether a request that ran on the stable generation is also run in shadow.
  bool SampleShadow() const;

  void RecordExecution(RolloutArm arm, double micros, const Status& status);
  // The baseline's worker died: nothing more is routed to it (its numbers stop, and the
  // candidate is judged against the stable generation). True for the call that lost it.
  bool LoseBaseline();
  bool baseline_lost() const { return baseline_lost_.load(std::memory_order_acquire); }
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

  Arm& ArmOf(RolloutArm arm);

  // Both shares in one word (the candidate's in the low half, the baseline's in the high), basis
  // points of 10000: a request reads them together, so that it never sees one share of an
  // update with the other share of the one before (their sum over 100 %).
  std::atomic<uint64_t> shares_{0};
  std::atomic<bool> baseline_lost_{false};
  std::atomic<uint32_t> shadow_basis_points_{0};
  std::atomic<double> shadow_tolerance_{0};
  Arm stable_;
  Arm candidate_;
  Arm baseline_;
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

// One trial arm of a rollout (the candidate, or its baseline): a generation of the id beside the
// stable one, this runtime's instance of it, and the networks bound on it. The two arms are
// built, bound and updated alike; only the share and the judging tell them apart.
struct TrialBindings {
  uint64_t generation = 0;  // 0: the arm is absent (a rollout without a baseline)
  std::shared_ptr<loader::BackendInstance> instance;
  std::map<NetworkId, std::shared_ptr<const LoadedNetwork>> networks;
};

// One backend id's rollout as the request path sees it: immutable once published (the meter's
// counters aside). Holds the trial arms' bindings: the last request using one releases it.
struct CandidateRoute {
  std::string backend_id;
  uint64_t stable_generation = 0;
  TrialBindings candidate;
  TrialBindings baseline;
  std::shared_ptr<RolloutMeter> meter;

  // The trial arms this rollout has, the candidate first: what code that treats them alike
  // (option updates, rebinding) loops over.
  std::span<const RolloutArm> trial_arms() const {
    static constexpr std::array kBoth{RolloutArm::kCandidate, RolloutArm::kBaseline};
    return std::span(kBoth).first(baseline.generation != 0 ? 2 : 1);
  }
  // kCandidate or kBaseline.
  const TrialBindings& trial(RolloutArm arm) const {
    return arm == RolloutArm::kBaseline ? baseline : candidate;
  }
  TrialBindings& trial(RolloutArm arm) {
    return arm == RolloutArm::kBaseline ? baseline : candidate;
  }
};
using CandidateRoutes = std::map<std::string, std::shared_ptr<const CandidateRoute>, std::less<>>;

}  // namespace backplane
