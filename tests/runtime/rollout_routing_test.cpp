// Progressive rollout in the runtime (issue 22): a candidate generation bound beside the active
// one, requests split by the share they are told, a request id kept on its generation as the
// share grows (seeded random keys and shares), shadow runs compared off the response path, and
// promotion or rollback ending it, with requests running wholly on one generation throughout.
// And the rollout's baseline (the stable build loaded again beside the candidate): a third arm
// with a share of its own, bound, updated and released with the candidate.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "backplane/isolation/worker_runner.hpp"
#include "backplane/runtime/runtime.hpp"
#include "rollout_meter.hpp"
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
  void SetUp() override { Start(); }

  // `loader`: the registry's (null: the process's); `on_crashed_request`: the runtime's.
  void Start(std::shared_ptr<loader::Loader> loader = nullptr,
             std::function<void(const CrashedRequest&)> on_crashed_request = {}) {
    Publish("Valid");
    auto registry = BackendRegistry::Create({.backend_paths = std::vector{dir_.path()},
                                             .loader = std::move(loader),
                                             .settle_time = std::chrono::milliseconds(0),
                                             .deploy_policy = DeployPolicy::kProgressive});
    ASSERT_TRUE(registry.ok()) << registry.error().ToString();
    registry_ = std::move(registry).value();
    auto runtime = Runtime::Create(
        {.registry = registry_, .on_crashed_request = std::move(on_crashed_request)});
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
  // `first`: the input's first element (a crashing fixture's mark), the others are 5.
  float Run(std::string_view key = {}, float first = 5) {
    Tensor input(TensorInfo{DataType::kFloat32, {4}});
    for (float& value : input.Elements<float>())
      value = 5;
    input.Elements<float>()[0] = first;
    const ConstTensorView views[] = {input.View()};
    auto outputs = runtime_->Execute(network_, views, key);
    if (!outputs.ok())
      return NAN;
    return outputs->front().Elements<float>()[1] - 5;
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

// Per-call options (SDK 1.4) go with the request to whichever arm it is routed to: the
// candidate's binding runs with the call's values as the stable one does.
TEST_F(RolloutRoutingTest, CallOptionsGoWithTheRequestToEitherArm) {
  const CallOptions options = {{kId, {{"call_offset", 1.0}}}};
  const auto run = [&] {
    Tensor input(TensorInfo{DataType::kFloat32, {4}});
    const ConstTensorView views[] = {input.View()};
    auto outputs = runtime_->Execute(network_, views, {}, options);
    return outputs.ok() ? outputs->front().Elements<float>()[0] : NAN;
  };
  DeployCandidate();
  EXPECT_EQ(run(), 2.0f);
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.candidate_percent = 100}).ok());
  EXPECT_EQ(run(), kCandidateOffset + 2.0f);
  EXPECT_EQ(Run(), kCandidateOffset) << "for that call alone";
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

// ---- Baselines ------------------------------------------------------------------------------

// How many of `keys` each arm gets.
std::map<RolloutArm, int> CountArms(const RolloutMeter& meter,
                                    const std::vector<std::string>& keys) {
  std::map<RolloutArm, int> counts;
  for (const auto& key : keys)
    ++counts[meter.ChooseArm(key)];
  return counts;
}

// Binomial: within four standard deviations (and 0.5 % of n) of n * percent / 100.
void ExpectShare(int count, std::size_t n, double percent, std::string_view arm) {
  const double trials = static_cast<double>(n);
  const double p = percent / 100;
  EXPECT_NEAR(count, trials * p, 4 * std::sqrt(trials * p * (1 - p)) + 0.005 * trials)
      << arm << " at " << percent << " %";
}

std::vector<std::string> RandomKeys(std::mt19937_64& random, int count) {
  std::vector<std::string> keys;
  for (int i = 0; i < count; ++i)
    keys.push_back("request-" + std::to_string(random()));
  return keys;
}

