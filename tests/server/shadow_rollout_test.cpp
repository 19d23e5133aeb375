// Shadow runs in a whole server under REST load (issue 40): a candidate thousands of times
// slower is rolled back in shadow by the judge, which sees its shadow runs' latency; one whose
// shadow runs time out is rolled back for it; and an option that changes outputs, set during
// shadow, reaches the candidate, so that an identical build is promoted instead of diverging.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include <fmt/format.h>

#include "cli/serve_command.hpp"
#include "rollout/rollout_judge.hpp"
#include "serve_test_util.hpp"

namespace backplane::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

// Clients sending rows back to back; an answer other than 200 is kept. The values are not
// checked: the option test changes them on purpose.
class Clients {
 public:
  Clients(const RolloutServer& server, int count) : joiner_{stop_, threads_} {
    for (int c = 0; c < count; ++c) {
      threads_.emplace_back([this, &server] {
        auto client = server.Client();
        while (!stop_.load()) {
          const auto reply = Post(*client, "/v2/models/identity/infer", RowRequest(1));
          answers_.fetch_add(1);
          if (reply.status != 200) {
            MutexLock lock(mutex_);
            failures_.push_back(std::to_string(reply.status) + " " + reply.text);
          }
        }
      });
    }
  }
  void Stop() {
    stop_.store(true);
    for (auto& thread : threads_) {
      if (thread.joinable())
        thread.join();
    }
  }
  int answers() const { return answers_.load(); }
  std::vector<std::string> failures() const {
    MutexLock lock(mutex_);
    return failures_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> answers_{0};
  std::vector<std::thread> threads_;
  JoinAll joiner_;
  mutable Mutex mutex_;
  std::vector<std::string> failures_ BACKPLANE_GUARDED_BY(mutex_);
};

// ---- The judge on shadow runs, on generated windows -------------------------------------------

// A shadow window of `runs` pairs: the stable runs lognormal around `stable_micros`, the shadow
// runs around `stable_micros * factor + extra_micros` (seeded).
server::JudgeWindow ShadowPairs(uint64_t seed, int runs, double stable_micros, double factor,
                                double extra_micros) {
  std::mt19937_64 random(seed);
  server::JudgeWindow window;
  for (int i = 0; i < runs; ++i) {
    const double stable = std::lognormal_distribution<double>(std::log(stable_micros), 0.2)(random);
    const double noise = std::lognormal_distribution<double>(0, 0.2)(random);
    window.stable.latency.counts[LatencyHistogram::BucketOf(stable)]++;
    window.candidate.latency
        .counts[LatencyHistogram::BucketOf((stable_micros * factor + extra_micros) * noise)]++;
  }
  window.stable.requests = window.candidate.requests = static_cast<uint64_t>(runs);
  return window;
}

TEST(ShadowJudgeTest, FailsACandidateTwiceAsSlowAndPassesColdRunsOfAFewMicroseconds) {
  const server::RolloutPolicy policy;  // max_latency_regression 10 %
  using Outcome = server::Verdict::Outcome;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    // A thousand times slower: fails, saying it was judged as shadow runs.
    const auto slow =
        server::Judge(ShadowPairs(seed, 200, 5, 1000, 0), policy, server::JudgedPhase::kShadow);
    EXPECT_EQ(slow.outcome, Outcome::kFail) << slow.reason;
    EXPECT_THAT(slow.reason, HasSubstr("in shadow"));
    // Three times slower on a 5 µs model (cold caches, a woken thread): within the allowance.
    const auto cold =
        server::Judge(ShadowPairs(seed, 200, 5, 3, 0), policy, server::JudgedPhase::kShadow);
    EXPECT_EQ(cold.outcome, Outcome::kPass) << cold.reason;
    // 30 % slower on a 1 ms model: the canary steps' to judge, not shadow's.
    const auto slight =
        server::Judge(ShadowPairs(seed, 200, 1000, 1.3, 0), policy, server::JudgedPhase::kShadow);
    EXPECT_EQ(slight.outcome, Outcome::kPass) << slight.reason;
    // Three times slower on a 1 ms model: fails.
    const auto triple =
        server::Judge(ShadowPairs(seed, 200, 1000, 3, 0), policy, server::JudgedPhase::kShadow);
    EXPECT_EQ(triple.outcome, Outcome::kFail) << triple.reason;
  }
  // Without latencies (a runtime that measured none), errors alone, as before.
  server::JudgeWindow errors_only;
  errors_only.candidate.requests = errors_only.stable.requests = 200;
  EXPECT_EQ(server::Judge(errors_only, policy, server::JudgedPhase::kShadow).outcome,
            Outcome::kPass);
}

