// Progressive rollout of a backend version inside one server (issue 22): the config keys and
// their refusals; whole servers in this process, under REST load from several clients, given
// candidate builds of one backend (good, wrong outputs, failing on some inputs, slow), each
// deployed with deploy_policy "progressive" and left to the policy; the admin API's verbs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <set>

#include <fmt/format.h>

#include "cli/serve_command.hpp"
#include "config/rollout_policy.hpp"
#include "onnx/model_builder.hpp"
#include "serve_test_util.hpp"

namespace backplane::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using server::ServeConfig;
using ::testing::HasSubstr;

// ---- Config ---------------------------------------------------------------------------------

TEST(RolloutConfigTest, ReadsTheKeysOverTheDefaults) {
  ServeConfig config = server::DefaultServeConfig();
  EXPECT_EQ(config.deploy_policy, "immediate");
  Status applied = server::ApplyConfigText(
      R"({"deploy_policy": "progressive", "rollout": {"shadow_fraction": 0.25,
          "min_samples": 50, "steps": [0.01, 5, 100], "max_error_excess": 0.02,
          "confidence": 0.995, "max_latency_regression": 0.2, "step_max_duration_s": 30,
          "inconclusive_limit": 5, "on_inconclusive": "hold", "worker_latency_allowance_us": 0,
          "shadow_timeout_ms": 250, "baseline": false}})",
      "serve.json", config);
  ASSERT_TRUE(applied.ok()) << applied.ToString();
  EXPECT_EQ(config.deploy_policy, "progressive");
  EXPECT_EQ(config.rollout.shadow_fraction, 0.25);
  EXPECT_EQ(config.rollout.min_samples, 50u);
  EXPECT_EQ(config.rollout.steps, (std::vector<double>{0.01, 5, 100}));
  EXPECT_EQ(config.rollout.max_error_excess, 0.02);
  EXPECT_EQ(config.rollout.confidence, 0.995);
  EXPECT_EQ(config.rollout.max_latency_regression, 0.2);
  EXPECT_EQ(config.rollout.step_max_duration_s, 30);
  EXPECT_EQ(config.rollout.inconclusive_limit, 5u);
  EXPECT_EQ(config.rollout.on_inconclusive, server::RolloutPolicy::OnInconclusive::kHold);
  EXPECT_EQ(config.rollout.worker_latency_allowance_us, 0);
  EXPECT_EQ(config.rollout.shadow_timeout_ms, 250);
  EXPECT_FALSE(config.rollout.baseline);
  // Keys left out keep their defaults.
  EXPECT_EQ(config.rollout.max_abs_divergence, server::RolloutPolicy{}.max_abs_divergence);
}

TEST(RolloutConfigTest, RefusesEveryBadValueNamingTheKeyAndWhy) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {R"({"deploy_policy": "canary"})",
       "'deploy_policy' must be \"immediate\" or \"progressive\", got 'canary'"},
      {R"({"rollout": []})", "'rollout' must be a JSON object"},
      {R"({"rollout": {"steps": [10, 50]}})", "'rollout.steps' must end at 100"},
      {R"({"rollout": {"steps": [50, 10, 100]}})", "'rollout.steps' must increase from above 0"},
      {R"({"rollout": {"steps": [0, 100]}})", "'rollout.steps' must increase from above 0"},
      {R"({"rollout": {"steps": []}})", "'rollout.steps' must be a non-empty array"},
      {R"({"rollout": {"steps": [10, 101]}})", "'rollout.steps entry' must be between 0 and 100"},
      {R"({"rollout": {"shadow_fraction": 1.5}})",
       "'rollout.shadow_fraction' must be between 0 and 1, got 1.5"},
      {R"({"rollout": {"min_samples": 0}})", "'rollout.min_samples' must be an integer"},
      {R"({"rollout": {"min_samples": 2.5}})", "'rollout.min_samples' must be an integer"},
      {R"({"rollout": {"steps": [0.001, 100]}})",
       "'rollout.steps' entry 0.001 is below 0.01, the smallest share the router sends the "
       "candidate (one request in 10,000): the step would route nothing"},
      {R"({"rollout": {"max_error_excess": "1%"}})", "'rollout.max_error_excess' must be a number"},
      {R"({"rollout": {"max_error_excess": 2}})",
       "'rollout.max_error_excess' must be between 0 and 1, got 2"},
      {R"({"rollout": {"confidence": 1}})",
       "'rollout.confidence' must be a number above 0.5 and below 1, e.g. 0.99, got 1"},
      {R"({"rollout": {"confidence": 0.5}})",
       "'rollout.confidence' must be a number above 0.5 and below 1, e.g. 0.99, got 0.5"},
      {R"({"rollout": {"max_latency_regression": -0.1}})",
       "'rollout.max_latency_regression' must be between 0"},
      {R"({"rollout": {"step_max_duration_s": -1}})",
       "'rollout.step_max_duration_s' must be between 0"},
      {R"({"rollout": {"inconclusive_limit": 0}})",
       "'rollout.inconclusive_limit' must be an integer between 1 and 1000, got 0"},
      {R"({"rollout": {"on_inconclusive": "wait"}})",
       "'rollout.on_inconclusive' must be \"advance\" or \"hold\", got \"wait\""},
      // The keys the judge replaced name their successors.
      {R"({"rollout": {"max_p99_ratio": 1.5}})",
       "'rollout.max_p99_ratio' is no longer a key: latency is judged by a rank test of every "
       "run, set 'rollout.max_latency_regression'"},
      {R"({"rollout": {"max_error_rate": 0.01}})",
       "'rollout.max_error_rate' is no longer a key: errors are judged by a two-proportion test "
       "against the stable generation's rate, set 'rollout.max_error_excess'"},
      {R"({"rollout": {"max_abs_divergence": -1}})",
       "'rollout.max_abs_divergence' must be between 0"},
      {R"({"rollout": {"shadow_timeout_ms": 0}})",
       "'rollout.shadow_timeout_ms' must be a number of milliseconds above 0 and at most 3600000 "
       "(an hour), got 0"},
      {R"({"rollout": {"shadow_timeout_ms": -5}})",
       "'rollout.shadow_timeout_ms' must be a number of milliseconds above 0"},
      {R"({"rollout": {"shadow_timeout_ms": 3600001}})",
       "'rollout.shadow_timeout_ms' must be a number of milliseconds above 0 and at most 3600000 "
       "(an hour), got 3600001"},
      {R"({"rollout": {"shadow_timeout_ms": "1s"}})",
       "'rollout.shadow_timeout_ms' must be a number of milliseconds above 0 and at most 3600000 "
       "(an hour), got \"1s\""},
      {R"({"rollout": {"baseline": "yes"}})",
       "'rollout.baseline' must be true or false, got \"yes\""},
      {R"({"rollout": {"baseline": 1}})", "'rollout.baseline' must be true or false, got 1"},
      {R"({"rollout": {"window": 3}})",
       "unknown key 'rollout.window' (known: shadow_fraction, min_samples, steps, confidence, "
       "max_latency_regression, worker_latency_allowance_us, max_error_excess, "
       "max_abs_divergence, shadow_timeout_ms, step_max_duration_s, inconclusive_limit, "
       "on_inconclusive, candidate_isolation, baseline)"},
  };
  for (const auto& [text, message] : cases) {
    ServeConfig config = server::DefaultServeConfig();
    const ServeConfig before = config;
    Status applied = server::ApplyConfigText(text, "serve.json", config);
    ASSERT_FALSE(applied.ok()) << text;
    EXPECT_EQ(applied.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(applied.message(), HasSubstr("serve.json")) << text;
    EXPECT_THAT(applied.message(), HasSubstr(message)) << text;
    EXPECT_EQ(config.rollout.steps, before.rollout.steps) << text;  // nothing applied
    EXPECT_EQ(config.deploy_policy, before.deploy_policy) << text;
  }
}

