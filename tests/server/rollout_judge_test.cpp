// The rollout judge on generated windows, without threads or servers: identical builds pass at
// the rate the confidence promises, slower and failing ones fail, small windows wait. Every
// window comes from a seeded generator; a failure names the seeds that produced it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "rollout/rollout_judge.hpp"

namespace backplane::testing {
namespace {

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

}  // namespace
}  // namespace backplane::testing