TEST(RolloutMeterTest, KeysAndDrawsSplitAmongCandidateBaselineAndStableByTheirShares) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  const std::vector<std::string> keys = RandomKeys(random, 20000);
  // The edges among them: no baseline share, the baseline taking the rest, one arm all.
  const std::pair<double, double> shares[] = {{1, 1},   {5, 5},      {10, 30},      {30, 70},
                                              {50, 50}, {20, 0},     {0, 40},       {100, 0},
                                              {0, 100}, {0.5, 99.5}, {12.34, 56.78}};
  for (const auto& [candidate, baseline] : shares) {
    SCOPED_TRACE("candidate " + std::to_string(candidate) + " %, baseline " +
                 std::to_string(baseline) + " %");
    RolloutMeter meter(1, 2, 3);
    meter.SetTraffic({.candidate_percent = candidate, .baseline_percent = baseline});
    EXPECT_DOUBLE_EQ(meter.traffic().candidate_percent, candidate);
    EXPECT_DOUBLE_EQ(meter.traffic().baseline_percent, baseline);
    auto counts = CountArms(meter, keys);
    ExpectShare(counts[RolloutArm::kCandidate], keys.size(), candidate, "candidate");
    ExpectShare(counts[RolloutArm::kBaseline], keys.size(), baseline, "baseline");
    ExpectShare(counts[RolloutArm::kStable], keys.size(), 100 - candidate - baseline, "stable");
    // An arm with no share gets no key at all.
    EXPECT_EQ(counts[RolloutArm::kCandidate] == 0, candidate == 0);
    EXPECT_EQ(counts[RolloutArm::kBaseline] == 0, baseline == 0);
    EXPECT_EQ(counts[RolloutArm::kStable] == 0, candidate + baseline == 100);
    // Without a key, a fresh draw each time, at the same shares.
    std::map<RolloutArm, int> drawn;
    for (std::size_t i = 0; i < keys.size(); ++i)
      ++drawn[meter.ChooseArm({})];
    ExpectShare(drawn[RolloutArm::kCandidate], keys.size(), candidate, "candidate (no key)");
    ExpectShare(drawn[RolloutArm::kBaseline], keys.size(), baseline, "baseline (no key)");
  }
}

TEST(RolloutMeterTest, AKeyOnTheCandidateStaysThereAsItsShareGrowsBesideABaseline) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  const std::vector<std::string> keys = RandomKeys(random, 2000);
  RolloutMeter meter(1, 2, 3);
  std::map<std::string, RolloutArm> previous;
  for (double candidate = 0; candidate < 100;) {
    candidate = std::min(100.0, candidate + std::uniform_real_distribution<double>(1, 30)(random));
    // The baseline mirrors the candidate (Kayenta's equal arms) while there is room.
    const double baseline = std::min(candidate, 100 - candidate);
    SCOPED_TRACE("candidate " + std::to_string(candidate) + " %, baseline " +
                 std::to_string(baseline) + " %");
    meter.SetTraffic({.candidate_percent = candidate, .baseline_percent = baseline});
    for (const auto& key : keys) {
      const RolloutArm arm = meter.ChooseArm(key);
      EXPECT_EQ(meter.ChooseArm(key), arm) << key << " moved between two requests at one share";
      if (previous.contains(key) && previous[key] == RolloutArm::kCandidate) {
        EXPECT_EQ(arm, RolloutArm::kCandidate) << key << " left the candidate as its share grew";
      }
      previous[key] = arm;
    }
  }
}