TEST(RolloutConfigTest, ThePolicyIsRenderedWithEveryKeyAndReadBackTheSame) {
  server::RolloutPolicy policy;
  policy.shadow_timeout_ms = 250;
  policy.baseline = false;
  const json rendered = server::RolloutPolicyJson(policy);
  EXPECT_EQ(rendered["shadow_timeout_ms"], 250);
  EXPECT_EQ(rendered["baseline"], false);
  EXPECT_EQ(server::RolloutPolicyJson(server::RolloutPolicy{})["shadow_timeout_ms"], 1000);
  EXPECT_EQ(server::RolloutPolicyJson(server::RolloutPolicy{})["baseline"], true);
  // What the admin API shows is what a config may say.
  server::RolloutPolicy read;
  ASSERT_TRUE(server::ApplyRolloutPolicy(rendered, "the view", read).ok());
  EXPECT_EQ(read.shadow_timeout_ms, 250);
  EXPECT_FALSE(read.baseline);
  EXPECT_EQ(server::RolloutPolicyJson(read), rendered);
}

// ---- Whole servers --------------------------------------------------------------------------

// REST clients sending one row each, continuously, and checking every answer against the
// stable build's (identity): an answer that differs is a wrong answer a client saw.
class RolloutClients {
 public:
  // `negative_share`: of the rows, the share with a negative element.
  RolloutClients(const RolloutServer& server, int count, uint64_t seed, double negative_share = 0)
      : joiner_{stop_, threads_} {
    for (int c = 0; c < count; ++c) {
      threads_.emplace_back([this, &server, c, seed, negative_share] {
        std::mt19937_64 random(seed + static_cast<uint64_t>(c));
        std::uniform_real_distribution<float> value(0.5f, 9.5f);
        std::bernoulli_distribution negative(negative_share);
        auto client = server.Client();
        for (int i = 0; !stop_.load(); ++i) {
          std::vector<float> row(4);
          for (float& element : row)
            element = std::round(value(random) * 4) / 4;  // exact in JSON both ways
          if (negative(random))
            row[2] = -row[2];
          const json body = {
              {"id", "client" + std::to_string(c) + "-" + std::to_string(i)},
              {"inputs",
               {{{"name", "x"}, {"shape", {1, 4}}, {"datatype", "FP32"}, {"data", row}}}}};
          const auto reply = Post(*client, "/v2/models/identity/infer", body.dump());
          MutexLock lock(mutex_);
          ++answers_;
          if (reply.status != 200) {
            failures_.push_back(std::to_string(reply.status) + " " + reply.text);
            continue;
          }
          const auto data = reply.body["outputs"][0]["data"].get<std::vector<float>>();
          if (data != row)
            wrong_.push_back(body.dump() + " -> " + reply.text);
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
  int answers() const {
    MutexLock lock(mutex_);
    return answers_;
  }
  std::vector<std::string> failures() const {
    MutexLock lock(mutex_);
    return failures_;
  }
  std::vector<std::string> wrong() const {
    MutexLock lock(mutex_);
    return wrong_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  JoinAll joiner_;
  mutable Mutex mutex_;
  int answers_ BACKPLANE_GUARDED_BY(mutex_) = 0;
  std::vector<std::string> failures_ BACKPLANE_GUARDED_BY(mutex_);
  std::vector<std::string> wrong_ BACKPLANE_GUARDED_BY(mutex_);
};

// `promtool check metrics` on an exposition (not checked without promtool, except under CI,
// where every tool is installed).
void ExpectPromtoolAccepts(const std::string& exposition) {
  if (!HasCommand("promtool")) {
    if (RunningInCi())
      ADD_FAILURE() << "promtool is not installed (Debian package prometheus)";
    return;
  }
  TempDir dir;
  WriteFile(dir / "metrics.txt", exposition);
  const auto checked =
      RunCommand("promtool check metrics < " + (dir / "metrics.txt").string() + " 2>&1");
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
}

std::vector<std::string> Phases(const json& view) {
  std::vector<std::string> phases;
  for (const auto& transition : view["history"]) {
    std::string phase = transition["phase"];
    if (phase == "canary")
      phase += fmt::format(" {:g}", transition["weight_percent"].get<double>());
    phases.push_back(phase);
  }
  return phases;
}

// The generation's state in the registry's history, "" when not on record.
std::string GenerationState(const RolloutServer& server, uint64_t generation) {
  auto status = server.running.core->context().registry.Describe(RolloutServer::kBackend);
  for (const auto& record : status->generations) {
    if (record.generation == generation)
      return std::string(ToString(record.state));
  }
  return "";
}

TEST(RolloutTest, AGoodFixGoesThroughShadowAndEveryStepAndIsPromoted) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto server = StartRolloutServer(
      R"({"shadow_fraction": 0.5, "min_samples": 30, "steps": [10, 50, 100],
          "max_latency_regression": 1000000})");
  const uint64_t stable =
      server->running.core->context().registry.Describe(RolloutServer::kBackend)->active_generation;
  RolloutClients clients(*server, 4, seed);
  ASSERT_TRUE(Eventually([&] { return clients.answers() > 20; }, std::chrono::seconds(30)));
  const json deployed = server->Deploy("ValidGoodFix");
  EXPECT_EQ(deployed["action"], "candidate") << deployed.dump();
  const json view = server->WaitForDecision();
  clients.Stop();

  ASSERT_EQ(view["phase"], "promoted") << view.dump(2);
  EXPECT_EQ(view["decided_by"], "policy");
  EXPECT_EQ(Phases(view), (std::vector<std::string>{"shadow", "canary 10", "canary 50",
                                                    "canary 100", "promoted"}))
      << view.dump(2);
  const uint64_t candidate = view["candidate_generation"];
  EXPECT_EQ(view["stable_generation"], stable);
  // The candidate was tried in a worker (candidate_isolation "process", the default); what is
  // promoted is its build loaded again in the server, a generation of its own.
  const auto status = server->running.core->context().registry.Describe(RolloutServer::kBackend);
  EXPECT_GT(status->active_generation, candidate);
  std::string tried_sha256, active_sha256;
  for (const auto& record : status->generations) {
    if (record.generation == candidate)
      tried_sha256 = record.sha256;
    if (record.generation == status->active_generation)
      active_sha256 = record.sha256;
  }
  EXPECT_FALSE(tried_sha256.empty());
  EXPECT_EQ(active_sha256, tried_sha256);
  const auto active = server->running.core->context().runtime.Backend(RolloutServer::kBackend);
  ASSERT_NE(active, nullptr);
  EXPECT_EQ(active->generation_number(), status->active_generation);
  EXPECT_EQ(active->generation()->out_of_process(), nullptr) << "the promoted build runs here";
  EXPECT_GE(view["totals"]["shadow"]["samples"].get<int>(), 30);
  EXPECT_EQ(view["totals"]["shadow"]["diverged"], 0);
  EXPECT_GE(view["totals"]["candidate"]["requests"].get<int>(), 90);
  EXPECT_TRUE(clients.failures().empty()) << clients.failures().front();
  EXPECT_TRUE(clients.wrong().empty()) << clients.wrong().front();
  // The stable generation drained and left the process, and the sandboxed candidate's worker
  // ended.
  for (const uint64_t gone : {stable, candidate}) {
    EXPECT_TRUE(Eventually([&] { return GenerationState(*server, gone) == "unloaded"; },
                           std::chrono::seconds(30)))
        << gone << ": " << GenerationState(*server, gone);
  }
}

TEST(RolloutTest, AFixThatChangesOutputsIsStoppedInShadowBeforeAnsweringAnyClient) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto server = StartRolloutServer(R"({"shadow_fraction": 0.5, "min_samples": 30})");
  RolloutClients clients(*server, 4, seed);
  ASSERT_TRUE(Eventually([&] { return clients.answers() > 20; }, std::chrono::seconds(30)));
  server->Deploy("ValidNext");  // adds 1000 to every output
  const json view = server->WaitForDecision();
  // RolloutClients keep being answered by the stable generation after the rollback.
  const int answered_at_rollback = clients.answers();
  ASSERT_TRUE(Eventually([&] { return clients.answers() > answered_at_rollback + 20; },
                         std::chrono::seconds(30)));
  clients.Stop();

  ASSERT_EQ(view["phase"], "rolled_back") << view.dump(2);
  EXPECT_EQ(view["decided_by"], "policy");
  EXPECT_THAT(view["reason"].get<std::string>(),
              HasSubstr("samples differ from the stable outputs by more than "
                        "max_abs_divergence 0.001 (largest difference 1000"));
  EXPECT_EQ(Phases(view), (std::vector<std::string>{"shadow", "rolled_back"}));
  EXPECT_EQ(view["totals"]["candidate"]["requests"], 0) << "the candidate answered a client";
  EXPECT_TRUE(clients.wrong().empty()) << clients.wrong().front();
  EXPECT_TRUE(clients.failures().empty()) << clients.failures().front();
  // On record as rejected, with the file and digest of what was refused, until another comes.
  const uint64_t candidate = view["candidate_generation"];
  ASSERT_TRUE(view["rejected"].is_object()) << view.dump(2);
  EXPECT_EQ(view["rejected"]["generation"], candidate);
  EXPECT_EQ(view["rejected"]["sha256"].get<std::string>().size(), 64u);
  EXPECT_THAT(view["rejected"]["reason"].get<std::string>(), HasSubstr("ROLLED_BACK"));
  EXPECT_TRUE(Eventually([&] { return GenerationState(*server, candidate) == "rejected"; },
                         std::chrono::seconds(10)));
  // The same file is not deployed again by a look at the directory (the watcher's rescan).
  server->running.core->context().registry.Rescan();
  EXPECT_EQ(server->Rollout()["candidate_generation"], candidate);
  EXPECT_EQ(server->Rollout()["phase"], "rolled_back");
}

TEST(RolloutTest, AFixThatFailsOnSomeInputsIsRolledBackInCanaryAndOnlyItsRequestsFail) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // No shadow phase: the errors must be caught among the canary's requests.
  auto server = StartRolloutServer(
      R"({"shadow_fraction": 0, "min_samples": 40, "steps": [20, 100],
          "max_latency_regression": 1000000})");
  RolloutClients clients(*server, 4, seed, /*negative_share=*/0.3);
  ASSERT_TRUE(Eventually([&] { return clients.answers() > 20; }, std::chrono::seconds(30)));
  EXPECT_TRUE(clients.failures().empty()) << "the stable build fails";
  server->Deploy("ValidFailsSome");  // fails an execution with a negative input
  const json view = server->WaitForDecision();
  clients.Stop();

  ASSERT_EQ(view["phase"], "rolled_back") << view.dump(2);
  EXPECT_EQ(view["decided_by"], "policy");
  EXPECT_THAT(view["reason"].get<std::string>(),
              HasSubstr("canary at 20 %: errors: the candidate failed"));
  EXPECT_EQ(Phases(view), (std::vector<std::string>{"canary 20", "rolled_back"}));
  // Every failure a client saw is the candidate's, and the stable side failed none.
  const auto failures = clients.failures();
  EXPECT_FALSE(failures.empty());
  for (const auto& failure : failures)
    EXPECT_THAT(failure, HasSubstr("FailOnNegative refuses the negative input"));
  // The totals are the rollout's last reading of the candidate's counters, taken when it was
  // decided: a request then in flight on the candidate (one per client at most) failed after it,
  // uncounted.
  const json totals = server->Rollout()["totals"];
  EXPECT_EQ(totals["stable"]["errors"], 0);
  const auto counted = totals["candidate"]["errors"].get<std::size_t>();
  EXPECT_LE(counted, failures.size());
  EXPECT_LE(failures.size(), counted + 4) << "more failures than the decision can explain";
  EXPECT_TRUE(clients.wrong().empty()) << clients.wrong().front();
}

// Without a shadow phase: shadow runs see a build this slow first (ShadowRolloutTest).
TEST(RolloutTest, ASlowFixIsRolledBackInCanaryByTheJudge) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Without a baseline: judged against the stable generation, with the allowance (the baseline's
  // case is RolloutBaselineTest's).
  auto server = StartRolloutServer(
      R"({"shadow_fraction": 0, "min_samples": 30, "steps": [25, 100], "baseline": false})");
  RolloutClients clients(*server, 4, seed);
  ASSERT_TRUE(Eventually([&] { return clients.answers() > 20; }, std::chrono::seconds(30)));
  server->Deploy("ValidSlow");  // the same outputs, 5 ms slower
  const json view = server->WaitForDecision();
  clients.Stop();

  ASSERT_EQ(view["phase"], "rolled_back") << view.dump(2);
  EXPECT_EQ(view["decided_by"], "policy");
  EXPECT_THAT(view["reason"].get<std::string>(),
              HasSubstr("canary at 25 %: latency: the candidate is "));
  // The candidate runs in a worker process (candidate_isolation "process"): the allowance for
  // its crossings applies, and is no excuse for 5 ms.
  EXPECT_THAT(view["reason"].get<std::string>(),
              HasSubstr("(worker_latency_allowance_us 10 at the stable p50 "));
  EXPECT_THAT(view["reason"].get<std::string>(), HasSubstr("than the stable generation"));
  EXPECT_EQ(view["baseline_generation"], 0);
  EXPECT_EQ(Phases(view), (std::vector<std::string>{"canary 25", "rolled_back"}));
  EXPECT_TRUE(clients.failures().empty()) << clients.failures().front();
  EXPECT_TRUE(clients.wrong().empty()) << clients.wrong().front();
}

// ---- Baselines ------------------------------------------------------------------------------
// These need the registry's and the runtime's halves of the baseline (the registry loading it
// with rollout.baseline, the router giving it its share): until both are in, the rollout has no
// baseline (baseline_generation 0) and they fail at their first assertion on it.

TEST(RolloutBaselineTest, AGoodFixIsJudgedAgainstItsBaselineAndPromoted) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto server =
      StartRolloutServer(R"({"shadow_fraction": 0, "min_samples": 30, "steps": [25, 100]})");
  const uint64_t stable =
      server->running.core->context().registry.Describe(RolloutServer::kBackend)->active_generation;
  RolloutClients clients(*server, 4, seed);
  ASSERT_TRUE(Eventually([&] { return clients.answers() > 20; }, std::chrono::seconds(30)));
  server->Deploy("ValidGoodFix");
  json view = server->Rollout();
  ASSERT_NE(view["baseline_generation"], 0) << "no baseline: " << view.dump(2);
  const uint64_t baseline = view["baseline_generation"];
  EXPECT_NE(baseline, stable);
  EXPECT_NE(baseline, view["candidate_generation"]);
  // At 25 % the baseline runs as many requests as the candidate.
  ASSERT_TRUE(
      Eventually([&] { return server->Rollout()["window"]["baseline"]["requests"].get<int>() > 0; },
                 std::chrono::seconds(30)));
  const auto metrics = server->Client()->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body,
              HasSubstr(fmt::format("backplane_rollout_requests_total{{backend=\"TestValid\","
                                    "generation=\"{}\",role=\"baseline\"}} ",
                                    baseline)));
  ExpectPromtoolAccepts(metrics->body);

  view = server->WaitForDecision();
  clients.Stop();
  ASSERT_EQ(view["phase"], "promoted") << view.dump(2);
  EXPECT_EQ(view["baseline_lost"], false);
  EXPECT_EQ(view["totals"]["baseline"]["generation"], baseline);
  EXPECT_GT(view["totals"]["baseline"]["requests"].get<int>(), 0);
  const std::string judged = fmt::format(
      "on the baseline generation {} (the stable build loaded again beside it)", baseline);
  bool named = false;
  for (const auto& transition : view["history"])
    named = named || transition["why"].get<std::string>().find(judged) != std::string::npos;
  EXPECT_TRUE(named) << view.dump(2);
  EXPECT_TRUE(clients.failures().empty()) << clients.failures().front();
  EXPECT_TRUE(clients.wrong().empty()) << clients.wrong().front();
  // The baseline leaves with the rollout.
  EXPECT_TRUE(Eventually([&] { return GenerationState(*server, baseline) == "unloaded"; },
                         std::chrono::seconds(30)))
      << GenerationState(*server, baseline);
}

