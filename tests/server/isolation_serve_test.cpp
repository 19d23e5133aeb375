// Isolated backends in a whole server (issue 39): with backend_isolation, a backend whose
// Execute dies (null write, abort, exit, a hang past execute_timeout_ms) costs its worker, not the
// server. The request that killed it gets an error naming how it died; MNIST on the in-process
// CpuRef keeps answering every request meanwhile; the log names backend, generation, file and
// sha256. The requests a dying worker was running are run again (a killed worker costs no client
// request), and a rollout candidate is tried in a worker even over an in-process backend. The
// config keys and their refusals too.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include "cli/serve_command.hpp"
#include "onnx/model_builder.hpp"
#include "serve_test_util.hpp"

namespace backplane::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using server::ServeConfig;
using ::testing::HasSubstr;

TEST(IsolationConfigTest, ReadsTheKeysAndRefusesBadOnesNamingWhy) {
  ServeConfig config = server::DefaultServeConfig();
  EXPECT_TRUE(config.backend_isolation.empty());
  ASSERT_TRUE(server::ApplyConfigText(
                  R"({"backend_isolation": {"AcmeFast": "process", "*": "none"},
                      "worker": {"execute_timeout_ms": 500, "memory_limit_bytes": 1000000}})",
                  "serve.json", config)
                  .ok());
  EXPECT_EQ(config.backend_isolation.at("AcmeFast"), true);
  EXPECT_EQ(config.backend_isolation.at("*"), false);
  EXPECT_EQ(config.worker.execute_timeout, std::chrono::milliseconds(500));
  EXPECT_EQ(config.worker.memory_limit_bytes, 1000000u);
  EXPECT_EQ(config.worker.slots, 4);  // left out: the default

  const std::pair<const char*, const char*> cases[] = {
      {R"({"backend_isolation": ["AcmeFast"]})", "'backend_isolation' must be an object"},
      {R"({"backend_isolation": {"AcmeFast": "sandbox"}})",
       "backend AcmeFast must be \"process\" or \"none\", got \"sandbox\""},
      {R"({"backend_isolation": {"bad id!": "process"}})", "'bad id!' is not a backend id"},
      {R"({"worker": {"execute_timeout_ms": -1}})", "worker.execute_timeout_ms"},
      {R"({"worker": {"slots": 0}})", "worker.slots"},
      {R"({"worker": {"max_restarts": 3}})", "'worker' has no key 'max_restarts'"},
      {R"({"worker": 5})", "'worker' must be a JSON object"},
  };
  for (const auto& [text, message] : cases) {
    ServeConfig unchanged = server::DefaultServeConfig();
    Status applied = server::ApplyConfigText(text, "serve.json", unchanged);
    ASSERT_FALSE(applied.ok()) << text;
    EXPECT_THAT(applied.message(), HasSubstr(message)) << text;
    EXPECT_TRUE(unchanged.backend_isolation.empty()) << text;
  }
}

class IsolatedServeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    home_.Write("models/crashy/1/model.onnx", RowIdentityModel());
    home_.Write("models/crashy/config.json", R"({"backends": ["TestCrash"]})");
    CopyFile(Fixture("Crash"), home_.backends() / "Test_Crash_backend.so");
    ServeConfig config = InProcessConfig(home_);
    Status applied = server::ApplyConfigText(
        R"({"backend_isolation": {"TestCrash": "process"},
            "worker": {"execute_timeout_ms": 1000, "max_crashes": 2}})",
        "test.json", config);
    ASSERT_TRUE(applied.ok()) << applied.ToString();
    auto started = server::StartServer(config);
    ASSERT_TRUE(started.ok()) << started.error().ToString();
    running_ = std::move(started).value();
  }

  std::unique_ptr<httplib::Client> Client() const {
    auto client = std::make_unique<httplib::Client>("127.0.0.1", running_.http.port);
    client->set_read_timeout(30, 0);
    return client;
  }

  ServeHome home_;
  server::RunningServer running_;
};

