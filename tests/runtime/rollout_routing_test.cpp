// Progressive rollout in the runtime (issue 22): a candidate generation bound beside the active
// one, requests split by the share they are told, a request id kept on its generation as the
// share grows (seeded random keys and shares), shadow runs compared off the response path, and
// promotion or rollback ending it, with requests running wholly on one generation throughout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <thread>

#include "backplane/runtime/runtime.hpp"
#include "runtime/swap_test_util.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::kNextOffset;

constexpr char kId[] = "TestValid";
// TwoLayerIdentityNetwork adds the build's offset twice: 0 on Valid, this on ValidNext.
constexpr float kCandidateOffset = 2 * kNextOffset;

class RolloutRoutingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Publish("Valid");
    auto registry = BackendRegistry::Create({.backend_paths = std::vector{dir_.path()},
                                             .settle_time = std::chrono::milliseconds(0),
                                             .deploy_policy = DeployPolicy::kProgressive});
    ASSERT_TRUE(registry.ok()) << registry.error().ToString();
    registry_ = std::move(registry).value();
    auto runtime = Runtime::Create({.registry = registry_});
    ASSERT_TRUE(runtime.ok()) << runtime.error().ToString();
    runtime_ = std::move(runtime).value();
    auto network = runtime_->LoadNetwork(testing::TwoLayerIdentityNetwork());
    ASSERT_TRUE(network.ok()) << network.error().ToString();
    network_ = network.value();
    stable_ = registry_->Describe(kId)->active_generation;
  }

  void Publish(std::string_view fixture) {
    const fs::path temporary = dir_ / ".incoming";
    testing::CopyFile(testing::Fixture(fixture), temporary);
    fs::rename(temporary, dir_ / "Test_Valid_backend.so");
  }

  // Deploys ValidNext: under the progressive policy, a candidate.
  uint64_t DeployCandidate() {
    Publish("ValidNext");
    auto outcome = registry_->Reload(kId);
    EXPECT_TRUE(outcome.ok());
    EXPECT_EQ(outcome->action, DeployOutcome::Action::kCandidate) << outcome->message;
    return outcome->generation;
  }

  // By how much the output exceeds the input: 0 (stable) or kCandidateOffset; NaN on failure.
  float Run(std::string_view key = {}) {
    Tensor input(TensorInfo{DataType::kFloat32, {4}});
    for (float& value : input.Elements<float>())
      value = 5;
    const ConstTensorView views[] = {input.View()};
    auto outputs = runtime_->Execute(network_, views, key);
    if (!outputs.ok())
      return NAN;
    return outputs->front().Elements<float>()[0] - 5;
  }

  testing::TempDir dir_;
  std::shared_ptr<BackendRegistry> registry_;
  std::unique_ptr<Runtime> runtime_;
  NetworkId network_ = 0;
  uint64_t stable_ = 0;
};

TEST_F(RolloutRoutingTest, NothingGoesToACandidateUntilToldAndOnlyWhileThereIsOne) {
  EXPECT_EQ(runtime_->SetRolloutTraffic(kId, {.candidate_percent = 50}).code(),
            StatusCode::kNotFound);
  EXPECT_FALSE(runtime_->GetRolloutStats(kId).has_value());
  const uint64_t candidate = DeployCandidate();
  const auto status = registry_->Describe(kId);
  EXPECT_EQ(status->active_generation, stable_);
  EXPECT_EQ(status->candidate_generation, candidate);
  for (int i = 0; i < 50; ++i)
    ASSERT_EQ(Run(), 0.0f);
  auto stats = runtime_->GetRolloutStats(kId);
  ASSERT_TRUE(stats.has_value());
  EXPECT_EQ(stats->networks, 1u);
  EXPECT_EQ(stats->stable.generation, stable_);
  EXPECT_EQ(stats->candidate.generation, candidate);
  EXPECT_EQ(stats->stable.requests, 50u);
  EXPECT_EQ(stats->candidate.requests, 0u);
  EXPECT_EQ(stats->stable.latency.total(), 50u);
}