TEST(RolloutMeterTest, WithoutABaselineItsShareIsIgnoredAndTheSplitIsTheCandidatesAlone) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  const std::vector<std::string> keys = RandomKeys(random, 2000);
  RolloutMeter without(1, 2);
  without.SetTraffic({.candidate_percent = 30, .baseline_percent = 40});
  EXPECT_EQ(without.traffic().baseline_percent, 0) << "nothing is routed to a baseline";
  RolloutMeter candidate_only(1, 2, 3);
  candidate_only.SetTraffic({.candidate_percent = 30});
  for (const auto& key : keys)
    EXPECT_EQ(without.ChooseArm(key), candidate_only.ChooseArm(key)) << key;
  EXPECT_EQ(CountArms(without, keys)[RolloutArm::kBaseline], 0);
  const RolloutStats stats = without.Snapshot();
  EXPECT_EQ(stats.baseline.generation, 0u);
  EXPECT_FALSE(stats.baseline_lost);
}

TEST(RolloutMeterTest, SharesOverAHundredPercentAreClampedTheCandidatesFirst) {
  RolloutMeter meter(1, 2, 3);
  meter.SetTraffic({.candidate_percent = 70, .baseline_percent = 50});
  EXPECT_DOUBLE_EQ(meter.traffic().candidate_percent, 70);
  EXPECT_DOUBLE_EQ(meter.traffic().baseline_percent, 30);
  meter.SetTraffic({.candidate_percent = 150, .baseline_percent = 50});
  EXPECT_DOUBLE_EQ(meter.traffic().candidate_percent, 100);
  EXPECT_DOUBLE_EQ(meter.traffic().baseline_percent, 0);
}

// Shadow runs compare outputs as numbers of their own type: INT8 -1 against 1 is 2 apart (read
// as bytes they were 255 and 1, 254 apart, and a quantized model's shadow diverged on noise).
TEST(RolloutMeterTest, OutputsAreComparedAsNumbersOfTheirOwnType) {
  const auto tensor = [](DataType type, std::vector<uint8_t> bytes) {
    Tensor made(TensorInfo{type, {static_cast<int64_t>(bytes.size())}});
    std::memcpy(made.bytes().data(), bytes.data(), bytes.size());
    return made;
  };
  // -1, 1, -128 against 1, 1, 127.
  const Tensor a8 = tensor(DataType::kInt8, {0xff, 0x01, 0x80});
  const Tensor b8 = tensor(DataType::kInt8, {0x01, 0x01, 0x7f});
  EXPECT_DOUBLE_EQ(MaxDifference(a8, b8), 255);  // -128 against 127
  const Tensor c8 = tensor(DataType::kInt8, {0xff});
  const Tensor d8 = tensor(DataType::kInt8, {0x01});
  EXPECT_DOUBLE_EQ(MaxDifference(c8, d8), 2);
  // The same bytes as UINT8 are 255 against 1.
  EXPECT_DOUBLE_EQ(
      MaxDifference(tensor(DataType::kUint8, {0xff}), tensor(DataType::kUint8, {0x01})), 254);
  const std::vector<Tensor> expected = {tensor(DataType::kInt8, {0xfe, 0x00})};  // -2, 0
  const std::vector<Tensor> actual = {tensor(DataType::kInt8, {0xff, 0x00})};    // -1, 0
  const OutputDivergence divergence = CompareOutputs(expected, actual);
  EXPECT_FALSE(divergence.shapes_differ);
  EXPECT_DOUBLE_EQ(divergence.max_abs, 1);
}

TEST(RolloutMeterTest, ALostBaselineGetsNothingMoreAndTheCandidateKeepsItsKeys) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  const std::vector<std::string> keys = RandomKeys(random, 2000);
  RolloutMeter meter(1, 2, 3);
  meter.SetTraffic({.candidate_percent = 10, .baseline_percent = 50});
  std::map<std::string, RolloutArm> before;
  for (const auto& key : keys)
    before[key] = meter.ChooseArm(key);
  meter.RecordExecution(RolloutArm::kBaseline, 10, Status::Ok());
  EXPECT_TRUE(meter.LoseBaseline());
  EXPECT_FALSE(meter.LoseBaseline()) << "lost once";
  for (const auto& key : keys) {
    const RolloutArm arm = meter.ChooseArm(key);
    EXPECT_NE(arm, RolloutArm::kBaseline) << key;
    EXPECT_EQ(arm == RolloutArm::kCandidate, before[key] == RolloutArm::kCandidate) << key;
  }
  const RolloutStats stats = meter.Snapshot();
  EXPECT_TRUE(stats.baseline_lost);
  EXPECT_EQ(stats.baseline.generation, 3u);
  EXPECT_EQ(stats.baseline.requests, 1u) << "its numbers so far stay";
}