TEST_F(IsolatedServeTest, ABackendThatDiesCostsItsWorkerAndTheServerKeepsServing) {
  auto client = Client();
  // Served from the worker, answers as in-process.
  JsonReply ok = Post(*client, "/v2/models/crashy/infer", RowRequest(1));
  ASSERT_EQ(ok.status, 200) << ok.text;
  EXPECT_EQ(ok.body["outputs"][0]["data"], json({1.0, 2.0, 3.0, 4.0}));

  // MNIST on the in-process CpuRef, from two clients, throughout.
  std::atomic<bool> stop{false};
  std::atomic<int> mnist_ok{0}, mnist_failed{0};
  std::vector<std::thread> clients;
  JoinAll joiner{stop, clients};
  for (int c = 0; c < 2; ++c) {
    clients.emplace_back([&, c] {
      auto mnist = Client();
      while (!stop.load()) {
        JsonReply reply = Post(*mnist, "/v2/models/mnist/infer", MnistRequestBody(c));
        if (reply.status == 200 && ArgMax(reply.body) == MnistLabel(c))
          ++mnist_ok;
        else
          ++mnist_failed;
      }
    });
  }
  ASSERT_TRUE(Eventually([&] { return mnist_ok.load() > 10; }, 20s));

  // The null write kills the worker: this request fails, naming how.
  JsonReply crashed = Post(*client, "/v2/models/crashy/infer", RowRequest(9110));
  EXPECT_NE(crashed.status, 200);
  EXPECT_NE(crashed.status, 0) << "the server itself went away";
  EXPECT_THAT(crashed.text, HasSubstr("was killed by signal 11 (SIGSEGV)"));
  EXPECT_THAT(crashed.text, HasSubstr("backend TestCrash generation"));

  // The worker is restarted as a new generation of the same file, and serves again.
  const auto crashed_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(Eventually(
      [&] { return Post(*client, "/v2/models/crashy/infer", RowRequest(1)).status == 200; }, 20s));
  std::printf("serving again %lld ms after the crash\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - crashed_at)
                                         .count()));
  // The networks move onto the restarted generation a moment before the registry records it
  // active, so a request can already be answered by it while the admin view still says 2.
  JsonReply backend;
  EXPECT_TRUE(Eventually(
      [&] {
        backend = Get(*client, "/v2/backends/TestCrash");
        return backend.status == 200 && backend.body["active_generation"].get<uint64_t>() > 2u;
      },
      20s))
      << backend.text;

  const int before = mnist_ok.load();
  ASSERT_TRUE(Eventually([&] { return mnist_ok.load() > before + 20; }, 20s));
  stop.store(true);
  for (auto& thread : clients)
    thread.join();
  EXPECT_EQ(mnist_failed.load(), 0);
  JsonReply health = Get(*client, "/v2/health/live");
  EXPECT_EQ(health.status, 200);
}

TEST_F(IsolatedServeTest, ABuildThatKeepsDyingIsNotRestartedPastMaxCrashes) {
  auto client = Client();
  // max_crashes 2 (SetUp): two deaths are restarted, the third is not (no previous build). A
  // request that kills its worker is run once more on the restarted one, so the first such
  // request costs two deaths, and the second the third.
  for (int request = 1; request <= 2; ++request) {
    ASSERT_TRUE(Eventually(
        [&] { return Post(*client, "/v2/models/crashy/infer", RowRequest(1)).status == 200; }, 20s))
        << "request " << request;
    JsonReply crashed = Post(*client, "/v2/models/crashy/infer", RowRequest(9060));
    EXPECT_NE(crashed.status, 200);
    EXPECT_THAT(crashed.text, HasSubstr("SIGABRT")) << "request " << request;
    if (request == 1) {
      EXPECT_THAT(crashed.text, HasSubstr("run again after a crash"));
    }
  }
  // It stays down, withdrawn with its file refused as CRASHED (no other build to roll back to),
  // while MNIST answers.
  JsonReply backends;
  ASSERT_TRUE(Eventually(
      [&] {
        backends = Get(*client, "/v2/backends");
        return backends.text.find("CRASHED") != std::string::npos;
      },
      10s))
      << backends.text;
  EXPECT_THAT(backends.text, HasSubstr("3 deaths within 60 s (max_crashes 2)"));
  JsonReply down = Post(*client, "/v2/models/crashy/infer", RowRequest(1));
  EXPECT_NE(down.status, 200) << down.text;
  JsonReply mnist = Post(*client, "/v2/models/mnist/infer", MnistRequestBody(0));
  ASSERT_EQ(mnist.status, 200);
  EXPECT_EQ(ArgMax(mnist.body), MnistLabel(0));
}

