// Progressive rollout of a backend version inside one server (issue 22): the config keys and
// their refusals; whole servers in this process, under REST load from several clients, given
// candidate builds of one backend (good, wrong outputs, failing on some inputs, slow), each
// deployed with deploy_policy "progressive" and left to the policy; the admin API's verbs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

constexpr char kRolloutBackend[] = "TestValid";
constexpr auto kRolloutDecisionTimeout = std::chrono::seconds(90);

// ---- Config ---------------------------------------------------------------------------------

TEST(RolloutConfigTest, ReadsTheKeysOverTheDefaults) {
  ServeConfig config = server::DefaultServeConfig();
  EXPECT_EQ(config.deploy_policy, "immediate");
  Status applied = server::ApplyConfigText(
      R"({"deploy_policy": "progressive", "rollout": {"shadow_fraction": 0.25,
          "min_samples": 50, "steps": [5, 100], "max_error_rate": 0.02}})",
      "serve.json", config);
  ASSERT_TRUE(applied.ok()) << applied.ToString();
  EXPECT_EQ(config.deploy_policy, "progressive");
  EXPECT_EQ(config.rollout.shadow_fraction, 0.25);
  EXPECT_EQ(config.rollout.min_samples, 50u);
  EXPECT_EQ(config.rollout.steps, (std::vector<double>{5, 100}));
  EXPECT_EQ(config.rollout.max_error_rate, 0.02);
  // Keys left out keep their defaults.
  EXPECT_EQ(config.rollout.max_p99_ratio, server::RolloutPolicy{}.max_p99_ratio);
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
      {R"({"rollout": {"max_error_rate": "1%"}})", "'rollout.max_error_rate' must be a number"},
      {R"({"rollout": {"max_p99_ratio": 0.5}})", "'rollout.max_p99_ratio' must be between 1"},
      {R"({"rollout": {"max_abs_divergence": -1}})",
       "'rollout.max_abs_divergence' must be between 0"},
      {R"({"rollout": {"window": 3}})", "unknown key 'rollout.window' (known: shadow_fraction"},
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

// ---- Whole servers --------------------------------------------------------------------------

struct RolloutServer {
  ServeHome home;
  server::RunningServer running;
  fs::path backend_file() const { return home.backends() / "Test_Valid_backend.so"; }
  std::unique_ptr<httplib::Client> Client() const {
    auto client = std::make_unique<httplib::Client>("127.0.0.1", running.http.port);
    client->set_read_timeout(30, 0);
    return client;
  }
};

std::unique_ptr<RolloutServer> StartRolloutServer(const std::string& rollout_policy,
                                                  const std::string& admin_token = "") {
  auto server = std::make_unique<RolloutServer>();
  server->home.Write("models/identity/1/model.onnx", RowIdentityModel());
  server->home.Write("models/identity/config.json", R"({"backends": ["TestValid"]})");
  CopyFile(Fixture("Valid"), server->backend_file());
  // deploys are explicit: the admin API's reload
  ServeConfig config = InProcessConfig(server->home);
  config.admin_token = admin_token;
  Status applied = server::ApplyConfigText(
      R"({"deploy_policy": "progressive", "rollout": )" + rollout_policy + "}", "test.json",
      config);
  if (!applied.ok())
    throw std::runtime_error(applied.ToString());
  auto started = server::StartServer(config);
  if (!started.ok())
    throw std::runtime_error("server did not start: " + started.error().ToString());
  server->running = std::move(started).value();
  return server;
}

// Publishes fixture `name` as TestValid's file (write beside, rename into place) and has the
// server look at it, as the watcher would.
json Deploy(const RolloutServer& server, std::string_view name,
            const httplib::Headers& token = {}) {
  server.home.Publish(Fixture(name), server.backend_file().filename());
  auto client = server.Client();
  return Post(*client, std::string("/v2/backends/") + kRolloutBackend + "/reload", "", token).body;
}

json Rollout(const RolloutServer& server) {
  auto client = server.Client();
  return Get(*client, std::string("/v2/backends/") + kRolloutBackend + "/rollout").body;
}

// Waits until the rollout has ended (promoted or rolled back); its last view.
json WaitForDecision(const RolloutServer& server) {
  json view;
  Eventually(
      [&] {
        view = Rollout(server);
        return view["phase"] == "promoted" || view["phase"] == "rolled_back";
      },
      kRolloutDecisionTimeout);
  return view;
}

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
  auto status = server.running.core->context().registry.Describe(kRolloutBackend);
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
          "max_p99_ratio": 1000000})");
  const uint64_t stable =
      server->running.core->context().registry.Describe(kRolloutBackend)->active_generation;
  RolloutClients clients(*server, 4, seed);
  ASSERT_TRUE(Eventually([&] { return clients.answers() > 20; }, std::chrono::seconds(30)));
  const json deployed = Deploy(*server, "ValidGoodFix");
  EXPECT_EQ(deployed["action"], "candidate") << deployed.dump();
  const json view = WaitForDecision(*server);
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
  const auto status = server->running.core->context().registry.Describe(kRolloutBackend);
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
  const auto active = server->running.core->context().runtime.Backend(kRolloutBackend);
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
  Deploy(*server, "ValidNext");  // adds 1000 to every output
  const json view = WaitForDecision(*server);
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
  EXPECT_EQ(Rollout(*server)["candidate_generation"], candidate);
  EXPECT_EQ(Rollout(*server)["phase"], "rolled_back");
}