// The runtime's side of a baseline, end to end with real fixture builds (a crashing one in a
// worker process: the registry's loader can start workers, and starts one only when a load asks
// for it, Loader::Placement::kWorker). The registry's side
// (BackendRegistryOptions::baseline_generations) is not this test's: the runtime is handed the
// change by hand, as the registry's coordinator hands it (backend_change.hpp), with generations
// loaded from the registry's loader.
class RolloutBaselineTest : public RolloutRoutingTest {
 protected:
  void SetUp() override {
    loader::LoaderOptions options;
    options.out_of_process = isolation::MakeWorkerRunner({});
    auto loader = loader::Loader::Create(std::move(options));
    ASSERT_TRUE(loader.ok()) << loader.error().ToString();
    Start(std::move(loader).value(), [this](const CrashedRequest&) {
      ++crashed_requests_;
      if (throw_on_crash_)
        throw std::runtime_error("the crash journal is full");
    });
    if (HasFatalFailure())
      return;
    stable_lease_ = registry_->Find(kId)->generation;
    candidate_ = Load("ValidNext");
    baseline_ = Load("Valid");  // the stable build loaded again: a generation of its own
  }

  loader::GenerationLease Load(
      std::string_view fixture,
      loader::Loader::Placement placement = loader::Loader::Placement::kAsConfigured) {
    auto loaded = registry_->loader().Load(testing::Fixture(fixture), nullptr,
                                           loader::Loader::Reuse::kNever, nullptr, placement);
    EXPECT_TRUE(loaded.ok()) << loaded.error().ToString();
    return loaded.ok() ? std::move(loaded).value() : nullptr;
  }

  // Prepared and committed as ChangeCoordinator does it for one subscriber.
  Status Propose(const BackendChange& change) {
    // The runtime subscribes privately (a registry is its one caller): a C-style cast is the one
    // conversion allowed to name a private base.
    auto& subscriber = (BackendSubscriber&)*runtime_;  // NOLINT(google-readability-casting)
    auto prepared = subscriber.PrepareChange(change);
    if (!prepared.ok())
      return std::move(prepared).error();
    const std::unique_ptr<PreparedChange> commit = std::move(prepared).value();
    commit->BeginCommit();
    {
      const auto lock = commit->LockState();
      if (!commit->IsCurrent())
        return FailedPrecondition("the runtime changed while the change was prepared");
      commit->Commit();
    }
    commit->AfterCommit();
    return Status::Ok();
  }

  Status ProposeCandidateWithBaseline() {
    return Propose({.backend_id = kId,
                    .next = candidate_,
                    .previous = stable_lease_,
                    .target = BackendChange::Target::kCandidate,
                    .baseline = baseline_});
  }

  // The test's own references to the trial generations dropped; what is left of them is the
  // runtime's.
  std::pair<std::weak_ptr<const loader::Generation>, std::weak_ptr<const loader::Generation>>
  ForgetTrialGenerations() {
    std::weak_ptr<const loader::Generation> candidate = candidate_, baseline = baseline_;
    candidate_.reset();
    baseline_.reset();
    return {candidate, baseline};
  }

  uint64_t Generation(const loader::GenerationLease& lease) const { return lease->info().number; }

  loader::GenerationLease stable_lease_;
  loader::GenerationLease candidate_;
  loader::GenerationLease baseline_;
  std::atomic<int> crashed_requests_{0};  // told to RuntimeOptions::on_crashed_request
  std::atomic<bool> throw_on_crash_{false};
};