TEST(RolloutBaselineTest, ASlowFixIsRolledBackAgainstItsBaselineWithoutAnAllowance) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto server =
      StartRolloutServer(R"({"shadow_fraction": 0, "min_samples": 30, "steps": [25, 100]})");
  RolloutClients clients(*server, 4, seed);
  ASSERT_TRUE(Eventually([&] { return clients.answers() > 20; }, std::chrono::seconds(30)));
  server->Deploy("ValidSlow");  // the same outputs, 5 ms slower
  ASSERT_NE(server->Rollout()["baseline_generation"], 0) << server->Rollout().dump(2);
  const json view = server->WaitForDecision();
  clients.Stop();

  ASSERT_EQ(view["phase"], "rolled_back") << view.dump(2);
  const std::string reason = view["reason"];
  EXPECT_THAT(reason, HasSubstr("canary at 25 %: latency: the candidate is "));
  EXPECT_THAT(reason, HasSubstr(fmt::format("than the baseline generation {} (the stable build "
                                            "loaded again beside it)",
                                            view["baseline_generation"].get<uint64_t>())));
  EXPECT_THAT(reason, HasSubstr("above max_latency_regression 10 %"));
  EXPECT_THAT(reason, ::testing::Not(HasSubstr("worker_latency_allowance_us")));
}

