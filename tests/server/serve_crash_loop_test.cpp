// No crash loops (docs/operators.md, "Crash loops and state_dir"): a real `backplane serve` with a
// state_dir gets a build copied over its backend's file that dies by SIGSEGV on every execution;
// it activates it and dies on the first request (under a sanitizer, whose report of the null
// write would fail the test, it is killed from outside instead). Started again with the same
// config, it refuses that build (SUSPECTED_CRASH in its log, its admin API and `backplane check
// --config`) and answers from the build before, whose bytes exist only in the state directory by
// then.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>

#include "config/server_config.hpp"
#include "onnx/model_builder.hpp"
#include "sanitizer_build.hpp"
#include "serve_test_util.hpp"

namespace backplane::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kIdentityRequest[] =
    R"({"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]})";

std::vector<float> Answer(const JsonReply& reply) {
  if (reply.status != 200 || !reply.body.contains("outputs"))
    return {};
  return reply.body["outputs"][0]["data"].get<std::vector<float>>();
}

std::string Sha256Of(const fs::path& file) {
  const auto sum = RunCommand("sha256sum " + file.string());
  return sum.exit_code == 0 ? sum.output.substr(0, 64) : "";
}

TEST(ServeCrashLoopTest, AStartAfterACrashingDeployServesTheBuildBeforeIt) {
  ServeHome home;
  home.Write("models/identity/1/model.onnx", RowIdentityModel());
  home.Write("models/identity/config.json", R"({"backends": ["TestValid"]})");
  const fs::path backend_file = home.backends() / "Test_Valid_backend.so";
  CopyFile(Fixture("Valid"), backend_file);
  const fs::path state_dir = home.path() / "state";
  home.Write("config.json", R"({"watch_backends": false, "state_dir": "state",
                                "crash_grace_s": 600})");
  const std::vector<std::string> args = {"--config",   (home.path() / "config.json").string(),
                                         "--models",   home.models().string(),
                                         "--backends", home.backends().string()};
  const std::string check = std::string(BACKPLANE_EXECUTABLE) + " check --config " +
                            (home.path() / "config.json").string() + " " + backend_file.string();

  auto server = ServeProcess::Start(args);
  auto client = server->Client();
  const std::vector<float> valid_answer =
      Answer(Post(*client, "/v2/models/identity/infer", kIdentityRequest));
  ASSERT_EQ(valid_answer, (std::vector<float>{1, 2, 3, 4}));

  // The operator copies the new build over the file (in place: the old bytes are gone) and asks
  // for it. It activates, and the first request that runs it kills the process.
  CopyFile(Fixture("ValidCrashesAlways"), backend_file);
  const auto reloaded = Post(*client, "/v2/backends/TestValid/reload", "");
  ASSERT_EQ(reloaded.status, 200) << reloaded.text;
#if defined(BACKPLANE_ASAN_BUILD) || defined(BACKPLANE_TSAN_BUILD)
  // Under a sanitizer the null write is a report in the server's log, which ServeProcess counts
  // as a failure: the process is ended from outside instead, as the OOM killer would end it.
  server->Signal(SIGKILL);
  ASSERT_EQ(server->WaitForExit(10s), 128 + SIGKILL) << server->Log();
#else
  (void)Post(*client, "/v2/models/identity/infer", kIdentityRequest);
  ASSERT_EQ(server->WaitForExit(10s), 128 + SIGSEGV) << server->Log();