TEST_F(RolloutBaselineTest, ABaselineIsBoundBesideTheCandidateOnEveryNetworkAndCountedOnItsArm) {
  const auto second = runtime_->LoadNetwork(testing::TwoLayerIdentityNetwork());
  ASSERT_TRUE(second.ok()) << second.error().ToString();
  ASSERT_TRUE(ProposeCandidateWithBaseline().ok());
  auto stats = runtime_->GetRolloutStats(kId);
  ASSERT_TRUE(stats.has_value());
  EXPECT_EQ(stats->networks, 2u);
  EXPECT_EQ(stats->stable.generation, stable_);
  EXPECT_EQ(stats->candidate.generation, Generation(candidate_));
  EXPECT_EQ(stats->baseline.generation, Generation(baseline_));
  EXPECT_NE(stats->baseline.generation, stable_) << "the stable build loaded again";
  EXPECT_FALSE(stats->baseline_lost);

  // All on the baseline: both networks run there (one without a baseline binding would have
  // stayed on the stable arm), with the stable build's outputs.
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.baseline_percent = 100}).ok());
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(Run(), 0.0f);
    ASSERT_EQ(testing::ExecuteOffset(*runtime_, second.value()), 0.0f);
  }
  stats = runtime_->GetRolloutStats(kId);
  EXPECT_EQ(stats->baseline.requests, 20u);
  EXPECT_EQ(stats->baseline.latency.total(), 20u);
  EXPECT_EQ(stats->stable.requests, 0u);
  EXPECT_EQ(stats->candidate.requests, 0u);
  EXPECT_DOUBLE_EQ(stats->traffic.baseline_percent, 100);

  // Half and half: every request on one of the two trial arms, each counted on its own.
  ASSERT_TRUE(
      runtime_->SetRolloutTraffic(kId, {.candidate_percent = 50, .baseline_percent = 50}).ok());
  int on_candidate = 0;
  for (int i = 0; i < 200; ++i) {
    const float offset = Run();
    ASSERT_TRUE(offset == 0.0f || offset == kCandidateOffset) << offset;
    on_candidate += offset == kCandidateOffset;
  }
  stats = runtime_->GetRolloutStats(kId);
  EXPECT_EQ(stats->candidate.requests, static_cast<uint64_t>(on_candidate));
  EXPECT_EQ(stats->baseline.requests, 20u + 200 - on_candidate);
  EXPECT_EQ(stats->stable.requests, 0u);
  EXPECT_GT(on_candidate, 0);
  EXPECT_LT(on_candidate, 200);
}

TEST_F(RolloutBaselineTest, DroppingTheCandidateReleasesItsBaselineToo) {
  ASSERT_TRUE(ProposeCandidateWithBaseline().ok());
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.baseline_percent = 100}).ok());
  ASSERT_EQ(Run(), 0.0f);
  const auto [candidate, baseline] = ForgetTrialGenerations();
  ASSERT_TRUE(Propose({.backend_id = kId,
                       .previous = stable_lease_,
                       .target = BackendChange::Target::kCandidate})
                  .ok());
  EXPECT_FALSE(runtime_->GetRolloutStats(kId).has_value());
  EXPECT_EQ(Run(), 0.0f);
  // Their last references (the route's bindings, the slots' instances) go on the reaper.
  EXPECT_TRUE(testing::WaitFor([&] { return candidate.expired(); }))
      << candidate.use_count() << " references to the candidate left";
  EXPECT_TRUE(testing::WaitFor([&] { return baseline.expired(); }))
      << baseline.use_count() << " references to the baseline left";
}