TEST_F(IsolatedServeTest, AHangPastTheExecuteTimeoutKillsTheWorkerNotTheServer) {
  auto client = Client();
  const auto start = std::chrono::steady_clock::now();
  JsonReply hung = Post(*client, "/v2/models/crashy/infer", RowRequest(9090));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_NE(hung.status, 200);
  EXPECT_NE(hung.status, 0);
  EXPECT_THAT(hung.text, HasSubstr("ran past the worker's call timeout of 1000 ms"));
  EXPECT_LT(took, 10s);
  EXPECT_EQ(Get(*client, "/v2/health/live").status, 200);
}

// A worker killed from outside while two clients keep it busy: every request it was running is
// run again on the restarted worker, so no client sees the death.
TEST_F(IsolatedServeTest, AWorkerKilledFromOutsideCostsNoClientRequest) {
  RowClients clients(running_.http.port, "/v2/models/crashy/infer", 2,
                     [](int c, int i) { return static_cast<float>(c * 100000 + i % 1000); });
  const auto worker_pid = [&] {
    const auto backend = running_.core->context().runtime.Backend("TestCrash");
    if (backend == nullptr || backend->generation() == nullptr)
      return pid_t{0};
    const std::string& runs_in = backend->generation()->info().runs_in;  // "worker process N"
    return static_cast<pid_t>(std::stol(runs_in.substr(runs_in.rfind(' ') + 1)));
  };
  for (int kill = 0; kill < 2; ++kill) {  // max_crashes 2 (SetUp): both are restarted
    const int before = clients.answered();
    ASSERT_TRUE(Eventually([&] { return clients.answered() > before + 50; }, 20s));
    const pid_t pid = worker_pid();
    ASSERT_GT(pid, 0);
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    ASSERT_TRUE(Eventually([&] { return worker_pid() != pid && worker_pid() != 0; }, 20s))
        << "kill " << kill;
  }
  const int before = clients.answered();
  ASSERT_TRUE(Eventually([&] { return clients.answered() > before + 50; }, 20s));
  clients.Stop();
  const auto failures = clients.failures();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, the first: " << failures.front();
}

// A candidate tried in a sandbox (rollout.candidate_isolation, the default under "progressive")
// over an in-process backend, dying in a canary step the way each case says: the server lives,
// the candidate is rolled back as CRASHED, and the clients' requests it was running are run on
// the stable generation, so none fails and every answer is right.
struct SandboxCase {
  float mark;
  const char* how;  // in the rejection's message
  // Only the hang races the call timeout; the others get one long enough that the death they
  // name comes first even under ThreadSanitizer (which takes over 300 ms to touch 64 MiB).
  int execute_timeout_ms = 10000;
};

class SandboxedCandidateTest : public ::testing::TestWithParam<SandboxCase> {};

TEST_P(SandboxedCandidateTest, DiesInACanaryStepAndNoClientRequestFails) {
  const SandboxCase& crash = GetParam();
  ServeHome home;
  home.Write("models/identity/1/model.onnx", RowIdentityModel());
  home.Write("models/identity/config.json", R"({"backends": ["TestValid"]})");
  const fs::path backend_file = home.backends() / "Test_Valid_backend.so";
  CopyFile(Fixture("Valid"), backend_file);
  ServeConfig config = InProcessConfig(home);
  const std::string settings =
      R"({"deploy_policy": "progressive", "worker": {"execute_timeout_ms": )" +
      std::to_string(crash.execute_timeout_ms) + R"(, "memory_limit_bytes": 200000000},
          "rollout": {"shadow_fraction": 0, "min_samples": 1000000, "steps": [50, 100]}})";
  ASSERT_TRUE(server::ApplyConfigText(settings, "test.json", config).ok()) << settings;
  auto started = server::StartServer(config);
  ASSERT_TRUE(started.ok()) << started.error().ToString();
  server::RunningServer running = std::move(started).value();
  auto admin = std::make_unique<httplib::Client>("127.0.0.1", running.http.port);
  admin->set_read_timeout(30, 0);
  const uint64_t stable = running.core->context().registry.Describe("TestValid")->active_generation;

  // Every seventh row is marked: the stable build answers it as any other.
  RowClients clients(running.http.port, "/v2/models/identity/infer", 2, [&](int c, int i) {
    return i % 7 == 6 ? crash.mark : static_cast<float>(c * 1000 + i % 500);
  });
  ASSERT_TRUE(Eventually([&] { return clients.answered() > 20; }, 20s));
  home.Publish(Fixture("ValidCrashes"), backend_file.filename());
  JsonReply deployed = Post(*admin, "/v2/backends/TestValid/reload", "");
  ASSERT_EQ(deployed.status, 200) << deployed.text;
  ASSERT_EQ(deployed.body["action"], "candidate") << deployed.text;

  JsonReply rollout;
  ASSERT_TRUE(Eventually(
      [&] {
        rollout = Get(*admin, "/v2/backends/TestValid/rollout");
        return rollout.body["phase"] == "rolled_back";
      },
      30s))
      << rollout.text;
  const int before = clients.answered();
  ASSERT_TRUE(Eventually([&] { return clients.answered() > before + 20; }, 20s));
  clients.Stop();
  const auto failures = clients.failures();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, the first: " << failures.front();
  JsonReply backend = Get(*admin, "/v2/backends/TestValid");
  EXPECT_EQ(backend.body["active_generation"], stable) << backend.text;
  EXPECT_THAT(backend.text, HasSubstr("CRASHED"));
  EXPECT_THAT(backend.text, HasSubstr(crash.how));
  const auto active = running.core->context().runtime.Backend("TestValid");
  EXPECT_EQ(active->generation()->out_of_process(), nullptr) << "the stable build runs here";
  EXPECT_EQ(Get(*admin, "/v2/health/live").status, 200);
}

