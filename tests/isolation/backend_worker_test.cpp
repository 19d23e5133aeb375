// Backends in worker processes (issue 39): the real fixture backends run in
// backplane-backend-worker through the host's proxies; the worker dies every way native code
// dies (null write, abort, exit, stack overflow, endless loop, leak, kill -9 from outside) and
// the host sees it at once, says how, and is left without a descriptor, thread or child more.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <thread>

#include "backplane/core/crossing_time.hpp"
#include "backplane/isolation/backend_worker.hpp"
#include "backplane/isolation/isolated_backend.hpp"
#include "backplane/loader/sealed_image.hpp"
#include "sanitizer_build.hpp"
#include "test_util.hpp"

namespace backplane::isolation {
namespace {

using ::testing::HasSubstr;

constexpr int kCrashNullWrite = 9110, kCrashAbort = 9060, kCrashExitThree = 9030,
              kCrashExitZero = 9000, kCrashExitBrokenTeardown = 9031, kCrashLoop = 9090,
              kCrashLeak = 9120, kCrashStack = 9130;

OperatorDesc Identity(int64_t elements) {
  OperatorDesc op;
  op.op_type = "Identity";
  op.name = "copy";
  op.inputs = {TensorInfo{DataType::kFloat32, {elements}}};
  op.outputs = {TensorInfo{DataType::kFloat32, {elements}}};
  op.constant_inputs = {nullptr};
  return op;
}

// Identity then Identity: x -> y -> z.
SubgraphDesc TwoIdentities(int64_t elements) {
  const TensorInfo info{DataType::kFloat32, {elements}};
  return {.layers = {Identity(elements), Identity(elements)},
          .layer_inputs = {{"x"}, {"y"}},
          .layer_outputs = {{"y"}, {"z"}},
          .inputs = {"x"},
          .input_infos = {info},
          .outputs = {"z"},
          .output_infos = {info}};
}

int OpenDescriptors() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
    ++count;
  return count;
}

// A worker running one fixture backend, and an instance of it.
struct Isolated {
  std::promise<WorkerDeath> died;  // first: outlives the worker, whose monitor sets it
  std::shared_ptr<BackendWorker> worker;
  WorkerHello hello;
  std::unique_ptr<IBackend> backend;
};

std::unique_ptr<Isolated> StartIsolated(std::string_view fixture, WorkerOptions options = {}) {
  auto isolated = std::make_unique<Isolated>();
  auto image =
      loader::SealedImage::Read(std::filesystem::canonical(testing::Fixture(fixture)), "test");
  EXPECT_TRUE(image.ok()) << image.error().ToString();
  if (!image.ok())
    return nullptr;
  options.label = "backend from fixture " + std::string(fixture);
  auto* promise = &isolated->died;
  auto worker = BackendWorker::Start(
      options, image->fd(), [promise](const WorkerDeath& death) { promise->set_value(death); });
  EXPECT_TRUE(worker.ok()) << worker.error().ToString();
  if (!worker.ok())
    return nullptr;
  isolated->worker = std::move(worker).value();
  auto hello = Hello(*isolated->worker);
  EXPECT_TRUE(hello.ok()) << hello.error().ToString();
  if (!hello.ok())
    return nullptr;
  isolated->hello = *hello;
  auto backend = CreateIsolatedBackend(isolated->worker, isolated->hello);
  EXPECT_TRUE(backend.ok()) << backend.error().ToString();
  if (!backend.ok())
    return nullptr;
  isolated->backend = std::move(backend).value();
  return isolated;
}

// Runs `workload` on `values`; the outputs, or the error.
Result<std::vector<float>> Execute(IWorkload& workload, std::vector<float> values) {
  const TensorInfo info{DataType::kFloat32, {static_cast<int64_t>(values.size())}};
  std::vector<float> out(values.size(), -1.0f);
  const ConstTensorView inputs[] = {{info, values.data()}};
  const TensorView outputs[] = {{info, out.data()}};
  BACKPLANE_RETURN_IF_ERROR(workload.Execute(inputs, outputs));
  return out;
}

TEST(BackendWorkerTest, AnIsolatedBackendAnswersEverySdkCallAsInProcess) {
  auto isolated = StartIsolated("Valid");
  ASSERT_NE(isolated, nullptr);
  EXPECT_EQ(isolated->hello.backend_id, "TestValid");
  EXPECT_EQ(isolated->hello.api_version, kBackendApiVersion);
  EXPECT_EQ(isolated->hello.release, "1.2.3");
  IBackend& backend = *isolated->backend;
  EXPECT_EQ(backend.GetId(), "TestValid");
  EXPECT_TRUE(backend.IsSupported(Identity(4)).ok());
  OperatorDesc add = Identity(4);
  add.op_type = "Add";
  const Status refused = backend.IsSupported(add);
  EXPECT_EQ(refused.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(refused.message(), HasSubstr("runs Identity only, not Add"));

  auto workload = backend.CreateWorkload(Identity(5));
  ASSERT_TRUE(workload.ok()) << workload.error().ToString();
  auto out = Execute(**workload, {1, 2, 3, 4, 5});
  ASSERT_TRUE(out.ok()) << out.error().ToString();
  EXPECT_EQ(*out, (std::vector<float>{1, 2, 3, 4, 5}));

  // Options cross too: declared, updated all-or-nothing, read back, seen by Execute.
  const auto descriptors = backend.DescribeOptions();
  ASSERT_FALSE(descriptors.empty());
  EXPECT_EQ(descriptors[0].name, "verbose");
  ASSERT_TRUE(backend.UpdateOptions({{"execute_offset", 10.0}}).ok());
  EXPECT_EQ(std::get<double>(*backend.GetOption("execute_offset")), 10.0);
  out = Execute(**workload, {1, 2, 3, 4, 5});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, (std::vector<float>{11, 12, 13, 14, 15}));
  const Status unknown = backend.UpdateOptions({{"no_such_option", int64_t{1}}});
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), HasSubstr("no option 'no_such_option'"));
  EXPECT_EQ(backend.GetOption("missing").error().code(), StatusCode::kNotFound);

  // The context's hooks run in the worker (the fixture refuses to unload network 13).
  auto context = backend.CreateBackendContext();
  ASSERT_NE(context, nullptr);
  EXPECT_TRUE(context->BeforeLoadNetwork(13).ok());
  EXPECT_THAT(context->BeforeUnloadNetwork(13).message(), HasSubstr("never unloaded"));
  // A workload for a shape the backend refuses is refused with its message.
  OperatorDesc two_inputs = Identity(4);
  two_inputs.inputs.push_back(two_inputs.inputs[0]);
  two_inputs.constant_inputs.push_back(nullptr);
  EXPECT_THAT(backend.CreateWorkload(two_inputs).error().message(),
              HasSubstr("one FP32 input only"));
}