TEST(RolloutTest, OperatorsAdvancePauseResumeAndAbortThroughTheAdminApi) {
  const std::string kToken = "rollout-token";
  const httplib::Headers token = {{"Authorization", "Bearer " + kToken}};
  // Samples enough that the policy never moves on by itself during the test.
  auto server = StartRolloutServer(R"({"shadow_fraction": 0.1, "min_samples": 100000000})", kToken);
  auto client = server->Client();
  const std::string base = std::string("/v2/backends/") + RolloutServer::kBackend + "/rollout";

  const json idle = server->Rollout();
  EXPECT_EQ(idle["phase"], "none");
  EXPECT_EQ(idle["candidate_generation"], 0);
  EXPECT_EQ(Post(*client, base + "/advance", "", token).status, 409);  // none under way
  EXPECT_EQ(Get(*client, "/v2/backends/Nope/rollout").status, 404);

  server->Deploy("ValidGoodFix", token);
  const json shadowing = server->Rollout();
  EXPECT_EQ(shadowing["phase"], "shadow");
  // The baseline's fields are there whether or not the rollout has one (generation 0: none), and
  // the shadow runs' timeouts and latencies beside their counts.
  EXPECT_TRUE(shadowing["baseline_generation"].is_number_unsigned()) << shadowing.dump(2);
  EXPECT_EQ(shadowing["baseline_lost"], false);
  for (const char* stats : {"window", "totals"}) {
    SCOPED_TRACE(stats);
    EXPECT_EQ(shadowing[stats]["baseline"]["generation"], shadowing["baseline_generation"]);
    for (const char* key : {"requests", "errors", "p50_us", "p99_us"})
      EXPECT_TRUE(shadowing[stats]["baseline"][key].is_number()) << key;
    for (const char* key :
         {"timeouts", "p50_us", "p99_us", "stable_p50_us", "stable_p99_us", "slower"})
      EXPECT_TRUE(shadowing[stats]["shadow"][key].is_number()) << key;
  }
  EXPECT_EQ(shadowing["policy"]["shadow_timeout_ms"], 1000);
  EXPECT_EQ(shadowing["policy"]["baseline"], true);
  EXPECT_EQ(Post(*client, base + "/advance", "").status, 401);  // the token is required
  EXPECT_EQ(server->Rollout()["phase"], "shadow");
  const auto unknown = Post(*client, base + "/jump", "", token);
  EXPECT_EQ(unknown.status, 404);
  EXPECT_THAT(unknown.text, HasSubstr("known: advance, pause, resume, abort"));

  json view = Post(*client, base + "/advance", "", token).body;
  EXPECT_EQ(view["phase"], "canary");
  EXPECT_EQ(view["weight_percent"], 1);
  view = Post(*client, base + "/pause", "", token).body;
  EXPECT_EQ(view["phase"], "paused");
  EXPECT_EQ(view["paused_in"], "canary");
  EXPECT_EQ(view["weight_percent"], 1);  // held where it was
  view = Post(*client, base + "/resume", "", token).body;
  EXPECT_EQ(view["phase"], "canary");
  EXPECT_EQ(Post(*client, base + "/resume", "", token).status, 409);  // not paused
  view = Post(*client, base + "/advance", "", token).body;
  EXPECT_EQ(view["weight_percent"], 10);

  // A policy override for this rollout only: bad keys refused, good ones applied.
  const auto refused = Put(*client, base + "/policy", R"({"steps": [10, 90]})", token);
  EXPECT_EQ(refused.status, 400);
  EXPECT_THAT(refused.text, HasSubstr("'rollout.steps' must end at 100"));
  view = Put(*client, base + "/policy", R"({"max_error_excess": 0.05})", token).body;
  EXPECT_EQ(view["policy"]["max_error_excess"], 0.05);
  // The baseline is loaded with the candidate's file, like the place it runs in: start-up
  // settings, refused (and nothing else of the body applied).
  for (const char* key : {"baseline", "candidate_isolation"}) {
    const auto startup = Put(*client, base + "/policy",
                             fmt::format(R"({{"{}": false, "min_samples": 5}})", key), token);
    EXPECT_EQ(startup.status, 400) << key;
    EXPECT_THAT(startup.text, HasSubstr(fmt::format(
                                  "'{}' is a start-up setting (server config 'rollout')", key)));
  }
  EXPECT_EQ(server->Rollout()["policy"]["min_samples"], 100000000);
  // The shadow runs' time limit reaches the runtime's traffic.
  const auto timeout = Put(*client, base + "/policy", R"({"shadow_timeout_ms": 0})", token);
  EXPECT_EQ(timeout.status, 400);
  EXPECT_THAT(timeout.text, HasSubstr("'rollout.shadow_timeout_ms' must be a number of "
                                      "milliseconds above 0"));
  view = Put(*client, base + "/policy", R"({"shadow_timeout_ms": 5000})", token).body;
  EXPECT_EQ(view["policy"]["shadow_timeout_ms"], 5000);
  EXPECT_EQ(server->running.core->context()
                .runtime.GetRolloutStats(RolloutServer::kBackend)
                ->traffic.shadow_timeout_ms,
            5000);

  view = Post(*client, base + "/abort", "", token).body;
  EXPECT_EQ(view["phase"], "rolled_back") << view.dump(2);
  EXPECT_EQ(view["decided_by"], "operator");
  // The policy edits are on record at the share they kept (the verb's answer carries only the
  // newest transition, GET pages through them all); the refused ones are not.
  EXPECT_EQ(Phases(view), (std::vector<std::string>{"rolled_back"}));
  EXPECT_EQ(Phases(server->Rollout()),
            (std::vector<std::string>{"shadow", "canary 1", "paused", "canary 1", "canary 10",
                                      "canary 10", "canary 10", "rolled_back"}));
  EXPECT_EQ(server->running.core->context()
                .registry.Describe(RolloutServer::kBackend)
                ->candidate_generation,
            0u);

  // Counted in /metrics, labelled by backend and phase.
  const auto metrics = client->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body,
              HasSubstr("backplane_rollout_phase{backend=\"TestValid\",phase=\"rolled_back\"} 1"));
  EXPECT_THAT(
      metrics->body,
      HasSubstr("backplane_rollout_transitions_total{backend=\"TestValid\",to=\"canary\"} 3"));
  ExpectPromtoolAccepts(metrics->body);
}