TEST_F(RolloutBaselineTest, ANewActiveGenerationEndsBothArms) {
  ASSERT_TRUE(ProposeCandidateWithBaseline().ok());
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.baseline_percent = 100}).ok());
  ASSERT_EQ(Run(), 0.0f);
  const loader::GenerationLease promoted = candidate_;
  const auto [candidate, baseline] = ForgetTrialGenerations();
  ASSERT_TRUE(Propose({.backend_id = kId, .next = promoted, .previous = stable_lease_}).ok());
  EXPECT_FALSE(runtime_->GetRolloutStats(kId).has_value());
  EXPECT_EQ(Run(), kCandidateOffset);
  EXPECT_TRUE(testing::WaitFor([&] { return baseline.expired(); }))
      << baseline.use_count() << " references to the baseline left";
}

TEST_F(RolloutBaselineTest, OptionUpdatesReachTheBaselineInstanceAndItsBindings) {
  ASSERT_TRUE(ProposeCandidateWithBaseline().ok());
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.baseline_percent = 100}).ok());
  // One read at every Execute (the instance's), one when a workload is prepared (re-bound).
  Status updated =
      runtime_->UpdateBackendOptions(kId, {{"execute_offset", 3.0}, {"prepared_offset", 2.0}});
  ASSERT_TRUE(updated.ok()) << updated.ToString();
  EXPECT_EQ(Run(), 10.0f) << "on the baseline";
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.candidate_percent = 100}).ok());
  EXPECT_EQ(Run(), kCandidateOffset + 10.0f) << "on the candidate";
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {}).ok());
  EXPECT_EQ(Run(), 10.0f) << "on the stable generation";

  // A network's own options: its binding on the baseline is prepared again too.
  updated = runtime_->UpdateNetworkOptions(network_, kId, {{"prepared_offset", 7.0}});
  ASSERT_TRUE(updated.ok()) << updated.ToString();
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.baseline_percent = 100}).ok());
  EXPECT_EQ(Run(), 20.0f) << "on the baseline";
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {}).ok());
  EXPECT_EQ(Run(), 20.0f) << "on the stable generation";
  EXPECT_EQ(runtime_->GetRolloutStats(kId)->baseline.requests, 2u);

  // A refusal applies nothing, to any arm.
  EXPECT_EQ(runtime_->UpdateBackendOptions(kId, {{"limit", int64_t{-1}}}).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.baseline_percent = 100}).ok());
  EXPECT_EQ(Run(), 20.0f);
}

TEST_F(RolloutBaselineTest, ABaselineThatDoesNotPrepareRefusesTheChange) {
  baseline_ = Load("ValidNoWorkloads");
  const Status refused = ProposeCandidateWithBaseline();
  EXPECT_EQ(refused.reason(), LoadReason::kPrepareFailed) << refused.ToString();
  EXPECT_THAT(refused.message(),
              HasSubstr("baseline generation " + std::to_string(Generation(baseline_))));
  EXPECT_FALSE(runtime_->GetRolloutStats(kId).has_value()) << "nothing of it committed";
  EXPECT_EQ(Run(), 0.0f);
}

// A baseline's worker dies under a client's request (the stable build's crash, on this input):
// the client gets its answer from the stable generation, the crash is told as a candidate's is,
// and the baseline routes nothing more.
TEST_F(RolloutBaselineTest, ABaselineThatCrashesIsLostAndItsRequestRunsAgainOnTheStableBuild) {
  baseline_ = Load("ValidCrashes", loader::Loader::Placement::kWorker);
  ASSERT_NE(baseline_->out_of_process(), nullptr);
  ASSERT_TRUE(ProposeCandidateWithBaseline().ok());
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.baseline_percent = 100}).ok());
  ASSERT_EQ(Run(), 0.0f) << "on the baseline, in its worker";
  constexpr float kNullWrite = 9110;  // ValidCrashes dies of a SIGSEGV on it
  EXPECT_EQ(Run({}, kNullWrite), 0.0f) << "answered by the stable generation";
  EXPECT_EQ(crashed_requests_.load(), 1);
  auto stats = runtime_->GetRolloutStats(kId);
  EXPECT_TRUE(stats->baseline_lost);
  EXPECT_EQ(stats->baseline.requests, 2u);
  EXPECT_EQ(stats->baseline.errors, 1u);
  EXPECT_DOUBLE_EQ(stats->traffic.baseline_percent, 100) << "what was asked stays on record";
  for (int i = 0; i < 20; ++i)
    ASSERT_EQ(Run(), 0.0f);
  stats = runtime_->GetRolloutStats(kId);
  EXPECT_EQ(stats->baseline.requests, 2u) << "nothing routed to a lost baseline";
  EXPECT_EQ(stats->stable.requests, 20u);
  EXPECT_EQ(crashed_requests_.load(), 1);
}

