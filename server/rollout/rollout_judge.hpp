// The verdict on one window of a progressive rollout (docs/hot-reload.md, "Progressive
// rollout"): does the candidate generation fail more, or run slower, than the stable one, beyond
// what the policy tolerates and beyond what chance explains? A pure function of the numbers the
// runtime measured: no clock, no threads, no state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "backplane/runtime/rollout.hpp"
#include "config/rollout_policy.hpp"

namespace backplane::server {

// What is being judged: shadow runs (errors, and latency against the same requests' stable runs
// when measured, failing only a candidate twice as slow or worse: a shadow run runs on idle
// capacity after its stable run, so finer differences are not comparable) or a canary step's
// requests (errors and latency).
enum class JudgedPhase { kShadow, kCanary };

// The arm the candidate is compared with in a canary step (named in the verdict's reason).
enum class JudgedAgainst {
  kStable,    // the stable generation, the code that serves the other requests
  kBaseline,  // the rollout's baseline: the stable build loaded again, placed as the candidate is
};

// The two arms compared. In a canary step, `stable` is the reference arm's requests, of the
// generation `against` names (RolloutArmStats::generation), in the same window (or, when they
// are too few, as at 100 %, over the whole rollout: rollout_arms.hpp chooses); in shadow, the
// same requests as the candidate's, all of which the stable generation answered.
struct JudgeWindow {
  RolloutArmStats stable;
  RolloutArmStats candidate;
  JudgedAgainst against = JudgedAgainst::kStable;
  // Microseconds per run the candidate may be slower by, beyond max_latency_regression, because of
  // where it runs (policy.worker_latency_allowance_us for a candidate in a worker process judged
  // against the stable generation; 0 against a baseline, which runs where the candidate does).
  double latency_allowance_us = 0;
  // false: errors only, over the rollout. A canary at 100 % against a baseline, which has no
  // share there: its runs are from the earlier steps, under other load on the machine, so a
  // latency comparison would judge the machine's moments, not the build (latency was judged at
  // the earlier steps, against the baseline's runs of the same windows). Errors do not depend on
  // the moment, and the candidate's runs at every step (its totals) are the last gate's power: a
  // build failing 2 % of its runs shows in a thousand runs, not in the 200 of one window.
  bool judge_latency = true;
};

struct Verdict {
  // Argo Rollouts' vocabulary: kFail rolls back, kPass moves on, kInconclusive asks for more
  // samples (and, past the policy's patience, does what `on_inconclusive` says).
  enum class Outcome { kPass, kFail, kInconclusive };
  Outcome outcome = Outcome::kInconclusive;
  // For an operator, with the numbers: what was compared and why this outcome.
  std::string reason;
  // A fail reached before min_samples candidate runs: the errors so far already fail whatever the
  // rest of the window brings, so it need not wait for the window to fill.
  bool early = false;
  // Canary, when latency was judged: the candidate's estimated slowdown (0.05: 5 % slower;
  // negative: faster) and the lower bound of its one-sided confidence interval.
  std::optional<double> latency_change;
  std::optional<double> latency_change_lower_bound;
};
std::string_view OutcomeName(Verdict::Outcome outcome);  // "pass", "fail", "inconclusive"

Verdict Judge(const JudgeWindow& window, const RolloutPolicy& policy, JudgedPhase phase);

}  // namespace backplane::server
