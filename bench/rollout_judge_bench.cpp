// The rollout judge's verdicts over generated canary windows: how often identical builds fail (the
// false alarms an operator would see), and how often builds 5 % and 20 % slower pass or fail, for
// the latency shapes and window sizes of tests/server/rollout_judge_test.cpp, with the default
// policy. Prints one row per shape, window size and slowdown. TRIALS (default 500) windows each.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "rollout/rollout_judge.hpp"

namespace {

using namespace backplane;
using Latency = std::function<double(std::mt19937_64&)>;

Latency LogNormal(double median_micros, double sigma) {
  return [=](std::mt19937_64& random) {
    return std::lognormal_distribution<double>(std::log(median_micros), sigma)(random);
  };
}

RolloutArmStats Arm(std::mt19937_64& random, const Latency& latency, uint64_t runs,
                    double slowdown) {
  RolloutArmStats arm;
  for (uint64_t i = 0; i < runs; ++i) {
    ++arm.latency.counts[LatencyHistogram::BucketOf(latency(random) * slowdown)];
    ++arm.requests;
  }
  return arm;
}

}  // namespace

int main() {
  const char* trials_text = std::getenv("TRIALS");
  const int trials = trials_text != nullptr ? std::atoi(trials_text) : 500;
  struct Shape {
    const char* name;
    Latency latency;
  };
  const std::vector<Shape> shapes = {
      {"lognormal 100 us, sigma 0.3", LogNormal(100, 0.3)},
      {"bimodal 70/30 of 90/400 us",
       [](std::mt19937_64& random) {
         return std::bernoulli_distribution(0.3)(random) ? LogNormal(400, 0.1)(random)
                                                         : LogNormal(90, 0.1)(random);
       }},
      {"120 us, 2 % outliers x10",
       [](std::mt19937_64& random) {
         const double body = LogNormal(120, 0.08)(random);
         return std::bernoulli_distribution(0.02)(random) ? body * 10 : body;
       }},
      {"3.5 us, sigma 0.04", LogNormal(3.5, 0.04)},
  };
  struct Sizes {
    uint64_t candidate, stable;
  };
  const Sizes sizes[] = {{200, 19800}, {1000, 9000}, {2000, 2000}};
  const server::RolloutPolicy policy;
  std::printf("%-28s %-12s %-8s %6s %6s %6s\n", "shape", "runs", "slower", "pass", "fail",
              "inconclusive");
  for (const auto& shape : shapes) {
    for (const auto& size : sizes) {
      for (const double slowdown : {1.0, 1.05, 1.2}) {
        int counts[3] = {};
        for (int trial = 1; trial <= trials; ++trial) {
          std::mt19937_64 random(static_cast<uint64_t>(trial) * 7919 +
                                 static_cast<uint64_t>(slowdown * 100));
          const server::JudgeWindow window{
              .stable = Arm(random, shape.latency, size.stable, 1),
              .candidate = Arm(random, shape.latency, size.candidate, slowdown)};
          ++counts[static_cast<int>(
              server::Judge(window, policy, server::JudgedPhase::kCanary).outcome)];
        }
        std::printf("%-28s %5llu/%-6llu %-8s %6d %6d %6d\n", shape.name,
                    static_cast<unsigned long long>(size.candidate),
                    static_cast<unsigned long long>(size.stable),
                    slowdown == 1.0  ? "0 %"
                    : slowdown < 1.1 ? "5 %"
                                     : "20 %",
                    counts[0], counts[1], counts[2]);
      }
    }
  }
}
