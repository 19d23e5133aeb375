// The rollout judge on generated windows, without threads or servers: identical builds pass at
// the rate the confidence promises, slower and failing ones fail, small windows wait. Every
// window comes from a seeded generator; a failure names the seeds that produced it. And the
// rollout's arms (rollout_arms.hpp): the baseline's share, and which arm a canary is judged
// against.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "rollout/rollout_arms.hpp"
#include "rollout/rollout_judge.hpp"

namespace backplane::testing {
namespace {

using server::JudgedAgainst;
using server::JudgedPhase;
using server::JudgeWindow;
using server::RolloutPolicy;
using server::Verdict;
using ::testing::HasSubstr;
using Outcome = Verdict::Outcome;

// One latency in microseconds from a generator.
using JudgedLatency = std::function<double(std::mt19937_64&)>;

struct NamedLatency {
  const char* name;
  JudgedLatency draw;
};

JudgedLatency LogNormalLatency(double median_micros, double sigma) {
  return [=](std::mt19937_64& random) {
    return std::lognormal_distribution<double>(std::log(median_micros), sigma)(random);
  };
}

// Two modes (a cache hit and a miss, a short and a long input).
JudgedLatency BimodalLatency() {
  return [](std::mt19937_64& random) {
    return std::bernoulli_distribution(0.3)(random) ? LogNormalLatency(400, 0.1)(random)
                                                    : LogNormalLatency(90, 0.1)(random);
  };
}

// A tight body with a few runs ten times slower (a page fault, a preemption).
JudgedLatency LatencyWithOutliers() {
  return [](std::mt19937_64& random) {
    const double body = LogNormalLatency(120, 0.08)(random);
    return std::bernoulli_distribution(0.02)(random) ? body * 10 : body;
  };
}

const std::vector<NamedLatency>& JudgedLatencies() {
  static const std::vector<NamedLatency> distributions = {
      {"lognormal", LogNormalLatency(100, 0.3)},
      {"bimodal", BimodalLatency()},
      {"outliers", LatencyWithOutliers()},
      // A model that runs in a few microseconds: nearly every run in two or three buckets.
      {"microseconds", LogNormalLatency(3.5, 0.04)},
  };
  return distributions;
}

RolloutArmStats JudgedArm(std::mt19937_64& random, const JudgedLatency& draw, uint64_t runs,
                          double slowdown = 1, double error_rate = 0) {
  RolloutArmStats arm;
  std::bernoulli_distribution fails(error_rate);
  for (uint64_t i = 0; i < runs; ++i) {
    ++arm.latency.counts[LatencyHistogram::BucketOf(draw(random) * slowdown)];
    ++arm.requests;
    if (fails(random))
      ++arm.errors;
  }
  return arm;
}

// What `trials` windows of the same recipe (seeded 1..trials) were judged, and the seeds of each
// outcome.
struct JudgeTally {
  int pass = 0, fail = 0, inconclusive = 0;
  std::vector<uint64_t> failed_seeds;
  std::string Summary() const {
    return fmt::format("pass {}, fail {}, inconclusive {}; failed seeds: {}", pass, fail,
                       inconclusive, fmt::join(failed_seeds, " "));
  }
};

JudgeTally JudgeTrials(int trials, const RolloutPolicy& policy,
                       const std::function<JudgeWindow(std::mt19937_64&)>& make) {
  JudgeTally tally;
  for (int trial = 1; trial <= trials; ++trial) {
    const auto seed = static_cast<uint64_t>(trial);
    std::mt19937_64 random(seed);
    const Verdict verdict = server::Judge(make(random), policy, JudgedPhase::kCanary);
    switch (verdict.outcome) {
      case Outcome::kPass:
        ++tally.pass;
        break;
      case Outcome::kFail:
        ++tally.fail;
        tally.failed_seeds.push_back(seed);
        break;
      case Outcome::kInconclusive:
        ++tally.inconclusive;
        break;
    }
  }
  return tally;
}

// Canary windows at realistic sizes: the candidate's runs against the stable generation's in the
// same window (1 % and 10 % steps, and 50 %).
struct JudgedSizes {
  uint64_t candidate, stable;
};
constexpr JudgedSizes kJudgedSizes[] = {{200, 19800}, {1000, 9000}, {2000, 2000}};

TEST(RolloutJudgeTest, IdenticalBuildsPassAndAlmostNeverFail) {
  const RolloutPolicy policy;  // the defaults: 0.99, 10 %
  for (const auto& [name, draw] : JudgedLatencies()) {
    for (const auto& sizes : kJudgedSizes) {
      SCOPED_TRACE(
          fmt::format("{}, {} candidate runs against {}", name, sizes.candidate, sizes.stable));
      const JudgeTally tally = JudgeTrials(500, policy, [&](std::mt19937_64& random) {
        return JudgeWindow{.stable = JudgedArm(random, draw, sizes.stable),
                           .candidate = JudgedArm(random, draw, sizes.candidate)};
      });
      // With the 10 % margin a chance fail is far rarer than 1 - confidence.
      EXPECT_LE(tally.fail, 2) << tally.Summary();
      EXPECT_GE(tally.pass, 490) << tally.Summary();
    }
  }
}

TEST(RolloutJudgeTest, WithoutAMarginIdenticalBuildsFailAtTheRateTheConfidenceStates) {
  // No margin: the rank test alone, whose false alarms must be about 1 - confidence, ties in
  // buckets included (the microsecond model has nearly all of its runs in two or three).
  RolloutPolicy policy;
  policy.max_latency_regression = 0;
  for (const auto& [name, draw] : JudgedLatencies()) {
    SCOPED_TRACE(name);
    const JudgeTally tally = JudgeTrials(500, policy, [&](std::mt19937_64& random) {
      return JudgeWindow{.stable = JudgedArm(random, draw, 2000),
                         .candidate = JudgedArm(random, draw, 500)};
    });
    // 1 % of 500 is 5; 12 or more happens by chance once in several hundred runs of this test.
    EXPECT_LE(tally.fail, 12) << tally.Summary();
  }
}

TEST(RolloutJudgeTest, ATwentyPercentSlowerBuildFailsAndNeverPasses) {
  const RolloutPolicy policy;
  // The window sizes above, and a 1 % step's window grown once after an inconclusive verdict.
  std::vector<JudgedSizes> sizes_judged(std::begin(kJudgedSizes), std::end(kJudgedSizes));
  sizes_judged.push_back({400, 39600});
  for (const auto& [name, draw] : JudgedLatencies()) {
    for (const auto& sizes : sizes_judged) {
      SCOPED_TRACE(
          fmt::format("{}, {} candidate runs against {}", name, sizes.candidate, sizes.stable));
      const JudgeTally tally = JudgeTrials(200, policy, [&](std::mt19937_64& random) {
        return JudgeWindow{.stable = JudgedArm(random, draw, sizes.stable),
                           .candidate = JudgedArm(random, draw, sizes.candidate, 1.2)};
      });
      EXPECT_EQ(tally.pass, 0) << tally.Summary();
      // At 200 runs of the widest distribution a few windows are inconclusive: they grow.
      EXPECT_GE(tally.fail, sizes.candidate >= 400 ? 198 : 180) << tally.Summary();
    }
  }
}

TEST(RolloutJudgeTest, AFivePercentSlowerBuildMostlyPassesAndNeverFails) {
  const RolloutPolicy policy;
  for (const auto& [name, draw] : JudgedLatencies()) {
    SCOPED_TRACE(name);
    const JudgeTally tally = JudgeTrials(200, policy, [&](std::mt19937_64& random) {
      return JudgeWindow{.stable = JudgedArm(random, draw, 9000),
                         .candidate = JudgedArm(random, draw, 1000, 1.05)};
    });
    EXPECT_LE(tally.fail, 2) << tally.Summary();
    EXPECT_GE(tally.pass, 180) << tally.Summary();
  }
}

TEST(RolloutJudgeTest, EstimatesTheSlowdownAndSaysSoWithItsNumbers) {
  std::mt19937_64 random(7);
  const auto draw = LogNormalLatency(100, 0.3);
  const JudgeWindow window{.stable = JudgedArm(random, draw, 20000),
                           .candidate = JudgedArm(random, draw, 5000, 1.3)};
  const Verdict verdict = server::Judge(window, RolloutPolicy{}, JudgedPhase::kCanary);
  ASSERT_EQ(verdict.outcome, Outcome::kFail) << verdict.reason;
  ASSERT_TRUE(verdict.latency_change.has_value());
  EXPECT_NEAR(*verdict.latency_change, 0.3, 0.04);
  ASSERT_TRUE(verdict.latency_change_lower_bound.has_value());
  EXPECT_LT(*verdict.latency_change_lower_bound, *verdict.latency_change);
  EXPECT_GT(*verdict.latency_change_lower_bound, 0.1);
  EXPECT_THAT(verdict.reason, HasSubstr("latency: the candidate is "));
  EXPECT_THAT(verdict.reason, HasSubstr("slower than the stable generation (at 99 % confidence, "
                                        "slower by more than "));
  EXPECT_THAT(verdict.reason, HasSubstr("above max_latency_regression 10 %"));
  EXPECT_THAT(verdict.reason, HasSubstr("5000 runs against 20000"));
}

TEST(RolloutJudgeTest, AFasterBuildPasses) {
  std::mt19937_64 random(8);
  const auto draw = LogNormalLatency(100, 0.3);
  const JudgeWindow window{.stable = JudgedArm(random, draw, 5000),
                           .candidate = JudgedArm(random, draw, 1000, 0.7)};
  const Verdict verdict = server::Judge(window, RolloutPolicy{}, JudgedPhase::kCanary);
  EXPECT_EQ(verdict.outcome, Outcome::kPass) << verdict.reason;
  EXPECT_THAT(verdict.reason, HasSubstr("faster, within max_latency_regression 10 %"));
}

TEST(RolloutJudgeTest, OneBucketOfIdenticalRunsPasses) {
  // Every run of both in one bucket: no spread to rank by, and a shift smaller than a bucket.
  JudgeWindow window;
  window.stable.requests = window.stable.latency.counts[20] = 5000;
  window.candidate.requests = window.candidate.latency.counts[20] = 500;
  const Verdict verdict = server::Judge(window, RolloutPolicy{}, JudgedPhase::kCanary);
  EXPECT_EQ(verdict.outcome, Outcome::kPass) << verdict.reason;
  // Two buckets up (19 % or more): slower beyond any doubt.
  window.candidate.latency.counts[20] = 0;
  window.candidate.latency.counts[22] = 500;
  EXPECT_EQ(server::Judge(window, RolloutPolicy{}, JudgedPhase::kCanary).outcome, Outcome::kFail);
}

TEST(RolloutJudgeTest, ACandidateInAWorkerIsAllowedItsCrossingsMicroseconds) {
  // Every stable run at about 10 µs, every candidate run at about 15 µs: 5 µs more per run, what
  // a crossing to a worker process can leave in a measurement of a microsecond model.
  JudgeWindow window;
  window.stable.requests = window.stable.latency.counts[LatencyHistogram::BucketOf(10)] = 5000;
  window.candidate.requests = window.candidate.latency.counts[LatencyHistogram::BucketOf(15)] = 500;
  EXPECT_EQ(server::Judge(window, RolloutPolicy{}, JudgedPhase::kCanary).outcome, Outcome::kFail);
  window.latency_allowance_us = RolloutPolicy{}.worker_latency_allowance_us;
  const Verdict allowed = server::Judge(window, RolloutPolicy{}, JudgedPhase::kCanary);
  EXPECT_EQ(allowed.outcome, Outcome::kPass) << allowed.reason;
  EXPECT_THAT(allowed.reason,
              HasSubstr("within 96.4 % (worker_latency_allowance_us 10 at the stable p50 10 µs)"));
  // On a model of milliseconds the allowance is nothing: 20 % slower still fails.
  window.stable.latency = {};
  window.candidate.latency = {};
  window.stable.latency.counts[LatencyHistogram::BucketOf(2000)] = 5000;
  window.candidate.latency.counts[LatencyHistogram::BucketOf(2400)] = 500;
  const Verdict slower = server::Judge(window, RolloutPolicy{}, JudgedPhase::kCanary);
  EXPECT_EQ(slower.outcome, Outcome::kFail) << slower.reason;
  EXPECT_THAT(slower.reason, HasSubstr("above max_latency_regression 10 %"));
}

TEST(RolloutJudgeTest, ALookingSlowerButSmallWindowIsInconclusive) {
  // Runs spread evenly over 21 buckets, the candidate's two buckets (19 %) up, and few of them:
  // above the margin, not shown.
  JudgeWindow window;
  for (std::size_t bucket = 40; bucket <= 60; ++bucket) {
    window.stable.latency.counts[bucket] = 15;
    window.candidate.latency.counts[bucket + 2] = 10;
  }
  window.stable.requests = window.stable.latency.total();
  window.candidate.requests = window.candidate.latency.total();
  RolloutPolicy policy;
  const Verdict verdict = server::Judge(window, policy, JudgedPhase::kCanary);
  SCOPED_TRACE(verdict.reason);
  ASSERT_TRUE(verdict.latency_change.has_value());
  EXPECT_NEAR(*verdict.latency_change, std::exp2(2.0 / 8) - 1, 0.01);
  EXPECT_EQ(verdict.outcome, Outcome::kInconclusive);
  EXPECT_THAT(verdict.reason, HasSubstr("above max_latency_regression 10 %, but not at 99 % "
                                        "confidence"));
}

TEST(RolloutJudgeTest, FewerRunsThanMinSamplesAreInconclusive) {
  std::mt19937_64 random(3);
  const auto draw = LogNormalLatency(100, 0.3);
  // Ten times slower, but 50 runs of 200.
  const JudgeWindow window{.stable = JudgedArm(random, draw, 5000),
                           .candidate = JudgedArm(random, draw, 50, 10)};
  const Verdict verdict = server::Judge(window, RolloutPolicy{}, JudgedPhase::kCanary);
  EXPECT_EQ(verdict.outcome, Outcome::kInconclusive);
  EXPECT_FALSE(verdict.latency_change.has_value());
  EXPECT_EQ(verdict.reason, "50 of min_samples 200 candidate runs so far, 0 failed");
  // Enough candidate runs but too few stable ones to compare with.
  const JudgeWindow few_stable{.stable = JudgedArm(random, draw, 150),
                               .candidate = JudgedArm(random, draw, 500)};
  const Verdict unjudged = server::Judge(few_stable, RolloutPolicy{}, JudgedPhase::kCanary);
  EXPECT_EQ(unjudged.outcome, Outcome::kInconclusive);
  EXPECT_THAT(unjudged.reason, HasSubstr("latency not judged: the stable generation has 150 runs "
                                         "to compare with, fewer than min_samples 200"));
}

TEST(RolloutJudgeTest, ShadowRunsFailOnlyWhenMoreThanTwiceAsSlow) {
  // A shadow run meets none of its stable run's load and may find the candidate cold: 50 %
  // slower passes there (the canary steps judge it), five times slower fails.
  std::mt19937_64 random(4);
  const auto draw = LogNormalLatency(100, 0.3);
  const JudgeWindow slower{.stable = JudgedArm(random, draw, 400),
                           .candidate = JudgedArm(random, draw, 400, 1.5)};
  const Verdict verdict = server::Judge(slower, RolloutPolicy{}, JudgedPhase::kShadow);
  EXPECT_EQ(verdict.outcome, Outcome::kPass) << verdict.reason;
  EXPECT_TRUE(verdict.latency_change.has_value());
  const JudgeWindow slowest{.stable = JudgedArm(random, draw, 400),
                            .candidate = JudgedArm(random, draw, 400, 5)};
  const Verdict failed = server::Judge(slowest, RolloutPolicy{}, JudgedPhase::kShadow);
  EXPECT_EQ(failed.outcome, Outcome::kFail) << failed.reason;
  EXPECT_THAT(failed.reason, HasSubstr("(in shadow)"));
}

JudgeWindow ErrorsOnlyWindow(uint64_t candidate_errors, uint64_t candidate_runs,
                             uint64_t stable_errors, uint64_t stable_runs) {
  JudgeWindow window;
  window.candidate.requests = window.candidate.latency.counts[40] = candidate_runs;
  window.candidate.errors = candidate_errors;
  window.stable.requests = window.stable.latency.counts[40] = stable_runs;
  window.stable.errors = stable_errors;
  return window;
}

TEST(RolloutJudgeTest, OneErrorAgainstNoneIsNotARegression) {
  const Verdict verdict =
      server::Judge(ErrorsOnlyWindow(1, 200, 0, 20000), RolloutPolicy{}, JudgedPhase::kCanary);
  EXPECT_EQ(verdict.outcome, Outcome::kPass) << verdict.reason;
  EXPECT_THAT(verdict.reason,
              HasSubstr("errors 1 of 200 (0.5 %) against the stable generation's 0 of 20000 "
                        "(0 %)"));
}

TEST(RolloutJudgeTest, EqualErrorRatesPassAndTwoPercentAgainstNoneFails) {
  const RolloutPolicy policy;
  const auto draw = LogNormalLatency(100, 0.3);
  const JudgeTally equal = JudgeTrials(500, policy, [&](std::mt19937_64& random) {
    return JudgeWindow{.stable = JudgedArm(random, draw, 4000, 1, 0.01),
                       .candidate = JudgedArm(random, draw, 400, 1, 0.01)};
  });
  EXPECT_LE(equal.fail, 5) << equal.Summary();
  const JudgeTally failing = JudgeTrials(500, policy, [&](std::mt19937_64& random) {
    return JudgeWindow{.stable = JudgedArm(random, draw, 6000),
                       .candidate = JudgedArm(random, draw, 600, 1, 0.02)};
  });
  EXPECT_GE(failing.fail, 475) << failing.Summary();  // 95 %
}

TEST(RolloutJudgeTest, ErrorsTheRestOfTheWindowCannotExcuseFailEarly) {
  const Verdict verdict =
      server::Judge(ErrorsOnlyWindow(10, 20, 0, 5000), RolloutPolicy{}, JudgedPhase::kCanary);
  EXPECT_EQ(verdict.outcome, Outcome::kFail);
  EXPECT_TRUE(verdict.early);
  EXPECT_EQ(verdict.reason,
            "errors: the candidate failed 10 of its first 20 runs: even if the rest of a window "
            "of min_samples 200 succeeded, more than max_error_excess 0 % above the stable "
            "generation's 0 of 5000 at 99 % confidence");
  // Two errors in the first 20 runs could still be a good build's.
  EXPECT_EQ(server::Judge(ErrorsOnlyWindow(2, 20, 0, 5000), RolloutPolicy{}, JudgedPhase::kCanary)
                .outcome,
            Outcome::kInconclusive);
}

TEST(RolloutJudgeTest, TheErrorMarginToleratesAKnownExcess) {
  RolloutPolicy policy;
  EXPECT_EQ(
      server::Judge(ErrorsOnlyWindow(30, 1000, 0, 10000), policy, JudgedPhase::kShadow).outcome,
      Outcome::kFail);
  policy.max_error_excess = 0.05;
  EXPECT_EQ(
      server::Judge(ErrorsOnlyWindow(30, 1000, 0, 10000), policy, JudgedPhase::kShadow).outcome,
      Outcome::kPass);
}

// ---- The baseline arm ------------------------------------------------------------------------

TEST(RolloutArmsTest, TheBaselineGetsTheCandidatesShareUpToWhatTheStableGenerationHasLeft) {
  const RolloutPolicy policy;  // baseline true
  EXPECT_EQ(server::BaselinePercent(policy, true, 1), 1);
  EXPECT_EQ(server::BaselinePercent(policy, true, 10), 10);
  EXPECT_EQ(server::BaselinePercent(policy, true, 50), 50);  // the stable generation has none
  EXPECT_EQ(server::BaselinePercent(policy, true, 70), 30);
  EXPECT_EQ(server::BaselinePercent(policy, true, 100), 0);
  // Shadow runs are compared with the same requests' stable runs: no baseline share.
  EXPECT_EQ(server::BaselinePercent(policy, false, 0), 0);
  EXPECT_EQ(server::BaselinePercent(policy, false, 10), 0);
  RolloutPolicy without = policy;
  without.baseline = false;
  EXPECT_EQ(server::BaselinePercent(without, true, 10), 0);
}

RolloutArmStats CountedArm(uint64_t generation, uint64_t requests, std::size_t bucket = 40) {
  RolloutArmStats arm;
  arm.generation = generation;
  arm.requests = arm.latency.counts[bucket] = requests;
  return arm;
}

// A canary step's counters: stable generation 2, candidate 5, baseline 6 (0: none), with the
// given requests in the window; the totals hold `before` more of each arm.
struct CanaryCounters {
  RolloutStats window, totals;
};
CanaryCounters Counters(uint64_t stable, uint64_t candidate, uint64_t baseline,
                        uint64_t baseline_generation = 6, uint64_t before = 1000) {
  CanaryCounters counters;
  counters.window.stable = CountedArm(2, stable, 40);
  counters.window.candidate = CountedArm(5, candidate, 41);
  counters.window.baseline = CountedArm(baseline_generation, baseline, 42);
  counters.totals.stable = CountedArm(2, stable + before, 40);
  counters.totals.candidate = CountedArm(5, candidate + before, 41);
  counters.totals.baseline = CountedArm(baseline_generation, baseline + before, 42);
  return counters;
}

TEST(RolloutArmsTest, ACanaryIsJudgedAgainstItsBaselineInTheSameWindowWithoutAnAllowance) {
  const RolloutPolicy policy;  // min_samples 200
  const auto [window, totals] = Counters(9000, 1000, 1000);
  const JudgeWindow judged = server::CanaryWindow(window, totals, policy, 10, true);
  EXPECT_EQ(judged.against, JudgedAgainst::kBaseline);
  EXPECT_EQ(judged.stable.generation, 6u);
  EXPECT_EQ(judged.stable.requests, 1000u) << "the window's, not the totals'";
  EXPECT_EQ(judged.stable.latency.counts[42], 1000u);
  EXPECT_EQ(judged.candidate.requests, 1000u);
  // The same code in the same place as the candidate: what the worker costs is on both arms.
  EXPECT_EQ(judged.latency_allowance_us, 0);

  // Fewer than min_samples in the window while the baseline has a share: still the window's
  // (its totals hold the earlier steps, where it ran colder than the candidate does now).
  const auto [few, few_totals] = Counters(9000, 1000, 150);
  const JudgeWindow small = server::CanaryWindow(few, few_totals, policy, 10, true);
  EXPECT_EQ(small.against, JudgedAgainst::kBaseline);
  EXPECT_EQ(small.stable.requests, 150u);
}

TEST(RolloutArmsTest, ALostOrAbsentBaselineLeavesTheStableGenerationAndItsAllowance) {
  const RolloutPolicy policy;
  auto [window, totals] = Counters(9000, 1000, 1000);
  totals.baseline_lost = window.baseline_lost = true;
  const JudgeWindow lost = server::CanaryWindow(window, totals, policy, 10, true);
  EXPECT_EQ(lost.against, JudgedAgainst::kStable);
  EXPECT_EQ(lost.stable.generation, 2u);
  EXPECT_EQ(lost.stable.requests, 9000u);
  EXPECT_EQ(lost.latency_allowance_us, policy.worker_latency_allowance_us);
  // Lost in the latest counters only (it died during the window): lost for the whole window.
  window.baseline_lost = false;
  EXPECT_EQ(server::CanaryWindow(window, totals, policy, 10, true).against, JudgedAgainst::kStable);

  const auto [none, none_totals] = Counters(9000, 1000, 0, /*baseline_generation=*/0, 0);
  const JudgeWindow absent = server::CanaryWindow(none, none_totals, policy, 10, true);
  EXPECT_EQ(absent.against, JudgedAgainst::kStable);
  EXPECT_EQ(absent.stable.requests, 9000u);
  EXPECT_EQ(absent.latency_allowance_us, policy.worker_latency_allowance_us);
  // A candidate in the server beside a stable generation in the server: no allowance either.
  EXPECT_EQ(server::CanaryWindow(none, none_totals, policy, 10, false).latency_allowance_us, 0);
}

TEST(RolloutArmsTest, AtAHundredPercentTheBaselinesTotalsAreTheReferenceForErrorsOnly) {
  const RolloutPolicy policy;
  // At 100 % neither the stable generation nor the baseline runs a request: the baseline's runs
  // over the rollout (at the earlier steps) are the reference, for errors only (other moments,
  // other load: their latencies say nothing of the build).
  const auto [window, totals] = Counters(0, 1000, 0);
  const JudgeWindow judged = server::CanaryWindow(window, totals, policy, 0, true);
  EXPECT_EQ(judged.against, JudgedAgainst::kBaseline);
  EXPECT_EQ(judged.stable.generation, 6u);
  EXPECT_EQ(judged.stable.requests, 1000u);
  EXPECT_EQ(judged.latency_allowance_us, 0);
  EXPECT_FALSE(judged.judge_latency);
  EXPECT_EQ(judged.candidate.requests, 2000u) << "the candidate's runs at every step";
  EXPECT_TRUE(server::CanaryWindow(window, totals, policy, 10, true).judge_latency)
      << "while the baseline has a share, its runs are of the same window";
  // A rollout whose only step is 100 never ran its baseline: against the stable generation's
  // totals, as without one.
  const auto [only, only_totals] = Counters(0, 1000, 0, 6, /*before=*/50);
  const JudgeWindow never = server::CanaryWindow(only, only_totals, policy, 0, true);
  EXPECT_EQ(never.against, JudgedAgainst::kStable);
  EXPECT_EQ(never.stable.requests, 50u);
  EXPECT_EQ(never.latency_allowance_us, policy.worker_latency_allowance_us);
  EXPECT_TRUE(never.judge_latency);
}

TEST(RolloutJudgeTest, AWindowJudgedOnErrorsOnlyPassesASlowerCandidateButNotAFailingOne) {
  const RolloutPolicy policy;
  JudgeWindow window{.stable = CountedArm(6, 1000, 40),
                     .candidate = CountedArm(5, 1000, 60),  // 20 buckets: over 5x slower
                     .against = JudgedAgainst::kBaseline,
                     .judge_latency = false};
  Verdict verdict = server::Judge(window, policy, JudgedPhase::kCanary);
  EXPECT_EQ(verdict.outcome, Outcome::kPass) << verdict.reason;
  EXPECT_THAT(verdict.reason, HasSubstr("latency not judged here"));
  window.judge_latency = true;
  EXPECT_EQ(server::Judge(window, policy, JudgedPhase::kCanary).outcome, Outcome::kFail);
  window.judge_latency = false;
  window.candidate.errors = 100;
  verdict = server::Judge(window, policy, JudgedPhase::kCanary);
  EXPECT_EQ(verdict.outcome, Outcome::kFail) << verdict.reason;
  EXPECT_THAT(verdict.reason, HasSubstr("errors: the candidate failed 100 of 1000 (10 %)"));
  EXPECT_THAT(verdict.reason, HasSubstr("over the rollout"));
}

TEST(RolloutArmsTest, AShadowWindowIsTheSameRequestsOnTheStableGeneration) {
  RolloutStats window;
  window.baseline = CountedArm(6, 500);
  window.shadow.samples = 300;
  window.shadow.errors = 4;
  window.shadow.latency.counts[41] = 300;
  window.shadow.stable_latency.counts[40] = 300;
  const JudgeWindow judged = server::ShadowWindow(window);
  EXPECT_EQ(judged.against, JudgedAgainst::kStable);
  EXPECT_EQ(judged.candidate.requests, 300u);
  EXPECT_EQ(judged.candidate.errors, 4u);
  EXPECT_EQ(judged.stable.requests, 300u);
  EXPECT_EQ(judged.stable.errors, 0u);
  EXPECT_EQ(judged.stable.latency.counts[40], 300u);
}

TEST(RolloutJudgeTest, TheReasonNamesTheBaselineItComparedWith) {
  JudgeWindow window{.stable = CountedArm(6, 5000, 40),
                     .candidate = CountedArm(5, 500, 42),
                     .against = JudgedAgainst::kBaseline};
  const Verdict slower = server::Judge(window, RolloutPolicy{}, JudgedPhase::kCanary);
  EXPECT_EQ(slower.outcome, Outcome::kFail) << slower.reason;
  EXPECT_THAT(slower.reason,
              HasSubstr("slower than the baseline generation 6 (the stable build loaded again "
                        "beside it) (at 99 % confidence"));
  EXPECT_THAT(slower.reason, ::testing::Not(HasSubstr("stable generation")));

  window.candidate = CountedArm(5, 500, 40);
  window.candidate.errors = 1;
  const Verdict passed = server::Judge(window, RolloutPolicy{}, JudgedPhase::kCanary);
  EXPECT_EQ(passed.outcome, Outcome::kPass) << passed.reason;
  EXPECT_THAT(passed.reason,
              HasSubstr("errors 1 of 500 (0.2 %) against 0 of 5000 (0 %) on the baseline "
                        "generation 6 (the stable build loaded again beside it)"));

  window.candidate.requests = 20;
  window.candidate.errors = 10;
  const Verdict early = server::Judge(window, RolloutPolicy{}, JudgedPhase::kCanary);
  EXPECT_TRUE(early.early);
  EXPECT_THAT(early.reason, HasSubstr("more than max_error_excess 0 % above 0 of 5000 on the "
                                      "baseline generation 6 (the stable build loaded again "
                                      "beside it) at 99 % confidence"));

  window.stable = CountedArm(6, 150, 40);
  window.candidate = CountedArm(5, 500, 40);
  EXPECT_THAT(server::Judge(window, RolloutPolicy{}, JudgedPhase::kCanary).reason,
              HasSubstr("latency not judged: the baseline generation 6 (the stable build loaded "
                        "again beside it) has 150 runs to compare with"));

  // Against the stable generation the reasons say so.
  window = {.stable = CountedArm(2, 5000, 40), .candidate = CountedArm(5, 500, 42)};
  EXPECT_THAT(server::Judge(window, RolloutPolicy{}, JudgedPhase::kCanary).reason,
              HasSubstr("slower than the stable generation (at 99 % confidence"));
}

// Why the baseline: a build of a model of a few microseconds runs slower on a small share in a
// worker process than the same build hot in the server. Against the stable generation that
// reads as a regression unless an allowance excuses it, and the allowance then excuses a real
// one; against the baseline, which runs as cold and crosses as often, neither happens.
TEST(RolloutJudgeTest, AgainstTheBaselineAnIdenticalBuildPassesAndATwentyPercentSlowerOneFails) {
  const auto hot = LogNormalLatency(3, 0.04);
  const auto cold = LogNormalLatency(3.5, 0.04);  // the same build on a small share, in a worker
  const RolloutPolicy policy;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 random(seed);
    RolloutStats window;
    window.stable = JudgedArm(random, hot, 9000);
    window.stable.generation = 2;
    window.baseline = JudgedArm(random, cold, 1000);
    window.baseline.generation = 6;
    RolloutStats identical = window;
    identical.candidate = JudgedArm(random, cold, 1000);
    RolloutStats slower = window;
    slower.candidate = JudgedArm(random, cold, 1000, 1.2);

    const Verdict good = server::Judge(server::CanaryWindow(identical, identical, policy, 10, true),
                                       policy, JudgedPhase::kCanary);
    EXPECT_NE(good.outcome, Outcome::kFail) << good.reason;
    const Verdict bad = server::Judge(server::CanaryWindow(slower, slower, policy, 10, true),
                                      policy, JudgedPhase::kCanary);
    EXPECT_EQ(bad.outcome, Outcome::kFail) << bad.reason;
    EXPECT_THAT(bad.reason, HasSubstr("than the baseline generation 6"));

    // Without the baseline, the allowance that lets the identical build through hides the slow
    // one too.
    slower.baseline = {};
    const Verdict hidden = server::Judge(server::CanaryWindow(slower, slower, policy, 10, true),
                                         policy, JudgedPhase::kCanary);
    EXPECT_EQ(hidden.outcome, Outcome::kPass) << hidden.reason;
  }
}

}  // namespace
}  // namespace backplane::testing