TEST(RolloutTest, AFixThatFailsOnSomeInputsIsRolledBackInCanaryAndOnlyItsRequestsFail) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // No shadow phase: the errors must be caught among the canary's requests.
  auto server = StartRolloutServer(
      R"({"shadow_fraction": 0, "min_samples": 40, "steps": [20, 100],
          "max_p99_ratio": 1000000})");
  RolloutClients clients(*server, 4, seed, /*negative_share=*/0.3);
  ASSERT_TRUE(Eventually([&] { return clients.answers() > 20; }, std::chrono::seconds(30)));
  EXPECT_TRUE(clients.failures().empty()) << "the stable build fails";
  Deploy(*server, "ValidFailsSome");  // fails an execution with a negative input
  const json view = WaitForDecision(*server);
  clients.Stop();

  ASSERT_EQ(view["phase"], "rolled_back") << view.dump(2);
  EXPECT_EQ(view["decided_by"], "policy");
  EXPECT_THAT(view["reason"].get<std::string>(), HasSubstr("canary at 20 %: the candidate failed"));
  EXPECT_EQ(Phases(view), (std::vector<std::string>{"canary 20", "rolled_back"}));
  // Every failure a client saw is the candidate's, and the stable side failed none.
  const auto failures = clients.failures();
  EXPECT_FALSE(failures.empty());
  for (const auto& failure : failures)
    EXPECT_THAT(failure, HasSubstr("FailOnNegative refuses the negative input"));
  // The totals are the rollout's last reading of the candidate's counters, taken when it was
  // decided: a request then in flight on the candidate (one per client at most) failed after it,
  // uncounted.
  const json totals = Rollout(*server)["totals"];
  EXPECT_EQ(totals["stable"]["errors"], 0);
  const auto counted = totals["candidate"]["errors"].get<std::size_t>();
  EXPECT_LE(counted, failures.size());
  EXPECT_LE(failures.size(), counted + 4) << "more failures than the decision can explain";
  EXPECT_TRUE(clients.wrong().empty()) << clients.wrong().front();
}

TEST(RolloutTest, ASlowFixIsRolledBackInCanaryByItsP99) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto server = StartRolloutServer(
      R"({"shadow_fraction": 0.2, "min_samples": 30, "steps": [25, 100], "max_p99_ratio": 1.5})");
  RolloutClients clients(*server, 4, seed);
  ASSERT_TRUE(Eventually([&] { return clients.answers() > 20; }, std::chrono::seconds(30)));
  Deploy(*server, "ValidSlow");  // the same outputs, 5 ms slower
  const json view = WaitForDecision(*server);
  clients.Stop();

  ASSERT_EQ(view["phase"], "rolled_back") << view.dump(2);
  EXPECT_EQ(view["decided_by"], "policy");
  EXPECT_THAT(view["reason"].get<std::string>(), HasSubstr("above max_p99_ratio 1.5"));
  EXPECT_EQ(Phases(view), (std::vector<std::string>{"shadow", "canary 25", "rolled_back"}));
  EXPECT_TRUE(clients.failures().empty()) << clients.failures().front();
  EXPECT_TRUE(clients.wrong().empty()) << clients.wrong().front();
}

TEST(RolloutTest, OperatorsAdvancePauseResumeAndAbortThroughTheAdminApi) {
  const std::string kToken = "rollout-token";
  const httplib::Headers token = {{"Authorization", "Bearer " + kToken}};
  // Samples enough that the policy never moves on by itself during the test.
  auto server = StartRolloutServer(R"({"shadow_fraction": 0.1, "min_samples": 100000000})", kToken);
  auto client = server->Client();
  const std::string base = std::string("/v2/backends/") + kRolloutBackend + "/rollout";

  const json idle = Rollout(*server);
  EXPECT_EQ(idle["phase"], "none");
  EXPECT_EQ(idle["candidate_generation"], 0);
  EXPECT_EQ(Post(*client, base + "/advance", "", token).status, 409);  // none under way
  EXPECT_EQ(Get(*client, "/v2/backends/Nope/rollout").status, 404);

  Deploy(*server, "ValidGoodFix", token);
  EXPECT_EQ(Rollout(*server)["phase"], "shadow");
  EXPECT_EQ(Post(*client, base + "/advance", "").status, 401);  // the token is required
  EXPECT_EQ(Rollout(*server)["phase"], "shadow");
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
  view = Put(*client, base + "/policy", R"({"max_error_rate": 0.05})", token).body;
  EXPECT_EQ(view["policy"]["max_error_rate"], 0.05);

  view = Post(*client, base + "/abort", "", token).body;
  EXPECT_EQ(view["phase"], "rolled_back") << view.dump(2);
  EXPECT_EQ(view["decided_by"], "operator");
  EXPECT_EQ(Phases(view), (std::vector<std::string>{"shadow", "canary 1", "paused", "canary 1",
                                                    "canary 10", "rolled_back"}));
  EXPECT_EQ(
      server->running.core->context().registry.Describe(kRolloutBackend)->candidate_generation, 0u);

  // Counted in /metrics, labelled by backend and phase.
  const auto metrics = client->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body,
              HasSubstr("backplane_rollout_phase{backend=\"TestValid\",phase=\"rolled_back\"} 1"));
  EXPECT_THAT(
      metrics->body,
      HasSubstr("backplane_rollout_transitions_total{backend=\"TestValid\",to=\"canary\"} 3"));
}

}  // namespace
}  // namespace backplane::testing
