// The arms of a progressive rollout (docs/hot-reload.md, "Progressive rollout"): how requests
// are split between the stable, candidate and baseline generations, and which arm the candidate
// is judged against. Pure functions of the policy and the runtime's numbers: no clock, no
// threads, no state.
#pragma once

#include "backplane/runtime/rollout.hpp"
#include "config/rollout_policy.hpp"
#include "rollout/rollout_judge.hpp"

namespace backplane::server {

// The share of requests the rollout's baseline runs in a canary step that gives the candidate
// `candidate_percent`: as many as the candidate, so that both arms are as cold and cross to a
// worker as often, up to what the stable generation has left (min(p, 100 - p): at a step above
// 50 % the baseline takes the rest, and at 100 % nothing). 0 outside a canary step (shadow runs
// are compared with the same requests' stable runs) and when policy.baseline is off.
double BaselinePercent(const RolloutPolicy& policy, bool canary, double candidate_percent);

// Shadow runs as the judge compares them: the candidate's failures and latencies against the
// same requests' stable runs, every one of which the stable generation answered.
JudgeWindow ShadowWindow(const RolloutStats& window);

// A canary window as the judge compares it. The candidate's requests in `window` against:
// - the baseline's (when the rollout has one and its worker lives), with no latency allowance:
//   it is the same code as the stable generation, as cold and placed as the candidate is, so
//   whatever the placement costs is on both arms. In the same window while it has a share (its
//   totals hold earlier steps, where it ran colder than the candidate does now); at
//   `baseline_percent` 0 (a step at 100 %) its totals, if they are min_samples or more, against
//   the candidate's totals, for errors only (judge_latency false: runs of other moments, under
//   other load); a rollout whose only step is 100 never ran one, and is judged as without a
//   baseline;
// - else the stable generation's, in the same window (the same load on the machine) or over the
//   whole rollout when the window has too few (at 100 % it has none), with
//   worker_latency_allowance_us for a candidate in a worker process that the stable generation
//   is not in.
// `totals`: the counters since the candidate arrived; `baseline_percent`: the share the
// controller gives the baseline now.
JudgeWindow CanaryWindow(const RolloutStats& window, const RolloutStats& totals,
                         const RolloutPolicy& policy, double baseline_percent,
                         bool candidate_in_worker);

}  // namespace backplane::server