TEST_F(RolloutRoutingTest, RequestsSplitByTheShareAndAKeyKeepsItsGenerationAsTheShareGrows) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  DeployCandidate();

  std::vector<std::string> keys;
  for (int i = 0; i < 300; ++i)
    keys.push_back("request-" + std::to_string(random()));
  std::map<std::string, bool> on_candidate;  // at the previous share
  // Increasing shares, drawn at random, ending at 100.
  std::vector<double> shares;
  for (double share = 0; share < 100;) {
    share = std::min(100.0, share + std::uniform_real_distribution<double>(1, 40)(random));
    shares.push_back(std::round(share * 100) / 100);
  }
  for (double share : shares) {
    SCOPED_TRACE("share " + std::to_string(share) + " %");
    ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.candidate_percent = share}).ok());
    int candidates = 0;
    for (const auto& key : keys) {
      const float first = Run(key);
      ASSERT_TRUE(first == 0.0f || first == kCandidateOffset) << first;
      EXPECT_EQ(Run(key), first) << key << " moved between two requests at one share";
      const bool candidate = first == kCandidateOffset;
      if (on_candidate[key]) {
        EXPECT_TRUE(candidate) << key << " left the candidate as its share grew";
      }
      on_candidate[key] = candidate;
      candidates += candidate;
    }
    // Binomial: within four standard deviations (and 1 %) of the share.
    const double n = static_cast<double>(keys.size());
    const double expected = n * share / 100;
    const double slack = 4 * std::sqrt(n * share / 100 * (1 - share / 100)) + 0.01 * n;
    EXPECT_NEAR(candidates, expected, slack);
    // Without a key, each request is drawn afresh, at the same share.
    int unkeyed = 0;
    for (int i = 0; i < 300; ++i)
      unkeyed += Run() == kCandidateOffset;
    EXPECT_NEAR(unkeyed, 300 * share / 100,
                4 * std::sqrt(300 * share / 100 * (1 - share / 100)) + 3);
  }
  // At 100 % every request runs on the candidate.
  for (const auto& key : keys)
    EXPECT_EQ(Run(key), kCandidateOffset);
}

TEST_F(RolloutRoutingTest, ShadowRunsAreComparedOffTheResponsePathAndNeverAnswer) {
  DeployCandidate();
  ASSERT_TRUE(
      runtime_->SetRolloutTraffic(kId, {.shadow_fraction = 1.0, .shadow_tolerance = 0.5}).ok());
  for (int i = 0; i < 40; ++i)
    ASSERT_EQ(Run(), 0.0f) << "a shadow run answered";
  ASSERT_TRUE(testing::WaitFor([&] {
    auto stats = runtime_->GetRolloutStats(kId);
    return stats->shadow.samples + stats->shadow.skipped == 40;
  }));
  const auto stats = runtime_->GetRolloutStats(kId);
  EXPECT_GT(stats->shadow.samples, 0u);
  EXPECT_EQ(stats->shadow.diverged, stats->shadow.samples);
  EXPECT_EQ(stats->shadow.errors, 0u);
  EXPECT_EQ(stats->shadow.max_abs_difference, kCandidateOffset);
  EXPECT_NEAR(stats->shadow.max_relative_difference, kCandidateOffset / 5, 1e-3);
  EXPECT_EQ(stats->stable.requests, 40u);
  EXPECT_EQ(stats->candidate.requests, 0u);  // shadow runs are not the candidate's requests
}

