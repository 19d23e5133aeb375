// What a runtime measures of the two generations of a backend id during a progressive rollout
// (BackendRegistry with DeployPolicy::kProgressive), and how it splits requests between them.
// The policy (when to move on, when to roll back) is the caller's; the server's is in
// server/rollout/.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace backplane {

// How a runtime routes the requests of the networks bound on a backend id's candidate.
struct RolloutTraffic {
  // The share of requests that run on the candidate instead of the stable generation, 0 to 100.
  double candidate_percent = 0;
  // The share that runs on the rollout's baseline generation instead (the stable build loaded
  // again beside the candidate, placed as the candidate is; CandidateRoute::baseline), 0 to
  // 100 - candidate_percent; ignored without a baseline. The candidate is judged against it:
  // code that runs on a small share is cold, and in a worker it pays for the crossing, on both
  // arms alike, so neither reads as a regression of the build.
  double baseline_percent = 0;
  // Of the requests that run on the stable generation, the share also run on the candidate off
  // the response path (after the stable run, on a thread of the runtime's own outside the
  // arena; skipped when one of the rollout's is still running or client requests are waiting);
  // its outputs are compared with the stable ones and never returned.
  double shadow_fraction = 0;
  // A shadow sample whose outputs differ from the stable ones by more than this (largest
  // absolute difference of any element) counts as diverged.
  double shadow_tolerance = 0;
  // A shadow run taking longer than this counts as timed out (ShadowStats::timeouts), as soon as
  // it is past it: a run cannot be stopped, and while it runs no other shadow run of the
  // rollout starts, so a hung candidate would otherwise only stop producing samples.
  double shadow_timeout_ms = 1000;
};

// Latencies in log-spaced buckets, eight per octave from 1 µs (about 9 % wide): fine enough to
// compare two generations' p99, and mergeable by subtraction, so that a caller can look at a
// window between two snapshots.
struct LatencyHistogram {
  static constexpr std::size_t kBuckets = 256;  // up to 2^32 µs
  static std::size_t BucketOf(double micros);
  static double UpperBoundMicros(std::size_t bucket);

  std::array<uint64_t, kBuckets> counts{};

  uint64_t total() const;
  // The upper bound of the bucket holding the q-quantile (0 < q ≤ 1); 0 when empty.
  double QuantileMicros(double q) const;
  LatencyHistogram operator-(const LatencyHistogram& earlier) const;
};

struct RolloutArmStats {
  uint64_t generation = 0;
  uint64_t requests = 0;  // executions that ran on it (shadow runs not included)
  // Of them, the ones that failed (a refusal before the request ran is neither). A client's bad
  // input fails on both generations alike: compare the two rates, not one alone.
  uint64_t errors = 0;
  LatencyHistogram latency;  // of the network's execution alone (not the parse of a request)
};

struct ShadowStats {
  uint64_t samples = 0;  // shadow runs compared (or failed on the candidate)
  uint64_t errors = 0;   // shadow runs the candidate failed (the stable run had succeeded)
  // Sampled but not run: the rollout's previous shadow run was still running, or client
  // requests were waiting (a shadow run only takes capacity no client needs).
  uint64_t skipped = 0;
  uint64_t diverged = 0;  // differed by more than RolloutTraffic::shadow_tolerance, or in shape
  // Outputs whose argmax over the last axis differs in some row (classification changed).
  uint64_t argmax_disagreements = 0;
  double max_abs_difference = 0;  // over every sample so far
  // The largest absolute difference over the largest magnitude of the stable output.
  double max_relative_difference = 0;
  // Runs past RolloutTraffic::shadow_timeout_ms (one still running is counted once it is past).
  uint64_t timeouts = 0;
  // Latencies of the shadow runs on the candidate and of the same requests' runs on the stable
  // generation (the backend code's time, as for requests), and how many of the shadow runs were
  // the slower of the two. Not the arms' requests: a shadow run meets none of the load the
  // stable run met, and its code and data may be cold, so only a gross slowdown is telling.
  LatencyHistogram latency;
  LatencyHistogram stable_latency;
  uint64_t slower = 0;
  ShadowStats operator-(const ShadowStats& earlier) const;  // the maxima are kept, not subtracted
};

// Counters are cumulative since the candidate arrived: subtract two snapshots for a window.
struct RolloutStats {
  std::string backend_id;
  RolloutTraffic traffic;
  RolloutArmStats stable;
  RolloutArmStats candidate;
  // The baseline generation's requests (RolloutTraffic::baseline_percent); generation 0: the
  // rollout has none.
  RolloutArmStats baseline;
  // The baseline's worker died: its share runs on the stable generation since, and its numbers
  // stop (the candidate is judged against the stable generation then).
  bool baseline_lost = false;
  ShadowStats shadow;
  uint64_t networks = 0;  // networks bound on the candidate (loaded before it arrived)
};

}  // namespace backplane