// The reasons on record, oldest first.
std::vector<std::string> Whys(const json& view) {
  std::vector<std::string> whys;
  for (const auto& transition : view["history"])
    whys.push_back(transition["why"]);
  return whys;
}

TEST(RolloutTest, APinnedBackendHoldsItsRolloutUntilUnpinned) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const httplib::Headers token = {{"Authorization", "Bearer pin-token"}};
  auto server = StartRolloutServer(
      R"({"shadow_fraction": 0, "min_samples": 100000000, "steps": [10, 100],
          "max_latency_regression": 1000000})",
      "pin-token");
  auto client = server->Client();
  const std::string backend = std::string("/v2/backends/") + RolloutServer::kBackend;
  RolloutClients clients(*server, 2, seed);
  ASSERT_TRUE(Eventually([&] { return clients.answers() > 20; }, std::chrono::seconds(30)));
  server->Deploy("ValidGoodFix", token);
  ASSERT_EQ(server->Rollout()["weight_percent"], 10);
  ASSERT_EQ(Post(*client, backend + "/pin", "", token).status, 200);
  // The policy now has a verdict every 20 runs, and would move on at the first pass.
  json view = Put(*client, backend + "/rollout/policy", R"({"min_samples": 20})", token).body;
  ASSERT_EQ(view["pinned"], true) << view.dump(2);
  ASSERT_TRUE(Eventually([&] { return server->Rollout()["samples"].get<int>() >= 100; },
                         std::chrono::seconds(60)));
  view = server->Rollout();
  EXPECT_EQ(view["phase"], "canary") << view.dump(2);
  EXPECT_EQ(view["weight_percent"], 10);
  const auto advanced = Post(*client, backend + "/rollout/advance", "", token);
  EXPECT_EQ(advanced.status, 409);
  EXPECT_THAT(advanced.text, HasSubstr("backend TestValid is pinned: its rollout holds (no step, "
                                       "no promotion) until it is unpinned"));
  EXPECT_EQ(server->Rollout()["weight_percent"], 10);
  EXPECT_NE(server->running.core->context()
                .registry.Describe(RolloutServer::kBackend)
                ->candidate_generation,
            0u);

  ASSERT_EQ(Post(*client, backend + "/unpin", "", token).status, 200);
  view = server->WaitForDecision();
  clients.Stop();
  ASSERT_EQ(view["phase"], "promoted") << view.dump(2);
  EXPECT_EQ(Phases(view), (std::vector<std::string>{"canary 10", "canary 10", "canary 10",
                                                    "canary 10", "canary 100", "promoted"}))
      << view.dump(2);
  const auto whys = Whys(view);
  EXPECT_THAT(whys[1], HasSubstr("backend pinned: the rollout holds"));
  EXPECT_THAT(whys[3], HasSubstr("backend unpinned"));
  EXPECT_TRUE(clients.failures().empty()) << clients.failures().front();
}