// SDK 1.3 crosses whole: the options go with the request, and what runs in the worker is the
// backend's own method (the proxy's defaults would have dropped the options, and the default
// CheckOptions knows no ranges).
TEST(BackendWorkerTest, TheSdk13CallsCrossWithTheirOptions) {
  auto isolated = StartIsolated("Valid");
  ASSERT_NE(isolated, nullptr);
  IBackend& backend = *isolated->backend;
  ASSERT_TRUE(backend.UpdateOptions({{"prepared_offset", 2.0}}).ok());
  auto with_options = backend.CreateWorkloadWithOptions(Identity(4), {{"prepared_offset", 5.0}});
  ASSERT_TRUE(with_options.ok()) << with_options.error().ToString();
  auto without = backend.CreateWorkload(Identity(4));
  ASSERT_TRUE(without.ok()) << without.error().ToString();
  EXPECT_EQ(Execute(**with_options, {1, 2, 3, 4}).value(), (std::vector<float>{6, 7, 8, 9}));
  EXPECT_EQ(Execute(**without, {1, 2, 3, 4}).value(), (std::vector<float>{3, 4, 5, 6}));

  const Status negative = backend.CheckOptions({{"limit", int64_t{-1}}});
  EXPECT_EQ(negative.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.message(), HasSubstr("option 'limit' must be 0 or more, got -1"));
  EXPECT_TRUE(backend.CheckOptions({{"limit", int64_t{3}}}).ok());
  // CheckOptions applies nothing.
  EXPECT_EQ(std::get<int64_t>(*backend.GetOption("limit")), 10);

  // TestValid compiles no subgraphs: its CompileSubgraphWithOptions (the SDK's default) declines.
  const SubgraphDesc subgraph = TwoIdentities(4);
  const auto declined = backend.CompileSubgraphWithOptions(subgraph, {{"prepared_offset", 5.0}});
  ASSERT_FALSE(declined.ok());
  EXPECT_EQ(declined.error().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(declined.error().message(), HasSubstr("compiles no subgraphs"));
}

// The host never sends a 1.3 call to a library built against 1.2 (BackendInstance gates on the
// version kHello reports); one that arrives anyway is refused by the worker, not called through a
// slot past the end of the library's vtable.
TEST(BackendWorkerTest, AWorkerNeverCallsAnSdk13MethodOnAnOlderLibrary) {
  auto isolated = StartIsolated("Api12");
  ASSERT_NE(isolated, nullptr);
  EXPECT_EQ(isolated->hello.api_version, (BackendApiVersion{1, 2}));
  IBackend& backend = *isolated->backend;
  const BackendOptions options{{"prepared_offset", 5.0}};
  const SubgraphDesc subgraph = TwoIdentities(4);
  const auto created = backend.CreateWorkloadWithOptions(Identity(4), options);
  const auto compiled = backend.CompileSubgraphWithOptions(subgraph, options);
  ASSERT_FALSE(created.ok());
  ASSERT_FALSE(compiled.ok());
  for (const auto& [refused, method] : {std::pair{created.error(), "CreateWorkloadWithOptions"},
                                        std::pair{compiled.error(), "CompileSubgraphWithOptions"},
                                        std::pair{backend.CheckOptions(options), "CheckOptions"}}) {
    EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << method;
    EXPECT_THAT(refused.message(), HasSubstr(std::string("backend TestApi12 was built against API "
                                                         "1.2, which has no ") +
                                             method));
  }
  EXPECT_FALSE(isolated->worker->dead());
  // The calls it has still work.
  auto workload = backend.CreateWorkload(Identity(4));
  ASSERT_TRUE(workload.ok()) << workload.error().ToString();
  EXPECT_EQ(Execute(**workload, {1, 2, 3, 4}).value(), (std::vector<float>{1, 2, 3, 4}));
}

// The same gate for 1.1: TestSubgraphApi10 reports 1.0 and its CompileSubgraph would answer
// wrongly, so a compile that reached it would succeed.
TEST(BackendWorkerTest, AWorkerNeverCompilesASubgraphOnA10Library) {
  auto isolated = StartIsolated("SubgraphApi10");
  ASSERT_NE(isolated, nullptr);
  EXPECT_EQ(isolated->hello.api_version, (BackendApiVersion{1, 0}));
  const auto compiled = isolated->backend->CompileSubgraph(TwoIdentities(4));
  ASSERT_FALSE(compiled.ok());
  EXPECT_EQ(compiled.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(compiled.error().message(),
              HasSubstr("backend TestSubgraphApi10 was built against API 1.0, which has no "
                        "CompileSubgraph"));
  EXPECT_FALSE(isolated->worker->dead());
}

// What a rollout leaves out of a sandboxed candidate's latency: the crossing, not the backend's
// own time (ValidSlow's Execute sleeps 5 ms in the worker).
TEST(BackendWorkerTest, AnExecuteCountsItsCrossingApartFromTheBackendsOwnTime) {
  auto isolated = StartIsolated("ValidSlow");
  ASSERT_NE(isolated, nullptr);
  auto workload = isolated->backend->CreateWorkload(Identity(4));
  ASSERT_TRUE(workload.ok()) << workload.error().ToString();
  for (int call = 0; call < 3; ++call) {
    const auto crossed_before = ThreadCrossingTime();
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(Execute(**workload, {1, 2, 3, 4}).ok());
    const auto wall = std::chrono::steady_clock::now() - start;
    const auto crossed = ThreadCrossingTime() - crossed_before;
    EXPECT_GT(crossed.count(), 0) << "call " << call;
    EXPECT_LE(crossed, wall - std::chrono::milliseconds(5)) << "call " << call;
  }
}

// A leak without memory_limit_bytes: the kernel's OOM killer is to take the worker, not the server.
TEST(BackendWorkerTest, TheOomKillerPrefersTheWorkerToTheServer) {
  auto isolated = StartIsolated("Valid");
  ASSERT_NE(isolated, nullptr);
  auto score_adj = [](const std::string& pid) {
    std::ifstream file("/proc/" + pid + "/oom_score_adj");
    int value = 0;
    file >> value;
    return value;
  };
  EXPECT_EQ(score_adj(std::to_string(isolated->worker->pid())), 1000);
}

TEST(BackendWorkerTest, ConcurrentCallsEachGetTheirOwnAnswer) {
  auto isolated = StartIsolated("Offset");
  ASSERT_NE(isolated, nullptr);
  auto workload = isolated->backend->CreateWorkload(Identity(64));
  ASSERT_TRUE(workload.ok());
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 6; ++c) {  // more callers than slots: some wait for one
    callers.emplace_back([&, c] {
      for (int i = 0; i < 300; ++i) {
        std::vector<float> in(64, static_cast<float>(c * 1000 + i));
        auto out = Execute(**workload, in);
        if (!out.ok() || (*out)[63] != in[63] + 1000.0f)
          ++wrong;
      }
    });
  }
  for (auto& caller : callers)
    caller.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(BackendWorkerTest, LargeTensorsCrossWholeAndOversizedOnesAreRefused) {
  WorkerOptions options;
  options.slot_bytes = std::size_t{8} << 20;
  auto isolated = StartIsolated("Valid", options);
  ASSERT_NE(isolated, nullptr);
  constexpr int64_t kElements = 900'000;  // 3.6 MB in, 3.6 MB out: fits 8 MiB
  auto workload = isolated->backend->CreateWorkload(Identity(kElements));
  ASSERT_TRUE(workload.ok());
  std::vector<float> in(kElements);
  std::mt19937 random(7);
  for (float& value : in)
    value = std::uniform_real_distribution<float>(-1, 1)(random);
  auto out = Execute(**workload, in);
  ASSERT_TRUE(out.ok()) << out.error().ToString();
  EXPECT_EQ(*out, in);
  auto big = isolated->backend->CreateWorkload(Identity(3'000'000));
  ASSERT_TRUE(big.ok());
  auto refused = Execute(**big, std::vector<float>(3'000'000, 1.0f));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.error().message(), HasSubstr("IWorkload::Execute needs more than"));
  EXPECT_FALSE(isolated->worker->dead());  // refused on the host's side
}

struct DeathCase {
  int mark;
  int signal;       // 0: an exit
  int exit_status;  // when it exited
  const char* says;
};

class WorkerDeathTest : public ::testing::TestWithParam<DeathCase> {};

TEST_P(WorkerDeathTest, TheHostSeesHowItDiedAndCallsFailNamingIt) {
  const DeathCase& death_case = GetParam();
  auto isolated = StartIsolated("Crash");
  ASSERT_NE(isolated, nullptr);
  auto workload = isolated->backend->CreateWorkload(Identity(4));
  ASSERT_TRUE(workload.ok());
  ASSERT_TRUE(Execute(**workload, {1, 2, 3, 4}).ok());
  auto died = isolated->died.get_future();
  const float mark = static_cast<float>(death_case.mark);
  auto crashed = Execute(**workload, {mark, 0, 0, 0});
  ASSERT_FALSE(crashed.ok());
  EXPECT_EQ(crashed.error().code(), StatusCode::kUnavailable);
  EXPECT_THAT(crashed.error().message(), HasSubstr("backend from fixture Crash runs in worker"));
  EXPECT_THAT(crashed.error().message(), HasSubstr(death_case.says));
  EXPECT_THAT(crashed.error().message(), HasSubstr("during IWorkload::Execute"));
  ASSERT_EQ(died.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const WorkerDeath death = died.get();
  EXPECT_EQ(death.signal, death_case.signal);
  if (death_case.signal == 0) {
    EXPECT_EQ(death.exit_status, death_case.exit_status);
  }
  // Every later call fails the same way, at once; proxies are destroyed without a worker.
  const Status later = isolated->backend->IsSupported(Identity(4));
  EXPECT_EQ(later.code(), StatusCode::kUnavailable);
  EXPECT_THAT(later.message(), HasSubstr(death_case.says));
}

INSTANTIATE_TEST_SUITE_P(
    EveryWay, WorkerDeathTest,
    ::testing::Values(DeathCase{kCrashNullWrite, SIGSEGV, 0, "was killed by signal 11 (SIGSEGV)"},
                      DeathCase{kCrashAbort, SIGABRT, 0, "was killed by signal 6 (SIGABRT)"},
                      DeathCase{kCrashExitThree, 0, 3, "exited with status 3"},
                      DeathCase{kCrashExitZero, 0, 0, "exited with status 0"},
                      // Its teardown would abort: the worker ends without running it.
                      DeathCase{kCrashExitBrokenTeardown, 0, 3, "exited with status 3"},
                      DeathCase{kCrashStack, SIGSEGV, 0, "was killed by signal 11 (SIGSEGV)"}),
    [](const auto& info) { return "Mark" + std::to_string(info.param.mark); });

// Every slot's call exits at once: glibc's exit, run twice concurrently, frees its handler list
// twice (an abort under AddressSanitizer, seen in CI); the worker's own exit ends it with the
// status, whichever call comes first. Ten workers, to give the race its chances (three under
// ThreadSanitizer, where each takes a second to start).
TEST(BackendWorkerTest, ExitsFromEverySlotAtOnceEndTheWorkerWithTheirStatus) {
#ifdef BACKPLANE_TSAN_BUILD
  constexpr int kRounds = 3;
#else
  constexpr int kRounds = 10;
#endif
  for (int round = 0; round < kRounds; ++round) {
    auto isolated = StartIsolated("Crash");
    ASSERT_NE(isolated, nullptr);
    auto died = isolated->died.get_future();
    std::vector<std::unique_ptr<IWorkload>> workloads;
    for (int slot = 0; slot < 4; ++slot) {
      auto workload = isolated->backend->CreateWorkload(Identity(4));
      ASSERT_TRUE(workload.ok());
      workloads.push_back(std::move(workload).value());
    }
    std::atomic<int> ready{0};
    std::vector<std::future<Status>> calls;
    for (auto& workload : workloads) {
      calls.push_back(std::async(std::launch::async, [&ready, &workload] {
        ++ready;
        while (ready.load() < 4) {
        }
        auto out = Execute(*workload, {static_cast<float>(kCrashExitThree), 0, 0, 0});
        return out.ok() ? Status::Ok() : out.error();
      }));
    }
    for (auto& call : calls) {
      const Status status = call.get();
      EXPECT_THAT(status.message(), HasSubstr("exited with status 3")) << "round " << round;
    }
    ASSERT_EQ(died.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    const WorkerDeath death = died.get();
    EXPECT_EQ(death.signal, 0) << death.how << ", round " << round;
    EXPECT_EQ(death.exit_status, 3) << death.how << ", round " << round;
  }
}

TEST(BackendWorkerTest, ACallPastTheTimeoutKillsTheWorkerAndSaysSo) {
  WorkerOptions options;
  options.call_timeout = std::chrono::milliseconds(300);
  auto isolated = StartIsolated("Crash", options);
  ASSERT_NE(isolated, nullptr);
  auto workload = isolated->backend->CreateWorkload(Identity(4));
  ASSERT_TRUE(workload.ok());
  const auto start = std::chrono::steady_clock::now();
  auto hung = Execute(**workload, {static_cast<float>(kCrashLoop), 0, 0, 0});
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(hung.ok());
  EXPECT_THAT(hung.error().message(), HasSubstr("was killed by signal 9 (SIGKILL)"));
  EXPECT_THAT(hung.error().message(),
              HasSubstr("IWorkload::Execute ran past the worker's call timeout of 300 ms"));
  EXPECT_GE(took, std::chrono::milliseconds(300));
  EXPECT_LT(took, std::chrono::seconds(5));
}

TEST(BackendWorkerTest, AWorkerPastItsMemoryLimitIsKilledAndSaysSo) {
  WorkerOptions options;
  options.memory_limit_bytes = std::size_t{200} << 20;
  auto isolated = StartIsolated("Crash", options);
  ASSERT_NE(isolated, nullptr);
  auto workload = isolated->backend->CreateWorkload(Identity(4));
  ASSERT_TRUE(workload.ok());
  Status last;
  for (int i = 0; i < 40 && last.ok(); ++i) {  // 64 MiB more each time
    auto out = Execute(**workload, {static_cast<float>(kCrashLeak), 0, 0, 0});
    last = out.ok() ? Status::Ok() : out.error();
    if (last.ok())
      std::this_thread::sleep_for(std::chrono::milliseconds(60));  // the monitor looks every 50
  }
  ASSERT_FALSE(last.ok()) << "never killed";
  EXPECT_THAT(last.message(), HasSubstr("passed memory_limit_bytes 209715200"));
}

TEST(BackendWorkerTest, AWorkerKilledFromOutsideIsSeenAtOnce) {
  auto isolated = StartIsolated("Valid");
  ASSERT_NE(isolated, nullptr);
  auto died = isolated->died.get_future();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(isolated->worker->pid(), SIGKILL), 0);
  ASSERT_EQ(died.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const auto seen = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(died.get().signal, SIGKILL);
  EXPECT_LT(seen, std::chrono::milliseconds(500));
  EXPECT_EQ(isolated->backend->IsSupported(Identity(4)).code(), StatusCode::kUnavailable);
}

TEST(BackendWorkerTest, ALibraryTheWorkerCannotLoadIsRefusedNamingWhy) {
  auto image = loader::SealedImage::Read(
      std::filesystem::canonical(testing::Fixture("MissingSymbol")), "test");
  ASSERT_TRUE(image.ok()) << image.error().ToString();
  auto worker = BackendWorker::Start({.label = "missing symbol"}, image->fd());
  ASSERT_TRUE(worker.ok());
  auto hello = Hello(**worker);
  ASSERT_FALSE(hello.ok());
  EXPECT_EQ(hello.error().reason(), LoadReason::kDlopenFailed);
  EXPECT_THAT(hello.error().message(), HasSubstr("undefined symbol"));
}

TEST(BackendWorkerTest, AMissingWorkerExecutableIsAClearError) {
  auto image =
      loader::SealedImage::Read(std::filesystem::canonical(testing::Fixture("Valid")), "test");
  ASSERT_TRUE(image.ok());
  auto worker =
      BackendWorker::Start({.executable = "/nonexistent/backplane-backend-worker"}, image->fd());
  ASSERT_FALSE(worker.ok());
  EXPECT_THAT(worker.error().message(),
              HasSubstr("/nonexistent/backplane-backend-worker cannot be run"));
}

// Crashes and restarts in a row leave the host as it was: no descriptor, thread, child or
// mapping more.
TEST(BackendWorkerTest, RepeatedCrashesLeakNothingInTheHost) {
  constexpr int kRounds = 100;
  auto crash_once = [] {
    auto isolated = StartIsolated("Crash");
    ASSERT_NE(isolated, nullptr);
    auto workload = isolated->backend->CreateWorkload(Identity(4));
    ASSERT_TRUE(workload.ok());
    ASSERT_FALSE(Execute(**workload, {static_cast<float>(kCrashNullWrite), 0, 0, 0}).ok());
  };
  // The first round starts what a process starts once (ThreadSanitizer's background thread at
  // the first fork, loggers): the baseline is taken after it.
  crash_once();
  const int descriptors = OpenDescriptors();
  const int threads = testing::SettledThreadCount();
  for (int round = 0; round < kRounds; ++round) {
    crash_once();
    if (HasFatalFailure())
      return;
  }
  EXPECT_EQ(OpenDescriptors(), descriptors);
  EXPECT_EQ(testing::SettledThreadCount(), threads);
  // Every worker was reaped: no child left, zombie or not.
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

}  // namespace
}  // namespace backplane::isolation
