#include "rollout/rollout_judge.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include <fmt/format.h>

namespace backplane::server {

namespace {

// Traps kept in mind here:
// - A p99 of a few hundred samples is the second-slowest of them: noise. Rank tests use every
//   sample, and the normal approximation of their statistic is good from a few dozen each.
// - The runtime keeps latencies in buckets eight per octave (about 9 % wide), not raw values.
//   Within a bucket a run is taken to be anywhere, uniformly in log time; so identical
//   distributions compare as equal whatever their buckets, and a shift smaller than a bucket
//   shows as the fraction of a bucket it is on average. A slowdown that moves every run by less
//   than a bucket is measured to that resolution only.
// - The stable generation of a rollout has often seen no error at all in thousands of runs: a
//   test that takes its rate as exactly 0 rolls back a candidate for its first error.

constexpr double kJudgeBucketsPerOctave = 8;
// In shadow, the slowdown that fails a candidate whatever the policy's max_latency_regression: a
// shadow run meets none of the load its stable run met and may find the candidate's code and
// data cold, so only a gross regression (twice as slow) is telling there; the canary steps
// judge the finer one on requests run side by side. For the same reasons a shadow run may be
// slower by this many microseconds too (on a model of a few microseconds, a run on a thread just
// woken, with cold caches, or crossing to a worker process, is twice as slow by that alone).
constexpr double kShadowLatencyRegression = 1.0;
constexpr double kShadowLatencyAllowanceUs = 50;
constexpr auto kJudgeBuckets = static_cast<int>(LatencyHistogram::kBuckets);

double NormalCdf(double z) {
  return 0.5 * std::erfc(-z / std::sqrt(2.0));
}

double NormalQuantile(double p) {
  double low = -40, high = 40;
  for (int i = 0; i < 200; ++i) {
    const double middle = (low + high) / 2;
    (NormalCdf(middle) < p ? low : high) = middle;
  }
  return (low + high) / 2;
}

// The chance that u - v > d for u, v independent and uniform on [0, 1): that a candidate run in
// bucket i is slower than a stable run in bucket j once the stable one is shifted by s buckets,
// with d = j + s - i.
double ChanceAbove(double d) {
  if (d <= -1)
    return 1;
  if (d < 0)
    return 1 - (1 + d) * (1 + d) / 2;
  if (d < 1)
    return (1 - d) * (1 - d) / 2;
  return 0;
}

// The Mann-Whitney U statistic of the candidate's latencies against the stable generation's
// multiplied by 2^(shift/8) (shift in buckets), straight from the two histograms.
//
// Why a shifted stable distribution: "slower by more than max_latency_regression" is a statement
// about the whole distribution, and the rank test of the candidate against the stable one scaled
// by (1 + margin) tests exactly that, at the stated confidence, without assuming a shape. The
// shift that balances the statistic is the Hodges-Lehmann estimate of the slowdown, and the
// shift at which it stops being significant the bound of its confidence interval: the numbers
// the verdict shows come from the same statistic that decides it.
class ShiftedRankTest {
 public:
  ShiftedRankTest(const LatencyHistogram& candidate, const LatencyHistogram& stable) {
    double below = 0;
    double ties = 0;
    for (int bucket = 0; bucket < kJudgeBuckets; ++bucket) {
      candidate_[bucket] = static_cast<double>(candidate.counts[bucket]);
      stable_[bucket] = static_cast<double>(stable.counts[bucket]);
      stable_below_[bucket] = below;
      below += stable_[bucket];
      candidates_ += candidate_[bucket];
      const double pooled = candidate_[bucket] + stable_[bucket];
      ties += pooled * pooled * pooled - pooled;
    }
    stable_below_[kJudgeBuckets] = below;
    stables_ = below;
    // Under the hypothesis that the two come from one distribution, with ties (runs in one bucket)
    // corrected for: a bucket holding most runs would otherwise make small differences look
    // significant.
    const double all = candidates_ + stables_;
    if (all > 1) {
      variance_ = candidates_ * stables_ / 12 * ((all + 1) - ties / (all * (all - 1)));
      variance_ = std::max(variance_, 0.0);
    }
  }