#endif
  server.reset();

  // Before the restart, `check --config` already says what the next start will do.
  const auto checked = RunCommand(check);
  EXPECT_NE(checked.exit_code, 0) << checked.output;
  EXPECT_THAT(checked.output, HasSubstr("REJECTED SUSPECTED_CRASH"));
  EXPECT_THAT(checked.output, HasSubstr(Sha256Of(Fixture("ValidCrashesAlways"))));

  server = ServeProcess::Start(args);
  client = server->Client();
  EXPECT_THAT(server->Log(), HasSubstr("SUSPECTED_CRASH"));
  EXPECT_EQ(Answer(Post(*client, "/v2/models/identity/infer", kIdentityRequest)), valid_answer);
  const auto described = Get(*client, "/v2/backends/TestValid");
  ASSERT_EQ(described.status, 200) << described.text;
  const json& status = described.body;
  ASSERT_FALSE(status["generations"].empty()) << described.text;
  EXPECT_EQ(status["generations"][0]["state"], "active");
  EXPECT_EQ(status["generations"][0]["sha256"], Sha256Of(Fixture("Valid")));
  EXPECT_THAT(status["generations"][0]["resolved_file"].get<std::string>(),
              HasSubstr(state_dir.string()));
  ASSERT_FALSE(status["rejected"].empty()) << described.text;
  EXPECT_EQ(status["rejected"][0]["reason"], "SUSPECTED_CRASH");
  ASSERT_EQ(status["activations"].size(), 1u) << described.text;
  EXPECT_EQ(status["activations"][0]["state"], "suspected");
  EXPECT_EQ(status["activations"][0]["sha256"], Sha256Of(Fixture("ValidCrashesAlways")));
  // With the server running, the suspect is still one.
  EXPECT_THAT(RunCommand(check).output, HasSubstr("REJECTED SUSPECTED_CRASH"));

  // Another build published ends it: it serves, and nothing is suspected any more.
  home.Publish(Fixture("ValidNext"), backend_file.filename().string());
  const auto published = Post(*client, "/v2/backends/TestValid/reload", "");
  ASSERT_EQ(published.status, 200) << published.text;
  EXPECT_EQ(Answer(Post(*client, "/v2/models/identity/infer", kIdentityRequest)),
            (std::vector<float>{1001, 1002, 1003, 1004}));
  const auto after_publish = Get(*client, "/v2/backends/TestValid");
  ASSERT_EQ(after_publish.body["activations"].size(), 1u) << after_publish.text;
  EXPECT_EQ(after_publish.body["activations"][0]["state"], "probation");
  EXPECT_EQ(after_publish.body["activations"][0]["sha256"], Sha256Of(Fixture("ValidNext")));
  server->Signal(SIGTERM);
  EXPECT_EQ(server->WaitForExit(30s), 0) << server->Log();
  EXPECT_THAT(RunCommand(check).output, ::testing::Not(HasSubstr("SUSPECTED_CRASH")));
}

TEST(ServeCrashLoopTest, ReadsStateDirAndCrashGraceAndRefusesBadValuesNamingTheKey) {
  server::ServeConfig config = server::DefaultServeConfig();
  EXPECT_TRUE(config.state_dir.empty());
  EXPECT_EQ(config.crash_grace, std::chrono::seconds(60));
  Status applied = server::ApplyConfigText(R"({"state_dir": "state", "crash_grace_s": 5})",
                                           "/etc/backplane/serve.json", config);
  ASSERT_TRUE(applied.ok()) << applied.ToString();
  EXPECT_EQ(config.state_dir, fs::path("/etc/backplane/state"));  // relative to the file
  EXPECT_EQ(config.crash_grace, std::chrono::seconds(5));
  const std::pair<const char*, const char*> cases[] = {
      {R"({"state_dir": ""})", "'state_dir' must name a directory"},
      {R"({"state_dir": 3})", "'state_dir' must be a string"},
      {R"({"crash_grace_s": 0})", "'crash_grace_s' must be between 1 and 86400, got 0"},
      {R"({"crash_grace_s": "60"})", "'crash_grace_s' must be an integer"},
  };
  for (const auto& [text, message] : cases) {
    server::ServeConfig unchanged = server::DefaultServeConfig();
    Status refused = server::ApplyConfigText(text, "serve.json", unchanged);
    EXPECT_THAT(refused.message(), HasSubstr(message)) << text;
    EXPECT_TRUE(unchanged.state_dir.empty()) << text;
  }
}

TEST(ServeCrashLoopTest, AStateDirThatCannotBeUsedStopsTheStartNamingTheKey) {
  ServeHome home;
  home.Write("not-a-directory", "x");
  home.Write("config.json", R"({"state_dir": "not-a-directory/state"})");
  const auto result =
      ServeProcess::RunToExit({"--config", (home.path() / "config.json").string(), "--models",
                               home.models().string(), "--backends", home.backends().string()});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.output,
              HasSubstr("state_dir " + (home.path() / "not-a-directory" / "state").string()));
}

}  // namespace
}  // namespace backplane::testing
