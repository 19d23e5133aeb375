// The policy of a progressive rollout (config keys "deploy_policy" and "rollout";
// docs/hot-reload.md, "Progressive rollout"): how far a candidate generation is trusted at each
// phase, and the numbers that roll it back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "backplane/core/status.hpp"

namespace backplane::server {

// A value type. Field names are the config file's keys inside "rollout".
struct RolloutPolicy {
  // Shadow phase: this share of the requests is also run on the candidate, off the response
  // path, and compared; 0 skips the phase. Shadow runs go on through the canary steps.
  double shadow_fraction = 0.1;
  // Candidate runs (shadow samples in the shadow phase, candidate requests in a canary step) in
  // a window the judge gives its verdict on; an inconclusive window grows by as many again.
  uint64_t min_samples = 200;
  // Canary steps: the candidate's share of requests, in percent, increasing, ending at 100.
  std::vector<double> steps = {1, 10, 50, 100};
  // Steps below this share are refused: the router splits requests in basis points, and a
  // smaller share would send the candidate nothing.
  static constexpr double kSmallestStep = 0.01;
  // The rollout judge (server/rollout/rollout_judge.hpp) calls a window a fail only when the
  // difference is shown at this confidence (0.99: a good build is rolled back by chance in
  // about one window of a hundred at most)...
  double confidence = 0.99;
  // ...and exceeds these: the candidate slower than its baseline (or the stable generation) by
  // more than this fraction of its latency (the whole distribution, not one quantile)...
  double max_latency_regression = 0.1;
  // A candidate tried in a worker process (candidate_isolation "process") and judged against the
  // stable generation (no baseline, or it was lost) may be slower by this many microseconds per
  // run too: its measurement leaves out the crossing to the worker, but not all of what the
  // crossing costs, and on a model of a few microseconds that rest would read as a regression of
  // the build. Against a baseline, which crosses as the candidate does, it does not apply.
  double worker_latency_allowance_us = 10;
  // ...or failing more than this share of its runs beyond the reference arm's own error rate
  // (a client's bad input fails on both). 0: any excess shown at `confidence`.
  double max_error_excess = 0;
  // Roll back when a shadow sample's outputs differ from the stable ones by more than this.
  double max_abs_divergence = 0.001;
  // Roll back when a shadow run is still going after this many milliseconds
  // (RolloutTraffic::shadow_timeout_ms): a run cannot be stopped, and while it runs no other
  // shadow run of the rollout starts, so a hung candidate would otherwise only stop producing
  // samples. Above 0 and at most kMaxShadowTimeoutMs.
  double shadow_timeout_ms = 1000;
  // An hour: a longer run is a hung one by any standard, and a bound keeps a typo (a value in
  // microseconds) from disabling the check in effect.
  static constexpr double kMaxShadowTimeoutMs = 3600000;
  // A phase or step ends at min_samples candidate runs, or after this many seconds with fewer
  // (so that rollouts finish at low traffic); 0: no time limit.
  double step_max_duration_s = 60;
  // Consecutive inconclusive verdicts at a step (one per min_samples runs) before
  // `on_inconclusive` applies; it applies at once when step_max_duration_s is up.
  uint32_t inconclusive_limit = 3;
  // "advance" moves on as after a pass; "hold" keeps the step (and its traffic) until a pass, a
  // fail or an operator decides.
  enum class OnInconclusive { kAdvance, kHold } on_inconclusive = OnInconclusive::kAdvance;
  // "candidate_isolation": "process" runs each candidate in a worker process during its rollout
  // (the build that is promoted is loaded again where its backend's generations run); "none" runs
  // it where they run. A start-up setting: a candidate's place is chosen when its file loads.
  bool sandbox_candidates = true;
  // "baseline": true loads the stable build again beside each candidate, placed as the candidate
  // is, and gives it the candidate's share of requests (up to half of them); canary steps judge
  // the candidate against it (Kayenta's baseline), without worker_latency_allowance_us. false
  // judges against the stable generation. A start-up setting, as candidate_isolation.
  bool baseline = true;
};

// "immediate" or "progressive": kInvalidArgument otherwise.
Status CheckDeployPolicy(std::string_view policy);

// Applies the keys of JSON object `value` over `policy` (all or nothing). An unknown key, a
// wrong type or an out-of-range value is kInvalidArgument naming `where` and the key.
Status ApplyRolloutPolicy(const nlohmann::json& value, std::string_view where,
                          RolloutPolicy& policy);
nlohmann::json RolloutPolicyJson(const RolloutPolicy& policy);

}  // namespace backplane::server