// A shadow run warms the candidate: the baseline it is judged against runs the same input after
// it (its outcome unused), or the candidate would read faster than the same build. Seen here by
// an input that only the baseline's build dies of, on a request no client sent to the baseline.
TEST_F(RolloutBaselineTest, EveryShadowRunIsFollowedByTheSameInputOnTheBaseline) {
  baseline_ = Load("ValidCrashes", loader::Loader::Placement::kWorker);
  ASSERT_TRUE(ProposeCandidateWithBaseline().ok());
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.shadow_fraction = 1.0}).ok());
  constexpr float kNullWrite = 9110;  // ValidCrashes dies of a SIGSEGV on it
  ASSERT_EQ(Run({}, kNullWrite), 0.0f) << "answered by the stable generation";
  EXPECT_TRUE(testing::WaitFor([&] { return runtime_->GetRolloutStats(kId)->baseline_lost; }))
      << "the shadow run's input never reached the baseline";
  const RolloutStats stats = *runtime_->GetRolloutStats(kId);
  EXPECT_EQ(stats.baseline.requests, 0u) << "no client request ran on it";
  EXPECT_EQ(stats.shadow.samples, 1u);
  EXPECT_EQ(stats.shadow.errors, 0u) << "the candidate's run of it succeeded";
  EXPECT_EQ(crashed_requests_.load(), 1) << "the input that killed it is told as any crash's";
}

// A throw out of a shadow run (here the crash callback's, a user's code) used to leave the
// rollout's one shadow claim taken for good: every later sampled request was skipped.
TEST_F(RolloutBaselineTest, AShadowRunThatThrowsGivesItsClaimBack) {
  candidate_ = Load("ValidCrashes", loader::Loader::Placement::kWorker);
  ASSERT_TRUE(Propose({.backend_id = kId,
                       .next = candidate_,
                       .previous = stable_lease_,
                       .target = BackendChange::Target::kCandidate})
                  .ok());
  ASSERT_TRUE(runtime_->SetRolloutTraffic(kId, {.shadow_fraction = 1.0}).ok());
  throw_on_crash_ = true;
  constexpr float kNullWrite = 9110;
  ASSERT_EQ(Run({}, kNullWrite), 0.0f);  // its shadow run kills the candidate's worker
  ASSERT_TRUE(testing::WaitFor([&] { return crashed_requests_.load() == 1; }));
  // The dead worker fails every later shadow run at once, and the callback throws again: each
  // one is a shadow run that threw, and each needs the claim the one before gave back.
  uint64_t requests = 1;
  EXPECT_TRUE(testing::WaitFor([&] {
    EXPECT_EQ(Run(), 0.0f);
    ++requests;
    return crashed_requests_.load() >= 3;
  })) << "shadow runs skipped since the throw: "
      << runtime_->GetRolloutStats(kId)->shadow.skipped;
  // The runs that threw are counted as skipped, not lost: every sampled request is accounted.
  EXPECT_TRUE(testing::WaitFor([&] {
    const RolloutStats stats = *runtime_->GetRolloutStats(kId);
    return stats.shadow.samples + stats.shadow.skipped == requests;
  }));
  EXPECT_EQ(runtime_->GetRolloutStats(kId)->shadow.timeouts, 0u);
}

}  // namespace
}  // namespace backplane