TEST_F(RolloutRoutingTest, RequestsRunWhollyOnOneGenerationWhileTheShareMovesAndItIsPromoted) {
  const uint64_t candidate = DeployCandidate();
  std::atomic<bool> stop{false};
  std::atomic<int> mixed{0}, failed{0}, ran{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 3; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; !stop.load(); ++i) {
        const float offset = Run(i % 2 == 0 ? "client" + std::to_string(c) + "-" + std::to_string(i)
                                            : std::string());
        if (std::isnan(offset))
          ++failed;
        else if (offset != 0.0f && offset != kCandidateOffset)
          ++mixed;
        ++ran;
      }
    });
  }
  for (double share : {1.0, 10.0, 50.0, 100.0}) {
    ASSERT_TRUE(
        runtime_
            ->SetRolloutTraffic(
                kId, {.candidate_percent = share, .shadow_fraction = 0.2, .shadow_tolerance = 1e9})
            .ok());
    const int before = ran.load();
    ASSERT_TRUE(testing::WaitFor([&] { return ran.load() > before + 100; }));
  }
  auto promoted = registry_->Promote(kId, candidate);
  ASSERT_TRUE(promoted.ok()) << promoted.error().ToString();
  EXPECT_EQ(promoted->action, DeployOutcome::Action::kActivated);
  const int at_promotion = ran.load();
  ASSERT_TRUE(testing::WaitFor([&] { return ran.load() > at_promotion + 100; }));
  stop.store(true);
  for (auto& client : clients)
    client.join();
  EXPECT_EQ(mixed.load(), 0);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_FALSE(runtime_->GetRolloutStats(kId).has_value());
  EXPECT_EQ(registry_->Describe(kId)->active_generation, candidate);
  EXPECT_EQ(registry_->Describe(kId)->candidate_generation, 0u);
  EXPECT_EQ(Run("any"), kCandidateOffset);
  // A decision about a candidate that is not there any more changes nothing.
  EXPECT_EQ(registry_->Promote(kId, candidate).error().code(), StatusCode::kFailedPrecondition);
}

TEST_F(RolloutRoutingTest, ARolledBackCandidateLeavesAndItsFileIsNotDeployedAgain) {
  const uint64_t candidate = DeployCandidate();
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.candidate_percent = 100}).ok());
  ASSERT_EQ(Run(), kCandidateOffset);
  EXPECT_EQ(registry_->DropCandidate(kId, "test", candidate + 1).error().code(),
            StatusCode::kFailedPrecondition);  // another generation's decision
  auto dropped = registry_->DropCandidate(kId, "outputs differ", candidate);
  ASSERT_TRUE(dropped.ok()) << dropped.error().ToString();
  EXPECT_EQ(dropped.value(), candidate);
  EXPECT_EQ(Run(), 0.0f);
  EXPECT_FALSE(runtime_->GetRolloutStats(kId).has_value());
  const auto status = registry_->Describe(kId);
  EXPECT_EQ(status->active_generation, stable_);
  EXPECT_EQ(status->candidate_generation, 0u);
  ASSERT_FALSE(status->rejected.empty());
  EXPECT_EQ(status->rejected.front().error.reason(), LoadReason::kRolledBack);
  EXPECT_THAT(status->rejected.front().error.message(), HasSubstr("outputs differ"));
  // A rescan leaves the rolled-back file alone; its generation unloads.
  const auto rescan = registry_->Rescan();
  EXPECT_TRUE(rescan.outcomes.empty());
  EXPECT_EQ(registry_->Describe(kId)->candidate_generation, 0u);
  long refcount = -1;
  EXPECT_TRUE(testing::WaitFor([&] {
    const auto now = registry_->Describe(kId);  // kept: the loop reads into it
    for (const auto& generation : now->generations) {
      if (generation.generation == candidate)
        refcount = generation.refcount;
    }
    return refcount == 0;
  })) << refcount;
  EXPECT_EQ(registry_->DropCandidate(kId, "again").error().code(), StatusCode::kFailedPrecondition);
}

