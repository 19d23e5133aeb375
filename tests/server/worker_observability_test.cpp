// What an operator sees of isolated backends' workers (docs/operators.md, "Backends that crash"):
// /metrics counts their deaths by cause and the supervisor's restarts, the admin API says which
// worker process runs each generation, and crash_dir keeps each request that killed one with a
// `backplane run` line that replays it against the build that died. A real server in-process on
// the TestCrash fixture, whose Execute dies the way the first input element says (CrashMark).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <regex>

#include "backplane/onnx/network.hpp"
#include "backplane/registry/crash_supervisor.hpp"
#include "cli/serve_command.hpp"
#include "onnx/model_builder.hpp"
#include "sanitizer_build.hpp"
#include "serve_test_util.hpp"
#include "serving/crash_capture.hpp"

// A namespace of its own: the server tests are a unity build, and other files have helpers of
// these names.
namespace backplane::testing::worker_observability {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using server::ServeConfig;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr float kNullWrite = 9110;  // CrashMark: SIGSEGV
constexpr float kEndlessLoop = 9090;
constexpr float kLeak = 9120;  // 64 MiB more each time

// The value of one sample of a scrape ("name{labels}"), or -1 when absent.
double Sample(const std::string& scrape, const std::string& series) {
  const auto at = scrape.find("\n" + series + " ");
  if (at == std::string::npos)
    return -1;
  return std::stod(scrape.substr(at + series.size() + 2));
}

std::string Crashes(std::string_view how) {
  return "backplane_backend_worker_crashes_total{backend=\"TestCrash\",how=\"" + std::string(how) +
         "\"}";
}
constexpr char kRestarts[] = "backplane_backend_worker_restarts_total{backend=\"TestCrash\"}";
constexpr char kLastCrashed[] =
    "backplane_backend_worker_last_crash_generation{backend=\"TestCrash\"}";

// "worker process 1234" -> 1234; 0 for anything else.
pid_t WorkerPid(const json& generation) {
  std::smatch match;
  const std::string runs_in = generation.value("runs_in", "");
  static const std::regex pattern("worker process ([0-9]+)");
  return std::regex_match(runs_in, match, pattern) ? std::stoi(match[1]) : 0;
}

std::string CommandLineOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text;
}

class WorkerObservabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    home_.Write("models/crashy/1/model.onnx", RowIdentityModel());
    home_.Write("models/crashy/config.json", R"({"backends": ["TestCrash"]})");
    CopyFile(Fixture("Crash"), backend_file_);
    ServeConfig config = InProcessConfig(home_);
    // A crash runs the request again once the worker is restarted, and it dies again: each
    // marked request costs two workers. max_crashes lets every test's deaths be restarted.
    // The call timeout is long enough for a leak's 64 MiB to be touched under ThreadSanitizer,
    // so that the leak dies of memory_limit_bytes, not as a hang.
    Status applied = server::ApplyConfigText(
        R"({"backend_isolation": {"TestCrash": "process"},
            "worker": {"execute_timeout_ms": 2000, "memory_limit_bytes": 209715200,
                       "max_crashes": 20},
            "crash_dir": "crashes"})",
        home_.path() / "serve.json", config);
    ASSERT_TRUE(applied.ok()) << applied.ToString();
    auto started = server::StartServer(config);
    ASSERT_TRUE(started.ok()) << started.error().ToString();
    running_ = std::move(started).value();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", running_.http.port);
    client_->set_read_timeout(30, 0);
  }

  std::string Scrape() { return Get(*client_, "/metrics").text; }

  json Backend() { return Get(*client_, "/v2/backends/TestCrash").body; }
  // The active generation's entry.
  json Active() {
    const json backend = Backend();
    for (const auto& generation : backend["generations"]) {
      if (generation["generation"] == backend["active_generation"])
        return generation;
    }
    return json();
  }
  bool Serves() { return Post(*client_, "/v2/models/crashy/infer", RowRequest(1)).status == 200; }

  ServeHome home_;
  const fs::path backend_file_ = home_.backends() / "Test_Crash_backend.so";
  const fs::path crash_dir_ = home_.path() / "crashes";
  server::RunningServer running_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(WorkerObservabilityTest, MetricsCountDeathsByCauseAndRestartsPerBackend) {
  ASSERT_TRUE(Serves());
  // Every series of an isolated backend is there at 0 before its first death, so that
  // increase() sees the first one.
  std::string scrape = Scrape();
  for (const char* how : {"signal", "exit", "hang", "memory", "killed"})
    EXPECT_EQ(Sample(scrape, Crashes(how)), 0) << how << "\n" << scrape;
  EXPECT_EQ(Sample(scrape, kRestarts), 0) << scrape;
  EXPECT_EQ(Sample(scrape, kLastCrashed), 0) << scrape;
  // An in-process backend has none.
  EXPECT_THAT(scrape, ::testing::Not(HasSubstr("worker_crashes_total{backend=\"CpuRef\"")));

  // A null write: its worker dies, is restarted, runs the request again and dies again.
  EXPECT_NE(Post(*client_, "/v2/models/crashy/infer", RowRequest(kNullWrite)).status, 200);
  ASSERT_TRUE(Eventually([&] { return Serves() && Sample(Scrape(), kRestarts) == 2; }, 20s))
      << Scrape();
  scrape = Scrape();
  EXPECT_EQ(Sample(scrape, Crashes("signal")), 2) << scrape;
  EXPECT_EQ(Sample(scrape, Crashes("hang")), 0) << scrape;
  const uint64_t serving = Backend()["active_generation"].get<uint64_t>();
  // The second death was the generation before the one serving now.
  EXPECT_EQ(Sample(scrape, kLastCrashed), static_cast<double>(serving - 1)) << scrape;

  // An endless loop past execute_timeout_ms: twice too, counted as hangs, not as signals.
  const JsonReply hung = Post(*client_, "/v2/models/crashy/infer", RowRequest(kEndlessLoop));
  EXPECT_THAT(hung.text, HasSubstr("ran past the worker's call timeout of 2000 ms"));
  ASSERT_TRUE(Eventually([&] { return Serves() && Sample(Scrape(), kRestarts) == 4; }, 20s))
      << Scrape();
  scrape = Scrape();
  EXPECT_EQ(Sample(scrape, Crashes("hang")), 2) << scrape;
  EXPECT_EQ(Sample(scrape, Crashes("signal")), 2) << scrape;
  EXPECT_EQ(Sample(scrape, Crashes("exit")), 0) << scrape;

  // A leak past memory_limit_bytes (the monitor looks every 50 ms, between calls too).
  for (int i = 0; i < 40 && Sample(Scrape(), Crashes("memory")) < 1; ++i) {
    (void)Post(*client_, "/v2/models/crashy/infer", RowRequest(kLeak));
    std::this_thread::sleep_for(60ms);
  }
  ASSERT_TRUE(Eventually([&] { return Serves(); }, 20s));
  scrape = Scrape();
  EXPECT_GE(Sample(scrape, Crashes("memory")), 1) << scrape;
  EXPECT_EQ(Sample(scrape, Crashes("signal")), 2) << scrape;
  EXPECT_THAT(scrape, HasSubstr("# TYPE backplane_backend_worker_crashes_total counter\n"));
  EXPECT_THAT(scrape, HasSubstr("# TYPE backplane_backend_worker_restarts_total counter\n"));
  EXPECT_THAT(scrape, HasSubstr("# TYPE backplane_backend_worker_last_crash_generation gauge\n"));

  BACKPLANE_REQUIRE_COMMAND("promtool", "prometheus");
  // curl's failure fails the command (a pipe's status is promtool's, which passes an empty
  // input); $(...) drops the exposition's final newline, which printf puts back.
  const auto checked =
      RunCommand("metrics=$(curl -sf http://127.0.0.1:" + std::to_string(running_.http.port) +
                 "/metrics) && printf '%s\\n' \"$metrics\" | promtool check metrics 2>&1");
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
}