TEST(RolloutTest, APolicyEditKeepsTheShareAndGoesOnFromTheNextStepAboveIt) {
  const httplib::Headers token = {{"Authorization", "Bearer edit-token"}};
  auto server = StartRolloutServer(
      R"({"shadow_fraction": 0, "min_samples": 100000000, "steps": [10, 20, 30, 40, 100]})",
      "edit-token");
  auto client = server->Client();
  const std::string base = std::string("/v2/backends/") + RolloutServer::kBackend + "/rollout";
  server->Deploy("ValidGoodFix", token);
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(Post(*client, base + "/advance", "", token).status, 200);
  ASSERT_EQ(server->Rollout()["weight_percent"], 40);

  // Fewer steps: the candidate keeps 40 %, not the 100 % the old step index would now name.
  json view = Put(*client, base + "/policy", R"({"steps": [50, 100]})", token).body;
  EXPECT_EQ(view["phase"], "canary") << view.dump(2);
  EXPECT_EQ(view["weight_percent"], 40);
  EXPECT_EQ(view["step"], 0);
  EXPECT_EQ(Whys(view).back(), "policy replaced by an operator: stays at 40 %, next step 50 %");
  view = Post(*client, base + "/advance", "", token).body;
  EXPECT_EQ(view["weight_percent"], 50);
  view = Post(*client, base + "/advance", "", token).body;
  EXPECT_EQ(view["weight_percent"], 100);
  // A share that is a step of the new policy stays on it.
  view = Put(*client, base + "/policy", R"({"steps": [5, 100]})", token).body;
  EXPECT_EQ(view["weight_percent"], 100);
  EXPECT_EQ(Whys(view).back(),
            "policy replaced by an operator: stays at 100 %, next the promotion");
  // Steps the router cannot express are refused here too.
  const auto refused = Put(*client, base + "/policy", R"({"steps": [0.004, 100]})", token);
  EXPECT_EQ(refused.status, 400);
  EXPECT_THAT(refused.text, HasSubstr("'rollout.steps' entry 0.004 is below 0.01"));
  EXPECT_EQ(Phases(server->Rollout()),
            (std::vector<std::string>{"canary 10", "canary 20", "canary 30", "canary 40",
                                      "canary 40", "canary 50", "canary 100", "canary 100"}));
}

TEST(RolloutTest, TheHistoryKeepsTheNewestTransitionsAndCountsTheOthers) {
  const httplib::Headers token = {{"Authorization", "Bearer history-token"}};
  auto server =
      StartRolloutServer(R"({"shadow_fraction": 0.1, "min_samples": 100000000})", "history-token");
  auto client = server->Client();
  const std::string base = std::string("/v2/backends/") + RolloutServer::kBackend + "/rollout";
  server->Deploy("ValidGoodFix", token);
  for (int i = 0; i < 60; ++i) {
    ASSERT_EQ(Post(*client, base + "/pause", "", token).status, 200);
    ASSERT_EQ(Post(*client, base + "/resume", "", token).status, 200);
  }
  const json view = server->Rollout();
  ASSERT_EQ(view["history"].size(), 100u);
  EXPECT_EQ(view["history_dropped"], 21);  // the start, 120 transitions, 100 kept
  EXPECT_EQ(Whys(view).back(), "resumed by an operator");
  EXPECT_EQ(Whys(view).front(), "paused by an operator");
}

TEST(RolloutTest, AStepEndsWhenItsTimeIsUpAndOnInconclusiveDecides) {
  // No client: every step ends by its time, with no sample to judge.
  auto server = StartRolloutServer(
      R"({"shadow_fraction": 0.5, "steps": [50, 100], "step_max_duration_s": 0.2})");
  const auto started = std::chrono::steady_clock::now();
  server->Deploy("ValidGoodFix");
  const json view = server->WaitForDecision();
  ASSERT_EQ(view["phase"], "promoted") << view.dump(2);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
  EXPECT_EQ(Phases(view),
            (std::vector<std::string>{"shadow", "canary 50", "canary 100", "promoted"}));
  const auto whys = Whys(view);
  EXPECT_EQ(whys[1],
            "shadow: inconclusive when step_max_duration_s 0.2 was up: 0 of min_samples 200 "
            "candidate runs so far, 0 failed; on_inconclusive advance");
  EXPECT_THAT(whys[3], HasSubstr("policy: canary at 100 %: inconclusive when step_max_duration_s "
                                 "0.2 was up"));

  // "hold": the step stays, on record once, until an operator (or a verdict) decides.
  auto held = StartRolloutServer(
      R"({"shadow_fraction": 0.5, "step_max_duration_s": 0.2, "on_inconclusive": "hold"})");
  held->Deploy("ValidGoodFix");
  ASSERT_TRUE(
      Eventually([&] { return held->Rollout()["history"].size() == 2; }, std::chrono::seconds(30)));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a few more deadlines' worth
  const json holding = held->Rollout();
  EXPECT_EQ(holding["phase"], "shadow") << holding.dump(2);
  EXPECT_EQ(Phases(holding), (std::vector<std::string>{"shadow", "shadow"}));
  EXPECT_THAT(Whys(holding)[1], HasSubstr("; on_inconclusive hold: held until a verdict or an "
                                          "operator decides"));
}

// ---- Rollbacks, pins and paging ------------------------------------------------------------

// TestValid's directory with versioned files: Test_Valid_backend.so.1.2 (the Valid build) and
// .so.1.3 (`next`), the link Test_Valid_backend.so designating .so.1.2.
std::function<void(const RolloutServer&)> VersionedFiles(std::string_view next) {
  return [next = std::string(next)](const RolloutServer& server) {
    CopyFile(Fixture("Valid"), server.home.backends() / "Test_Valid_backend.so.1.2");
    CopyFile(Fixture(next), server.home.backends() / "Test_Valid_backend.so.1.3");
    fs::create_symlink("Test_Valid_backend.so.1.2", server.backend_file());
  };
}

// `ln -sfn TARGET Test_Valid_backend.so` (a new link renamed over the old one), then the reload
// the watcher would make; the reload's answer.
JsonReply Relink(const RolloutServer& server, const std::string& target,
                 const httplib::Headers& token) {
  const fs::path temporary = server.home.backends() / ".relink.tmp";
  fs::create_symlink(target, temporary);
  fs::rename(temporary, server.backend_file());
  auto client = server.Client();
  return Post(*client, std::string("/v2/backends/") + RolloutServer::kBackend + "/reload", "",
              token);
}

GenerationStatus ActiveRecord(const RolloutServer& server) {
  auto status = server.running.core->context().registry.Describe(RolloutServer::kBackend);
  for (const auto& record : status->generations) {
    if (record.generation == status->active_generation)
      return record;
  }
  return {};
}

