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
  // Candidate runs (shadow samples in the shadow phase, candidate requests in a canary step)
  // observed before a phase or step may advance.
  uint64_t min_samples = 200;
  // Canary steps: the candidate's share of requests, in percent, increasing, ending at 100.
  std::vector<double> steps = {1, 10, 50, 100};
  // Roll back when the candidate fails more than this share of its runs beyond the stable
  // generation's own error rate (a client's bad input fails on both)...
  double max_error_rate = 0.01;
  // ...when its p99 latency in a step exceeds this multiple of the stable generation's...
  double max_p99_ratio = 1.5;
  // ...or when a shadow sample's outputs differ from the stable ones by more than this.
  double max_abs_divergence = 0.001;
  // "candidate_isolation": "process" runs each candidate in a worker process during its rollout
  // (the build that is promoted is loaded again where its backend's generations run); "none" runs
  // it where they run. A start-up setting: a candidate's place is chosen when its file loads.
  bool sandbox_candidates = true;
};

// "immediate" or "progressive": kInvalidArgument otherwise.
Status CheckDeployPolicy(std::string_view policy);

// Applies the keys of JSON object `value` over `policy` (all or nothing). An unknown key, a
// wrong type or an out-of-range value is kInvalidArgument naming `where` and the key.
Status ApplyRolloutPolicy(const nlohmann::json& value, std::string_view where,
                          RolloutPolicy& policy);
nlohmann::json RolloutPolicyJson(const RolloutPolicy& policy);

}  // namespace backplane::server