TEST_F(WorkerObservabilityTest, AdminApiSaysWhichWorkerProcessRunsEachGeneration) {
  ASSERT_TRUE(Serves());
  const json first = Active();
  const pid_t first_pid = WorkerPid(first);
  ASSERT_GT(first_pid, 0) << first.dump();
  EXPECT_THAT(CommandLineOf(first_pid), HasSubstr("backplane-backend-worker"));
  // An in-process backend's generations run in the server.
  const json cpu_ref = Get(*client_, "/v2/backends/CpuRef").body;
  EXPECT_EQ(cpu_ref["generations"][0]["runs_in"], "server") << cpu_ref.dump();

  EXPECT_NE(Post(*client_, "/v2/models/crashy/infer", RowRequest(kNullWrite)).status, 200);
  json restarted;
  ASSERT_TRUE(Eventually(
      [&] {
        // Two restarts: the request ran again on the first one's worker and killed it too.
        if (!Serves() || Sample(Scrape(), kRestarts) != 2)
          return false;
        restarted = Active();
        return restarted["generation"].get<uint64_t>() > first["generation"].get<uint64_t>();
      },
      20s))
      << Backend().dump();
  const pid_t restarted_pid = WorkerPid(restarted);
  ASSERT_GT(restarted_pid, 0) << restarted.dump();
  EXPECT_NE(restarted_pid, first_pid);
  EXPECT_THAT(CommandLineOf(restarted_pid), HasSubstr("backplane-backend-worker"));
  // The dead generation still says where it ran, and that process is gone.
  const json backend = Backend();  // kept: a range-for over a temporary's member dangles
  for (const auto& generation : backend["generations"]) {
    if (generation["generation"] == first["generation"]) {
      EXPECT_EQ(WorkerPid(generation), first_pid) << generation.dump();
    }
  }
  EXPECT_FALSE(fs::exists("/proc/" + std::to_string(first_pid) + "/cmdline") &&
               CommandLineOf(first_pid).find("backplane-backend-worker") != std::string::npos);
}

TEST_F(WorkerObservabilityTest, CrashDirKeepsTheRequestAndALineThatReplaysTheCrash) {
  ASSERT_TRUE(Serves());
  EXPECT_NE(Post(*client_, "/v2/models/crashy/infer", RowRequest(kNullWrite)).status, 200);
  fs::path capture;
  ASSERT_TRUE(Eventually(
      [&] {
        std::error_code error;
        for (const auto& entry : fs::directory_iterator(crash_dir_, error)) {
          if (fs::exists(entry.path() / "replay.sh"))
            capture = entry.path();
        }
        return !capture.empty();
      },
      20s));
  // Named by when, which backend and generation; one per reported request (the run again that
  // died too is the same request).
  EXPECT_THAT(capture.filename().string(),
              ::testing::MatchesRegex("[0-9]{8}T[0-9]{6}\\.[0-9]{3}Z-TestCrash-g[0-9]+-1"));

  auto input = ReadTensorProtoFile(capture / "input_0.pb");
  ASSERT_TRUE(input.ok()) << input.error().ToString();
  EXPECT_EQ(input->info().shape, (Shape{1, 4}));
  const auto elements = input->Elements<float>();
  EXPECT_EQ(std::vector<float>(elements.begin(), elements.end()),
            (std::vector<float>{kNullWrite, 2, 3, 4}));

  std::ifstream record_file(capture / "crash.json");
  const json record = json::parse(record_file);
  EXPECT_THAT(record["message"].get<std::string>(), HasSubstr("was killed by signal 11 (SIGSEGV)"));
  EXPECT_EQ(record["backend"], "TestCrash");
  EXPECT_EQ(record["model"], "crashy");
  const std::string sha256 = record["sha256"];
  EXPECT_THAT(record["message"].get<std::string>(), HasSubstr(sha256));
  const fs::path copy = crash_dir_ / "backends" / sha256 / "Test_Crash_backend.so";
  EXPECT_TRUE(fs::exists(copy));

  std::ifstream replay_file(capture / "replay.sh");
  const std::string replay((std::istreambuf_iterator<char>(replay_file)),
                           std::istreambuf_iterator<char>());
  EXPECT_THAT(replay,
              HasSubstr(" run '" + (home_.models() / "crashy/1/model.onnx").string() +
                        "' --backends '../backends/" + sha256 + "' --backends '" +
                        home_.backends().string() + "' --prefer 'TestCrash' --input input_0.pb\n"));

  // The file is replaced after the crash (a fix deployed, here garbage): the replay runs the copy
  // of the build that died, and dies as its worker did.
  home_.Write("backends/Test_Crash_backend.so", "not an ELF file");
  const std::string run_with = "BACKPLANE=" + std::string(BACKPLANE_EXECUTABLE) + " sh ";
  const auto replayed = RunCommand(run_with + (capture / "replay.sh").string() + " 2>&1");
  EXPECT_NE(replayed.exit_code, 0) << replayed.output;
#if !defined(BACKPLANE_ASAN_BUILD) && !defined(BACKPLANE_TSAN_BUILD)
  EXPECT_EQ(replayed.exit_code, 128 + SIGSEGV) << replayed.output;
#endif
  // It is that input that kills it: the same line with an unmarked one answers.
  Tensor unmarked(TensorInfo{DataType::kFloat32, Shape{1, 4}});
  std::fill(unmarked.Elements<float>().begin(), unmarked.Elements<float>().end(), 1.0f);
  ASSERT_TRUE(WriteTensorProtoFile(capture / "unmarked.pb", unmarked, "x").ok());
  const auto answered =
      RunCommand("sed 's/input_0.pb/unmarked.pb/' " + (capture / "replay.sh").string() + " > " +
                 (capture / "unmarked.sh").string() + " && " + run_with +
                 (capture / "unmarked.sh").string() + " 2>&1");
  EXPECT_EQ(answered.exit_code, 0) << answered.output;
  EXPECT_THAT(answered.output, HasSubstr("on TestCrash"));
}