  double candidates() const { return candidates_; }
  double stables() const { return stables_; }
  double NullMean() const { return candidates_ * stables_ / 2; }
  double NullDeviation() const { return std::sqrt(variance_); }

  // The expected number of (candidate, shifted stable) pairs in which the candidate is slower.
  // Non-increasing in `shift`.
  double U(double shift) const {
    double u = 0;
    for (int bucket = 0; bucket < kJudgeBuckets; ++bucket) {
      if (candidate_[bucket] == 0)
        continue;
      const double level = bucket - shift;  // the stable bucket that lines up with this one
      const double last_below = std::floor(level - 1);
      double slower_than = StableUpTo(last_below);
      for (double j = std::max(last_below + 1, 0.0); j < level + 1 && j < kJudgeBuckets; ++j)
        slower_than += stable_[static_cast<int>(j)] * ChanceAbove(j - level);
      u += candidate_[bucket] * slower_than;
    }
    return u;
  }

  // How far above its mean under the hypothesis U(shift) is, in standard deviations.
  double Z(double shift) const {
    const double excess = U(shift) - NullMean();
    if (variance_ <= 0)
      return excess > 0 ? HUGE_VAL : excess < 0 ? -HUGE_VAL : 0;
    return excess / NullDeviation();
  }

  // The shift (in buckets) at which U falls to `target`; nullopt when no shift within the
  // histogram's range reaches it.
  std::optional<double> ShiftWhere(double target) const {
    double low = -(kJudgeBuckets + 2), high = kJudgeBuckets + 2;
    if (U(low) < target || U(high) > target)
      return std::nullopt;
    for (int i = 0; i < 60; ++i) {
      const double middle = (low + high) / 2;
      (U(middle) > target ? low : high) = middle;
    }
    return (low + high) / 2;
  }

 private:
  double StableUpTo(double bucket) const {
    if (bucket < 0)
      return 0;
    return stable_below_[static_cast<int>(std::min<double>(bucket + 1, kJudgeBuckets))];
  }