TEST(RolloutRollbackTest, ALinkPointedBackToThePreviousFileRollsBackAtOnceAndResetsTheView) {
  const httplib::Headers token = {{"Authorization", "Bearer link-token"}};
  auto server =
      StartRolloutServer(R"({"shadow_fraction": 0, "min_samples": 100000000, "steps": [50, 100]})",
                         "link-token", VersionedFiles("ValidGoodFix"));
  auto client = server->Client();
  const std::string base = std::string("/v2/backends/") + RolloutServer::kBackend + "/rollout";
  const uint64_t first = ActiveRecord(*server).generation;

  // Forward to .so.1.3: a rollout, promoted by an operator.
  const JsonReply forward = Relink(*server, "Test_Valid_backend.so.1.3", token);
  ASSERT_EQ(forward.body["action"], "candidate") << forward.text;
  ASSERT_EQ(Post(*client, base + "/advance", "", token).status, 200);
  ASSERT_EQ(Post(*client, base + "/advance", "", token).status, 200);
  ASSERT_EQ(server->Rollout()["phase"], "promoted");
  const uint64_t promoted = ActiveRecord(*server).generation;
  ASSERT_NE(promoted, first);
  EXPECT_THAT(ActiveRecord(*server).resolved_file.string(), ::testing::EndsWith(".so.1.3"));

  // Back to .so.1.2, the version the promotion replaced: active at once, no new rollout.
  const JsonReply back = Relink(*server, "Test_Valid_backend.so.1.2", token);
  EXPECT_EQ(back.status, 200) << back.text;
  EXPECT_EQ(back.body["action"], "activated") << back.text;
  EXPECT_THAT(back.body["message"].get<std::string>(), HasSubstr("rollback"));
  const GenerationStatus active = ActiveRecord(*server);
  EXPECT_GT(active.generation, promoted);
  EXPECT_EQ(back.body["generation"], active.generation);
  EXPECT_THAT(active.resolved_file.string(), ::testing::EndsWith(".so.1.2"));
  EXPECT_EQ(server->running.core->context()
                .registry.Describe(RolloutServer::kBackend)
                ->candidate_generation,
            0u);

  // The view no longer shows the promotion of .so.1.3 as what serves.
  const json view = server->Rollout();
  EXPECT_EQ(view["phase"], "none") << view.dump(2);
  EXPECT_EQ(view["stable_generation"], active.generation);
  EXPECT_EQ(view["candidate_generation"], 0);
  EXPECT_EQ(view["promoted_generation"], 0);
  EXPECT_EQ(view["weight_percent"], 0);
  EXPECT_TRUE(view["totals"].is_null()) << view.dump(2);
  EXPECT_EQ(Phases(view),
            (std::vector<std::string>{"canary 50", "canary 100", "promoted", "none"}));
  EXPECT_THAT(Whys(view).back(),
              HasSubstr(fmt::format("generation {} active (rollback; replaces generation {})",
                                    active.generation, promoted)));
  // And a look at the directory does not start anything either.
  server->running.core->context().registry.Rescan();
  EXPECT_EQ(server->Rollout()["phase"], "none");
}

TEST(RolloutRollbackTest, TheRolloutViewIsResetAfterARollbackThroughTheApi) {
  const httplib::Headers token = {{"Authorization", "Bearer api-token"}};
  auto server = StartRolloutServer(
      R"({"shadow_fraction": 0, "min_samples": 100000000, "steps": [100]})", "api-token");
  auto client = server->Client();
  const std::string backend = std::string("/v2/backends/") + RolloutServer::kBackend;
  server->Deploy("ValidGoodFix", token);
  ASSERT_EQ(Post(*client, backend + "/rollout/advance", "", token).status, 200);
  ASSERT_EQ(server->Rollout()["phase"], "promoted");

  const JsonReply rolled_back = Post(*client, backend + "/rollback", "", token);
  ASSERT_EQ(rolled_back.status, 200) << rolled_back.text;
  const json view = server->Rollout();
  EXPECT_EQ(view["phase"], "none") << view.dump(2);
  EXPECT_EQ(view["stable_generation"], rolled_back.body["active_generation"]);
  EXPECT_EQ(view["candidate_generation"], 0);
  EXPECT_EQ(view["promoted_generation"], 0);
  EXPECT_EQ(view["decided_by"], "");
  EXPECT_EQ(Phases(view), (std::vector<std::string>{"canary 100", "promoted", "none"}));
  EXPECT_THAT(view["reason"].get<std::string>(), HasSubstr("rollback; replaces generation"));

  // A rollback during a rollout ends it (rolled back) and then resets the view.
  server->Deploy("ValidNext", token);
  ASSERT_EQ(server->Rollout()["phase"], "canary");
  ASSERT_EQ(Post(*client, backend + "/rollback", "", token).status, 200);
  const json after = server->Rollout();
  EXPECT_EQ(after["phase"], "none") << after.dump(2);
  EXPECT_EQ(after["candidate_generation"], 0);
  // (A new candidate starts a new record.)
  EXPECT_EQ(Phases(after), (std::vector<std::string>{"canary 100", "rolled_back", "none"}));
}

TEST(RolloutRollbackTest, AReloadOfARolledBackFileIsRefusedNamingTheVersionedFileAndWhy) {
  const httplib::Headers token = {{"Authorization", "Bearer reload-token"}};
  auto server = StartRolloutServer(R"({"shadow_fraction": 0, "min_samples": 100000000})",
                                   "reload-token", VersionedFiles("ValidNext"));
  auto client = server->Client();
  const std::string backend = std::string("/v2/backends/") + RolloutServer::kBackend;
  ASSERT_EQ(Relink(*server, "Test_Valid_backend.so.1.3", token).body["action"], "candidate");
  const uint64_t candidate = server->Rollout()["candidate_generation"];
  ASSERT_EQ(Post(*client, backend + "/rollout/abort", "", token).status, 200);

  // The rejection names the versioned file behind the link.
  const json status = Get(*client, backend).body;
  ASSERT_FALSE(status["rejected"].empty()) << status.dump(2);
  EXPECT_THAT(status["rejected"][0]["file"].get<std::string>(),
              ::testing::EndsWith("/Test_Valid_backend.so"));
  EXPECT_THAT(status["rejected"][0]["resolved_file"].get<std::string>(),
              ::testing::EndsWith("/Test_Valid_backend.so.1.3"));
  EXPECT_EQ(status["rejected"][0]["reason"], "ROLLED_BACK");

  // An operator's reload does not start it again: 422, saying which file and why.
  const JsonReply reload = Post(*client, backend + "/reload", "", token);
  EXPECT_EQ(reload.status, 422) << reload.text;
  EXPECT_EQ(reload.body["action"], "rejected") << reload.text;
  const std::string error = reload.body["error"];
  EXPECT_THAT(error, HasSubstr("Test_Valid_backend.so -> "));
  EXPECT_THAT(error, HasSubstr("/Test_Valid_backend.so.1.3 was rolled back (operator: aborted "
                               "through the admin API) and stays refused until another file is "
                               "published"));
  EXPECT_THAT(error, HasSubstr("ROLLED_BACK"));
  EXPECT_EQ(server->Rollout()["phase"], "rolled_back");
  EXPECT_EQ(server->Rollout()["candidate_generation"], candidate);
  EXPECT_EQ(server->running.core->context()
                .registry.Describe(RolloutServer::kBackend)
                ->candidate_generation,
            0u);

  // Published again (a new file, renamed into place), it is rolled out anew.
  server->home.Publish(Fixture("ValidNext"), "Test_Valid_backend.so.1.3");
  const JsonReply again = Post(*client, backend + "/reload", "", token);
  EXPECT_EQ(again.body["action"], "candidate") << again.text;
  EXPECT_GT(server->Rollout()["candidate_generation"].get<uint64_t>(), candidate);
}