INSTANTIATE_TEST_SUITE_P(
    Deaths, SandboxedCandidateTest,
    ::testing::Values(SandboxCase{9110, "was killed by signal 11 (SIGSEGV)"},
                      SandboxCase{9060, "was killed by signal 6 (SIGABRT)"},
                      SandboxCase{9030, "exited with status 3"},
                      SandboxCase{9000, "exited with status 0"}, SandboxCase{9130, "(SIGSEGV)"},
                      SandboxCase{9090, "ran past the worker's call timeout of 300 ms", 300},
                      SandboxCase{9120, "passed memory_limit_bytes 200000000"}),
    [](const ::testing::TestParamInfo<SandboxCase>& info) {
      return "Mark" + std::to_string(static_cast<int>(info.param.mark));
    });

// A progressive candidate that dies in its shadow phase (every backend isolated): rolled back at
// once with CRASHED, and no client request fails, since a shadow run answers nobody.
TEST(IsolatedRolloutTest, ACandidateThatDiesInTheShadowIsRolledBackAndNoClientSeesIt) {
  ServeHome home;
  home.Write("models/identity/1/model.onnx", RowIdentityModel());
  home.Write("models/identity/config.json", R"({"backends": ["TestValid"]})");
  const fs::path backend_file = home.backends() / "Test_Valid_backend.so";
  CopyFile(Fixture("Valid"), backend_file);
  ServeConfig config = InProcessConfig(home);
  ASSERT_TRUE(server::ApplyConfigText(
                  R"({"backend_isolation": {"*": "process"}, "deploy_policy": "progressive",
                      "rollout": {"shadow_fraction": 1.0, "min_samples": 1000000}})",
                  "test.json", config)
                  .ok());
  auto started = server::StartServer(config);
  ASSERT_TRUE(started.ok()) << started.error().ToString();
  server::RunningServer running = std::move(started).value();
  auto client = std::make_unique<httplib::Client>("127.0.0.1", running.http.port);
  client->set_read_timeout(30, 0);

  home.Publish(Fixture("ValidCrashes"), backend_file.filename());
  JsonReply deployed = Post(*client, "/v2/backends/TestValid/reload", "");
  ASSERT_EQ(deployed.status, 200) << deployed.text;
  ASSERT_EQ(deployed.body["action"], "candidate") << deployed.text;

  // Rows, every fifth marked, until the candidate is gone: the stable build answers them all; the
  // candidate dies on the shadow run of a marked row. A shadow run is skipped while another is
  // in flight (the first one waits for the worker), so how many rows that takes varies.
  int failed = 0;
  JsonReply status;
  ASSERT_TRUE(Eventually(
      [&] {
        for (int i = 0; i < 5; ++i) {
          const float first = i == 4 ? 9110.0f : static_cast<float>(i);
          JsonReply reply = Post(*client, "/v2/models/identity/infer", RowRequest(first));
          if (reply.status != 200 || reply.body["outputs"][0]["data"][0] != first)
            ++failed;
        }
        status = Get(*client, "/v2/backends/TestValid");
        return status.body["candidate_generation"] == 0;
      },
      10s))
      << status.text;
  EXPECT_EQ(failed, 0);
  EXPECT_THAT(status.text, HasSubstr("CRASHED"));
  EXPECT_THAT(status.text, HasSubstr("was killed by signal 11 (SIGSEGV)"));
}

}  // namespace
}  // namespace backplane::testing