TEST(WorkerDeathCauseTest, NamesHowAWorkerDiedInAWordALabelCanHold) {
  using isolation::WorkerDeath;
  EXPECT_EQ(DeathCause(WorkerDeath{.how = "was killed by signal 11 (SIGSEGV)", .signal = 11}),
            "signal");
  EXPECT_EQ(DeathCause(WorkerDeath{.how = "exited with status 3", .exit_status = 3}), "exit");
  EXPECT_EQ(DeathCause(WorkerDeath{.how = "was killed by signal 9 (SIGKILL)",
                                   .cause = "it wrote a reply larger than its slot",
                                   .killed = WorkerDeath::Killed::kBadReply,
                                   .signal = 9}),
            "killed");
  EXPECT_EQ(DeathCause(WorkerDeath{.how = "was killed by signal 9 (SIGKILL)",
                                   .killed = WorkerDeath::Killed::kCallTimeout,
                                   .signal = 9}),
            "hang");
  EXPECT_EQ(DeathCause(WorkerDeath{.how = "was killed by signal 9 (SIGKILL)",
                                   .killed = WorkerDeath::Killed::kMemoryLimit,
                                   .signal = 9}),
            "memory");
}

// A crash loop must not fill the disk: beyond max_captures the oldest captures go. (Without a
// model repository or a generation the message names, a capture holds its inputs and crash.json.)
TEST(CrashCaptureTest, KeepsTheNewestCapturesWithinItsBound) {
  TempDir dir;
  auto made = BackendRegistry::Create({.backend_paths = std::vector<fs::path>{}});
  ASSERT_TRUE(made.ok());
  const std::shared_ptr<BackendRegistry> registry = std::move(made).value();
  const fs::path crash_dir = dir.path() / "crashes";
  auto capture = server::CrashCapture::Create(crash_dir, *registry, {},
                                              {.max_captures = 3, .max_pending = 100});
  ASSERT_TRUE(capture.ok()) << capture.error().ToString();
  const Status crash(LoadReason::kCrashed, "a worker died");
  for (int i = 0; i < 7; ++i) {
    const float value = static_cast<float>(i);
    const ConstTensorView input{TensorInfo{DataType::kFloat32, Shape{1}}, &value};
    (*capture)->OnCrashedRequest({.network = 1, .inputs = std::span(&input, 1), .error = crash});
  }
  (*capture)->Stop();  // writes what is queued
  std::vector<float> kept;
  for (const auto& entry : fs::directory_iterator(crash_dir)) {
    auto input = ReadTensorProtoFile(entry.path() / "input_0.pb");
    ASSERT_TRUE(input.ok()) << input.error().ToString();
    kept.push_back(input->Elements<float>()[0]);
  }
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<float>{4, 5, 6}));
}

TEST(CrashDirConfigTest, ADirectoryThatCannotBeMadeStopsTheStartNamingIt) {
  ServeHome home;
  home.Write("not_a_directory", "a file");
  const std::pair<fs::path, const char*> cases[] = {
      {home.path() / "not_a_directory", "cannot be created: Not a directory"},
      {home.path() / "not_a_directory" / "below", "cannot be created"},
      {"/proc/backplane-crashes", "cannot be created"},
  };
  for (const auto& [path, why] : cases) {
    ServeConfig config = InProcessConfig(home);
    config.crash_dir = path;
    auto started = server::StartServer(config);
    ASSERT_FALSE(started.ok()) << path;
    EXPECT_THAT(started.error().message(), HasSubstr("crash_dir " + path.string() + ": " + why));
  }
  for (const char* text : {R"({"crash_dir": ""})", R"({"crash_dir": 5})"}) {
    ServeConfig config = server::DefaultServeConfig();
    Status applied = server::ApplyConfigText(text, "serve.json", config);
    EXPECT_THAT(applied.message(), HasSubstr("'crash_dir'")) << text;
  }
}

}  // namespace
}  // namespace backplane::testing::worker_observability
