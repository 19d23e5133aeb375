#include "rollout/rollout_arms.hpp"

#include <algorithm>

namespace backplane::server {

double BaselinePercent(const RolloutPolicy& policy, bool canary, double candidate_percent) {
  if (!policy.baseline || !canary)
    return 0;
  return std::clamp(std::min(candidate_percent, 100 - candidate_percent), 0.0, 50.0);
}

JudgeWindow ShadowWindow(const RolloutStats& window) {
  JudgeWindow judged;
  judged.candidate.generation = window.candidate.generation;
  judged.candidate.requests = window.shadow.samples;
  judged.candidate.errors = window.shadow.errors;
  judged.candidate.latency = window.shadow.latency;
  judged.stable.generation = window.stable.generation;
  judged.stable.requests = window.shadow.samples;
  judged.stable.latency = window.shadow.stable_latency;
  return judged;
}

JudgeWindow CanaryWindow(const RolloutStats& window, const RolloutStats& totals,
                         const RolloutPolicy& policy, double baseline_percent,
                         bool candidate_in_worker) {
  // The flags of the latest counters: a baseline that died since the window began is lost for
  // the whole window (its numbers stopped when it died).
  const bool baseline = totals.baseline.generation != 0 && !totals.baseline_lost;
  // While the baseline has a share, its window is the reference even when it holds fewer runs
  // than min_samples (it has the candidate's share, so about as many; the judge weighs small
  // samples): its totals include the steps where it ran colder than the candidate does now.
  const bool from_window = baseline_percent > 0 || window.baseline.requests >= policy.min_samples;
  if (baseline && (from_window || totals.baseline.requests >= policy.min_samples)) {
    return {.stable = from_window ? window.baseline : totals.baseline,
            .candidate = from_window ? window.candidate : totals.candidate,
            .against = JudgedAgainst::kBaseline,
            .judge_latency = from_window};
  }
  return {.stable = window.stable.requests >= policy.min_samples ? window.stable : totals.stable,
          .candidate = window.candidate,
          .against = JudgedAgainst::kStable,
          .latency_allowance_us = candidate_in_worker ? policy.worker_latency_allowance_us : 0};
}

}  // namespace backplane::server