TEST_F(RolloutRoutingTest, TheStableFileDesignatedAgainEndsTheRollout) {
  // Versions side by side, the unversioned name a link: re-pointing it is a deploy either way.
  testing::CopyFile(testing::Fixture("Valid"), dir_ / "Test_Valid_backend.so.1.2.3");
  testing::CopyFile(testing::Fixture("ValidNext"), dir_ / "Test_Valid_backend.so.1.2.4");
  auto relink = [&](const char* target) {
    fs::create_symlink(target, dir_ / ".link");
    fs::rename(dir_ / ".link", dir_ / "Test_Valid_backend.so");
  };
  relink("Test_Valid_backend.so.1.2.3");
  // Another file, the same content: nothing to roll out, activated at once.
  ASSERT_EQ(registry_->Reload(kId)->action, DeployOutcome::Action::kActivated);
  const uint64_t stable = registry_->Describe(kId)->active_generation;

  relink("Test_Valid_backend.so.1.2.4");
  const auto proposed = registry_->Reload(kId);
  ASSERT_EQ(proposed->action, DeployOutcome::Action::kCandidate) << proposed->message;
  relink("Test_Valid_backend.so.1.2.3");  // back to the file that serves
  const auto back = registry_->Reload(kId);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->action, DeployOutcome::Action::kRejected) << back->message;
  EXPECT_THAT(back->message, HasSubstr("designates the stable generation again"));
  EXPECT_EQ(registry_->Describe(kId)->candidate_generation, 0u);
  EXPECT_EQ(registry_->Describe(kId)->active_generation, stable);
  EXPECT_FALSE(runtime_->GetRolloutStats(kId).has_value());
  EXPECT_EQ(Run(), 0.0f);
}

TEST_F(RolloutRoutingTest, TheStableContentPublishedAgainIsActivatedAtOnceEndingTheRollout) {
  const uint64_t candidate = DeployCandidate();
  Publish("Valid");  // a new file (another inode) with the stable generation's content
  const auto outcome = registry_->Reload(kId);
  ASSERT_TRUE(outcome.ok());
  EXPECT_EQ(outcome->action, DeployOutcome::Action::kActivated) << outcome->message;
  const auto status = registry_->Describe(kId);
  EXPECT_EQ(status->candidate_generation, 0u);
  EXPECT_NE(status->active_generation, stable_);
  EXPECT_FALSE(runtime_->GetRolloutStats(kId).has_value());
  ASSERT_FALSE(status->rejected.empty());
  EXPECT_THAT(status->rejected.front().error.message(),
              HasSubstr("designates the stable generation's content again"));
  for (const auto& generation : status->generations) {
    if (generation.generation == candidate) {
      EXPECT_EQ(generation.state, GenerationState::kRejected);
    }
  }
  EXPECT_EQ(Run(), 0.0f);
}

// A network's own options (issue 41) bind it on a candidate too, and an update of them reaches
// both bindings; after promotion the network keeps them.
TEST_F(RolloutRoutingTest, ANetworksOwnOptionsBindItOnTheCandidateAndAnUpdateReachesBoth) {
  auto own = runtime_->LoadNetwork(testing::TwoLayerIdentityNetwork(),
                                   {.backend_options = {{kId, {{"prepared_offset", 5.0}}}}});
  ASSERT_TRUE(own.ok()) << own.error().ToString();
  const auto run_own = [&] { return testing::ExecuteOffset(*runtime_, own.value()); };
  const uint64_t candidate = DeployCandidate();
  EXPECT_EQ(run_own(), 10.0f) << "the stable binding";
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.candidate_percent = 100}).ok());
  EXPECT_EQ(run_own(), kCandidateOffset + 10.0f) << "the candidate binding has the values";

  ASSERT_TRUE(runtime_->UpdateNetworkOptions(own.value(), kId, {{"prepared_offset", 7.0}}).ok());
  EXPECT_EQ(run_own(), kCandidateOffset + 14.0f) << "the candidate binding updated";
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.candidate_percent = 0}).ok());
  EXPECT_EQ(run_own(), 14.0f) << "the stable binding updated";
  EXPECT_EQ(runtime_->GetRolloutStats(kId)->networks, 2u) << "still bound on the candidate";

  auto promoted = registry_->Promote(kId, candidate);
  ASSERT_TRUE(promoted.ok()) << promoted.error().ToString();
  EXPECT_EQ(run_own(), kCandidateOffset + 14.0f) << "promoted with the network's values";
  EXPECT_EQ(Run(), kCandidateOffset) << "the other network has none";
}

}  // namespace
}  // namespace backplane