// ---- Whole servers ------------------------------------------------------------------------------

TEST(ShadowRolloutTest, ACandidateThousandsOfTimesSlowerIsRolledBackInShadowOnItsLatency) {
  auto server =
      StartRolloutServer(R"({"shadow_fraction": 1.0, "min_samples": 30, "steps": [50, 100]})");
  Clients clients(*server, 2);
  ASSERT_TRUE(Eventually([&] { return clients.answers() > 20; }, std::chrono::seconds(30)));
  server->Deploy("ValidSlow");  // the same outputs, 5 ms slower
  const json view = server->WaitForDecision();
  clients.Stop();

  ASSERT_EQ(view["phase"], "rolled_back") << view.dump(2);
  EXPECT_EQ(view["decided_by"], "policy");
  EXPECT_THAT(view["reason"].get<std::string>(), HasSubstr("shadow: latency: the candidate is "));
  EXPECT_THAT(view["reason"].get<std::string>(), HasSubstr("in shadow"));
  EXPECT_EQ(view["totals"]["candidate"]["requests"], 0) << "no client's request ran on it";
  EXPECT_TRUE(clients.failures().empty()) << clients.failures().front();
}

TEST(ShadowRolloutTest, ACandidateWhoseShadowRunTimesOutIsRolledBackWhileItRuns) {
  auto server =
      StartRolloutServer(R"({"shadow_fraction": 1.0, "min_samples": 30, "steps": [50, 100]})");
  Clients clients(*server, 2);
  ASSERT_TRUE(Eventually([&] { return clients.answers() > 20; }, std::chrono::seconds(30)));
  const auto deployed = std::chrono::steady_clock::now();
  server->Deploy("ValidStalls");  // every execution takes 3 s; shadow runs time out at 1 s
  const json view = server->WaitForDecision();
  const auto decided = std::chrono::steady_clock::now();
  clients.Stop();

  ASSERT_EQ(view["phase"], "rolled_back") << view.dump(2);
  EXPECT_EQ(view["decided_by"], "policy");
  EXPECT_THAT(view["reason"].get<std::string>(),
              HasSubstr("shadow: 1 run(s) of the candidate took longer than 1000 ms"));
  EXPECT_LT(decided - deployed, std::chrono::seconds(20)) << "not while its first run ran";
  EXPECT_TRUE(clients.failures().empty()) << clients.failures().front();
}

// Issue 40, item 12: set during shadow, the option reached the stable instance only; the
// identical build then diverged and was rolled back.
TEST(ShadowRolloutTest, AnOptionSetDuringShadowReachesTheCandidateAndAnIdenticalBuildIsPromoted) {
  auto server = StartRolloutServer(
      R"({"shadow_fraction": 1.0, "min_samples": 300, "steps": [50, 100],
          "max_latency_regression": 1000000})");
  Clients clients(*server, 2);
  ASSERT_TRUE(Eventually([&] { return clients.answers() > 20; }, std::chrono::seconds(30)));
  const json deployed = server->Deploy("ValidGoodFix");
  ASSERT_EQ(deployed["action"], "candidate") << deployed.dump();
  ASSERT_TRUE(Eventually(
      [&] {
        const json view = server->Rollout();
        return view["phase"] == "shadow" && view["totals"]["shadow"]["samples"].get<int>() >= 10;
      },
      std::chrono::seconds(30)))
      << server->Rollout().dump(2);
  {
    auto client = server->Client();
    const auto reply =
        Put(*client, std::string("/v2/backends/") + RolloutServer::kBackend + "/options",
            R"({"execute_offset": 0.5, "prepared_offset": 0.25})");
    ASSERT_EQ(reply.status, 200) << reply.text;
  }
  EXPECT_EQ(server->Rollout()["phase"], "shadow") << "the option came too late to test anything";
  const json view = server->WaitForDecision();
  clients.Stop();

  ASSERT_EQ(view["phase"], "promoted") << view.dump(2);
  EXPECT_EQ(view["totals"]["shadow"]["diverged"], 0);
  EXPECT_GE(view["totals"]["shadow"]["samples"].get<int>(), 300);
  EXPECT_TRUE(clients.failures().empty()) << clients.failures().front();
  // The promoted build answers with the option's values.
  auto client = server->Client();
  const auto reply = Post(*client, "/v2/models/identity/infer", RowRequest(1));
  ASSERT_EQ(reply.status, 200) << reply.text;
  EXPECT_EQ(reply.body["outputs"][0]["data"][0].get<float>(), 1.75f) << reply.text;
}

}  // namespace
}  // namespace backplane::testing