TEST(RolloutPinTest, ThePromotionOfAPinnedBackendIsRefusedNamingThePin) {
  const httplib::Headers token = {{"Authorization", "Bearer pinned-token"}};
  auto server = StartRolloutServer(
      R"({"shadow_fraction": 0, "min_samples": 100000000, "steps": [100]})", "pinned-token");
  auto& registry = server->running.core->context().registry;
  server->Deploy("ValidGoodFix", token);
  const uint64_t stable = registry.Describe(RolloutServer::kBackend)->active_generation;
  const uint64_t candidate = registry.Describe(RolloutServer::kBackend)->candidate_generation;
  ASSERT_NE(candidate, 0u);
  ASSERT_TRUE(registry.Pin(RolloutServer::kBackend).ok());

  auto promoted = registry.Promote(RolloutServer::kBackend, candidate);
  ASSERT_FALSE(promoted.ok());
  EXPECT_EQ(promoted.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(promoted.error().message(),
            fmt::format("backend TestValid is pinned to generation {}: candidate generation {} "
                        "is not promoted until it is unpinned",
                        stable, candidate));
  EXPECT_EQ(registry.Describe(RolloutServer::kBackend)->active_generation, stable);
  EXPECT_EQ(registry.Describe(RolloutServer::kBackend)->candidate_generation, candidate);
}

// The controller decides to promote (an operator's advance at the last step) while another
// thread pins: whichever comes first, once Pin returns nothing switches, and the rollout's view
// agrees with the registry (never "rolled back" while the candidate is still on offer).
TEST(RolloutPinTest, APinThatRacesAPromotionHoldsWhatItPinned) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 random(seed);
  auto server =
      StartRolloutServer(R"({"shadow_fraction": 0, "min_samples": 100000000, "steps": [100]})");
  auto& context = server->running.core->context();
  auto& registry = context.registry;
  // Builds published in turn: never the version before the active one, which would come back at
  // once instead of as a candidate.
  const char* builds[] = {"ValidGoodFix", "ValidNext", "ValidSlow", "Valid"};
  int held = 0, promoted_first = 0;
  for (int round = 0; round < 24; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    if (registry.Describe(RolloutServer::kBackend)->candidate_generation == 0) {
      server->home.Publish(Fixture(builds[round % 4]), server->backend_file().filename());
      auto outcome = registry.Reload(RolloutServer::kBackend);
      ASSERT_TRUE(outcome.ok());
      ASSERT_EQ(outcome->action, DeployOutcome::Action::kCandidate) << outcome->message;
    }
    const uint64_t candidate = registry.Describe(RolloutServer::kBackend)->candidate_generation;
    // Each side waits a random while after the start, so that either comes first about as often.
    std::atomic<bool> go{false};
    Status advanced;
    const auto advance_after = std::chrono::microseconds(random() % 300);
    const auto pin_after = std::chrono::microseconds(random() % 300);
    std::thread advancer([&] {
      while (!go.load()) {
      }
      std::this_thread::sleep_for(advance_after);
      advanced = context.rollouts.Advance(RolloutServer::kBackend);
    });
    go.store(true);
    std::this_thread::sleep_for(pin_after);
    EXPECT_TRUE(
        registry.Pin(RolloutServer::kBackend).ok());  // no ASSERT: the thread must be joined
    const uint64_t pinned_to = registry.Describe(RolloutServer::kBackend)->active_generation;
    advancer.join();
    if (!advanced.ok()) {
      EXPECT_EQ(advanced.code(), StatusCode::kFailedPrecondition);
      EXPECT_THAT(advanced.message(), HasSubstr("pinned")) << advanced.ToString();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto status = registry.Describe(RolloutServer::kBackend);
    EXPECT_EQ(status->active_generation, pinned_to) << "switched after Pin returned";
    if (status->candidate_generation == candidate) {
      ++held;
      const json view = server->Rollout();
      EXPECT_EQ(view["phase"], "canary") << view.dump(2);
      EXPECT_EQ(view["pinned"], true) << view.dump(2);
      EXPECT_EQ(view["candidate_generation"], candidate);
      const Status refused = context.rollouts.Advance(RolloutServer::kBackend);
      EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
    } else {
      ++promoted_first;
      EXPECT_EQ(status->candidate_generation, 0u);
      EXPECT_TRUE(Eventually([&] { return server->Rollout()["phase"] == "promoted"; },
                             std::chrono::seconds(10)))
          << server->Rollout().dump(2);
      EXPECT_EQ(server->Rollout()["promoted_generation"], pinned_to);
    }
    ASSERT_TRUE(registry.Unpin(RolloutServer::kBackend).ok());
    // Unpinned, a held rollout is not stuck: the next advance promotes it.
    if (status->candidate_generation == candidate) {
      const Status resumed = context.rollouts.Advance(RolloutServer::kBackend);
      EXPECT_TRUE(resumed.ok()) << resumed.ToString();
      EXPECT_EQ(registry.Describe(RolloutServer::kBackend)->candidate_generation, 0u);
      EXPECT_EQ(server->Rollout()["phase"], "promoted");
    }
  }
  RecordProperty("held", held);
  RecordProperty("promoted_first", promoted_first);
  std::printf("pin first: %d rounds, promotion first: %d rounds\n", held, promoted_first);
}

TEST(RolloutTest, TheHistoryIsPagedAndVerbAnswersCarryOnlyTheNewestTransition) {
  const httplib::Headers token = {{"Authorization", "Bearer paging-token"}};
  auto server =
      StartRolloutServer(R"({"shadow_fraction": 0.1, "min_samples": 100000000})", "paging-token");
  auto client = server->Client();
  const std::string base = std::string("/v2/backends/") + RolloutServer::kBackend + "/rollout";
  server->Deploy("ValidGoodFix", token);
  for (int i = 0; i < 60; ++i) {
    ASSERT_EQ(Post(*client, base + "/pause", "", token).status, 200);
    const json resumed = Post(*client, base + "/resume", "", token).body;
    ASSERT_EQ(resumed["history"].size(), 1u) << resumed.dump(2);
    ASSERT_EQ(resumed["history"][0]["why"], "resumed by an operator");
    ASSERT_EQ(resumed["history_first"], 2 * i + 2);
    ASSERT_EQ(resumed["history_total"], 2 * i + 3);
  }
  // 121 transitions, numbered 0 to 120; the oldest 21 dropped.
  json page = Get(*client, base + "?history_from=0&history_limit=10").body;
  EXPECT_EQ(page["history_total"], 121);
  EXPECT_EQ(page["history_dropped"], 21);
  EXPECT_EQ(page["history_first"], 21);  // 0 is gone: from the oldest kept
  ASSERT_EQ(page["history"].size(), 10u);
  EXPECT_EQ(Whys(page).front(), "paused by an operator");
  page = Get(*client, base + "?history_from=115").body;
  EXPECT_EQ(page["history_first"], 115);
  ASSERT_EQ(page["history"].size(), 6u);
  EXPECT_EQ(Whys(page).back(), "resumed by an operator");
  page = Get(*client, base + "?history_limit=1&history_from=121").body;
  EXPECT_EQ(page["history_first"], 121);
  EXPECT_TRUE(page["history"].empty());
  EXPECT_EQ(Get(*client, base).body["history"].size(), 100u);  // every one kept, by default

  for (const char* query : {"?history_limit=0", "?history_limit=101", "?history_from=-1",
                            "?history_from=1x", "?history_from=", "?page=2"}) {
    const JsonReply refused = Get(*client, base + query);
    EXPECT_EQ(refused.status, 400) << query << ": " << refused.text;
  }
  EXPECT_THAT(Get(*client, base + "?history_limit=500").text,
              HasSubstr("query parameter history_limit must be an integer from 1 to 100, got "
                        "'500'"));
  EXPECT_THAT(Get(*client, base + "?page=2").text,
              HasSubstr("unknown query parameter 'page' (known: history_from, history_limit)"));
}

}  // namespace
}  // namespace backplane::testing