  std::array<double, kJudgeBuckets> candidate_{};
  std::array<double, kJudgeBuckets> stable_{};
  std::array<double, kJudgeBuckets + 1> stable_below_{};  // stable runs in the buckets below each
  double candidates_ = 0;
  double stables_ = 0;
  double variance_ = 0;
};

double ShiftToChange(double shift) {
  return std::exp2(shift / kJudgeBucketsPerOctave) - 1;
}

double ChangeToShift(double change) {
  return kJudgeBucketsPerOctave * std::log2(1 + change);
}

std::string PercentOf(double fraction) {
  return fmt::format("{:.3g} %", fraction * 100);
}

// The one-sided test that the candidate's error rate exceeds the stable one's by more than
// `margin`: a two-proportion z statistic on rates with one failed and one good run added to each
// arm (Agresti and Caffo). Those pseudo-runs are why one error in 200 runs against none in
// thousands is not a regression (z 1.4), where the plain pooled test calls it one at z 10; five
// or more errors against none still are, at any sample size.
double ErrorExcessZ(double candidate_errors, double candidate_runs, double stable_errors,
                    double stable_runs, double margin) {
  const double candidate_rate = (candidate_errors + 1) / (candidate_runs + 2);
  const double stable_rate = (stable_errors + 1) / (stable_runs + 2);
  const double deviation = std::sqrt(candidate_rate * (1 - candidate_rate) / (candidate_runs + 2) +
                                     stable_rate * (1 - stable_rate) / (stable_runs + 2));
  return (candidate_rate - stable_rate - margin) / deviation;
}

// What the candidate was compared with, for the reasons: an operator must not take a verdict
// against the baseline for one against the code that serves, nor the other way round.
std::string ReferenceName(const JudgeWindow& window) {
  if (window.against == JudgedAgainst::kBaseline) {
    return fmt::format("the baseline generation {} (the stable build loaded again beside it)",
                       window.stable.generation);
  }
  return "the stable generation";
}

// `counts` of the reference arm: "the stable generation's 0 of 5000", or "0 of 5000 on the
// baseline generation 7 (...)".
std::string ReferenceCounts(const JudgeWindow& window, const std::string& counts) {
  return window.against == JudgedAgainst::kBaseline ? counts + " on " + ReferenceName(window)
                                                    : ReferenceName(window) + "'s " + counts;
}

std::string ErrorCounts(const JudgeWindow& window) {
  auto rate = [](uint64_t errors, uint64_t runs) {
    return runs == 0 ? std::string("-") : PercentOf(static_cast<double>(errors) / runs);
  };
  return fmt::format(
      "{} of {} ({}) against {}", window.candidate.errors, window.candidate.requests,
      rate(window.candidate.errors, window.candidate.requests),
      ReferenceCounts(window,
                      fmt::format("{} of {} ({})", window.stable.errors, window.stable.requests,
                                  rate(window.stable.errors, window.stable.requests))));
}

std::string Quantiles(const LatencyHistogram& candidate, const LatencyHistogram& stable) {
  return fmt::format(
      "p50 {:.0f} µs against {:.0f} µs, p99 {:.0f} µs against {:.0f} µs, {} runs "
      "against {}",
      candidate.QuantileMicros(0.5), stable.QuantileMicros(0.5), candidate.QuantileMicros(0.99),
      stable.QuantileMicros(0.99), candidate.total(), stable.total());
}

Verdict MakeVerdict(Verdict::Outcome outcome, std::string reason) {
  Verdict verdict;
  verdict.outcome = outcome;
  verdict.reason = std::move(reason);
  return verdict;
}

}  // namespace

std::string_view OutcomeName(Verdict::Outcome outcome) {
  switch (outcome) {
    case Verdict::Outcome::kPass:
      return "pass";
    case Verdict::Outcome::kFail:
      return "fail";
    case Verdict::Outcome::kInconclusive:
      return "inconclusive";
  }
  return "unknown";
}

Verdict Judge(const JudgeWindow& window, const RolloutPolicy& policy, JudgedPhase phase) {
  using Outcome = Verdict::Outcome;
  const double critical = NormalQuantile(policy.confidence);
  const std::string confidence = fmt::format("{:g} %", policy.confidence * 100);
  const auto min_samples = static_cast<double>(policy.min_samples);
  const auto candidate_runs = static_cast<double>(window.candidate.requests);
  const auto candidate_errors = static_cast<double>(window.candidate.errors);
  const auto stable_runs = static_cast<double>(window.stable.requests);
  const auto stable_errors = static_cast<double>(window.stable.errors);

  // Errors. Before min_samples runs, only errors that would fail the test even if every run left
  // in the window succeeded decide (early): judging a partial window by itself would test again
  // at every look, and each look is another chance of a false alarm.
  if (candidate_runs < min_samples) {
    if (ErrorExcessZ(candidate_errors, min_samples, stable_errors, stable_runs,
                     policy.max_error_excess) > critical) {
      Verdict verdict = MakeVerdict(
          Outcome::kFail,
          fmt::format(
              "errors: the candidate failed {} of its first {} runs: even if the rest "
              "of a window of min_samples {} succeeded, more than max_error_excess {} above "
              "{} at {} confidence",
              window.candidate.errors, window.candidate.requests, policy.min_samples,
              PercentOf(policy.max_error_excess),
              ReferenceCounts(
                  window, fmt::format("{} of {}", window.stable.errors, window.stable.requests)),
              confidence));
      verdict.early = true;
      return verdict;
    }
    return MakeVerdict(
        Outcome::kInconclusive,
        fmt::format("{} of min_samples {} candidate runs so far, {} failed",
                    window.candidate.requests, policy.min_samples, window.candidate.errors));
  }
  if (ErrorExcessZ(candidate_errors, candidate_runs, stable_errors, stable_runs,
                   policy.max_error_excess) > critical) {
    return MakeVerdict(
        Outcome::kFail,
        fmt::format("errors: the candidate failed {}{}: more than max_error_excess {} above "
                    "it at {} confidence",
                    ErrorCounts(window), window.judge_latency ? "" : " over the rollout",
                    PercentOf(policy.max_error_excess), confidence));
  }
  const std::string errors =
      "errors " + ErrorCounts(window) + (window.judge_latency ? "" : " over the rollout");
  if (phase == JudgedPhase::kShadow && window.candidate.latency.total() == 0)
    return MakeVerdict(Outcome::kPass, errors);
  if (!window.judge_latency) {
    return MakeVerdict(Outcome::kPass,
                       errors + "; latency not judged here: " + ReferenceName(window) +
                           " has no share at this step (it was judged at the steps before, "
                           "against the same windows' runs)");
  }

  // Latency, on the histograms' counts (every run measured, failed ones too).
  const LatencyHistogram& candidate = window.candidate.latency;
  const LatencyHistogram& stable = window.stable.latency;
  if (static_cast<double>(stable.total()) < min_samples) {
    return MakeVerdict(
        Outcome::kInconclusive,
        fmt::format("{}; latency not judged: {} has {} runs to compare with, fewer than "
                    "min_samples {}",
                    errors, ReferenceName(window), stable.total(), policy.min_samples));
  }
  if (static_cast<double>(candidate.total()) < min_samples) {
    return MakeVerdict(
        Outcome::kInconclusive,
        fmt::format("{}; latency not judged: {} of min_samples {} candidate runs measured", errors,
                    candidate.total(), policy.min_samples));
  }
  const ShiftedRankTest test(candidate, stable);
  // The tolerated slowdown: the policy's fraction, or the allowance in microseconds as a fraction
  // of the stable median when that is larger.
  double margin = policy.max_latency_regression;
  std::string tolerance = "max_latency_regression " + PercentOf(margin);
  double allowance_us = window.latency_allowance_us;
  if (phase == JudgedPhase::kShadow) {
    allowance_us += kShadowLatencyAllowanceUs;
    if (margin < kShadowLatencyRegression) {
      margin = kShadowLatencyRegression;
      tolerance = PercentOf(margin) + " (in shadow)";
    }
  }
  if (const double median = stable.QuantileMicros(0.5);
      allowance_us > 0 && allowance_us / median > margin) {
    margin = allowance_us / median;
    tolerance =
        phase == JudgedPhase::kShadow
            ? fmt::format("{} (in shadow, {:g} µs at the stable p50 {:.0f} µs)", PercentOf(margin),
                          allowance_us, median)
            : fmt::format("{} (worker_latency_allowance_us {:g} at the stable p50 {:.0f} µs)",
                          PercentOf(margin), allowance_us, median);
  }
  const double margin_shift = ChangeToShift(margin);
  Verdict verdict;
  if (auto estimate = test.ShiftWhere(test.NullMean()))
    verdict.latency_change = ShiftToChange(*estimate);
  if (auto bound = test.ShiftWhere(test.NullMean() + critical * test.NullDeviation()))
    verdict.latency_change_lower_bound = ShiftToChange(*bound);
  const double change = verdict.latency_change.value_or(0);
  const std::string lower_bound = verdict.latency_change_lower_bound
                                      ? PercentOf(*verdict.latency_change_lower_bound)
                                      : std::string("unbounded");
  const std::string slower =
      change >= 0 ? PercentOf(change) + " slower" : PercentOf(-change) + " faster";
  const std::string quantiles = Quantiles(candidate, stable);
  if (test.Z(margin_shift) > critical) {
    verdict.outcome = Outcome::kFail;
    verdict.reason = fmt::format(
        "latency: the candidate is {} than {} (at {} confidence, slower by more than {}), above "
        "{}; {}",
        slower, ReferenceName(window), confidence, lower_bound, tolerance, quantiles);
  } else if (change > margin) {
    verdict.outcome = Outcome::kInconclusive;
    verdict.reason = fmt::format(
        "{}; latency: the candidate looks {} than {}, above {}, but not at {} confidence (slower "
        "by more than {}); {}",
        errors, slower, ReferenceName(window), tolerance, confidence, lower_bound, quantiles);
  } else {
    verdict.outcome = Outcome::kPass;
    verdict.reason =
        fmt::format("{}; latency {}, within {}; {}", errors, slower, tolerance, quantiles);
  }
  return verdict;
}

}  // namespace backplane::server
