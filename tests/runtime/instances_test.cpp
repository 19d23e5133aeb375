// A network's limit on executions at once (NetworkOptions::instances). Overlap is read from the
// executions themselves: the Slow fixtures take 30 ms and add to each output how many of their
// library's executions were running as it entered, so the outputs' maximum is the most that ever
// overlapped. Every such test also runs a network without a limit beside it, which must be seen
// overlapping: a harness that could not see overlap fails instead of passing. The Gated fixture
// holds executions in a function of the test, for what must not depend on timing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <latch>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backplane/runtime/runtime.hpp"
#include "runtime/swap_test_util.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using AsyncResult = std::future<Result<std::vector<Tensor>>>;

// x -> Identity -> y on FP32[4]: one execution of the fixture per request.
Network OneIdentityLayer() {
  const TensorInfo info{DataType::kFloat32, {4}};
  Network network{.name = "one_layer"};
  network.inputs = {{"x", info}};
  network.outputs = {{"y", info}};
  network.nodes = {{.name = "copy", .op_type = "Identity", .inputs = {"x"}, .outputs = {"y"}}};
  network.values = {{"x", info}, {"y", info}};
  return network;
}

std::vector<Tensor> ZeroInputs() {
  Tensor input(TensorInfo{DataType::kFloat32, {4}});
  for (float& value : input.Elements<float>())
    value = 0.0f;
  std::vector<Tensor> inputs;
  inputs.push_back(std::move(input));
  return inputs;
}

// The most overlapping executions the Slow fixtures reported, over every request recorded.
class OverlapSeen {
 public:
  void Record(const Result<std::vector<Tensor>>& outputs) {
    if (!outputs.ok()) {
      failed_.fetch_add(1);
      return;
    }
    const int seen = static_cast<int>(outputs.value().at(0).Elements<float>()[0]);
    int most = most_.load();
    while (seen > most && !most_.compare_exchange_weak(most, seen)) {
    }
  }
  int most() const { return most_.load(); }
  int failed() const { return failed_.load(); }

 private:
  std::atomic<int> most_{0};
  std::atomic<int> failed_{0};
};

// `callers` threads, released together, each making `rounds` synchronous requests of `network`.
void ExecuteFromThreads(Runtime& runtime, NetworkId network, int callers, int rounds,
                        std::latch& start, OverlapSeen& seen, std::vector<std::thread>& threads) {
  for (int i = 0; i < callers; ++i) {
    threads.emplace_back([&runtime, network, rounds, &start, &seen] {
      const auto inputs = ZeroInputs();
      const ConstTensorView view = inputs[0].View();
      start.arrive_and_wait();
      for (int round = 0; round < rounds; ++round)
        seen.Record(runtime.Execute(network, std::span(&view, 1)));
    });
  }
}

// Where the Gated fixture's executions wait until the test opens it.
class ExecutionGate {
 public:
  void Enter() {
    std::unique_lock lock(mutex_);
    ++entered_;
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_; });
  }
  void Open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  int entered() const {
    std::lock_guard lock(mutex_);
    return entered_;
  }
  // Whether `count` executions entered within 20 s.
  bool AwaitEntered(int count) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(20), [&] { return entered_ >= count; });
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  int entered_ = 0;
  bool open_ = false;
};

ExecutionGate* execution_gate = nullptr;  // the running test's
void EnterExecutionGate() {
  execution_gate->Enter();
}

class InstancesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"Slow", "SlowOther", "Gated", "Valid"})
      fs::create_symlink(testing::Fixture(name),
                         dir_ / ("Test_" + std::string(name) + "_backend.so"));
    execution_gate = &gate_;
    const auto callback = reinterpret_cast<std::uintptr_t>(&EnterExecutionGate);
    ASSERT_EQ(setenv("FIXTURE_EXECUTE_CALLBACK", std::to_string(callback).c_str(), 1), 0);
  }
  // The gate opens before the runtime goes, or its destructor would wait for held executions.
  void TearDown() override {
    gate_.Open();
    runtime_.reset();
    unsetenv("FIXTURE_EXECUTE_CALLBACK");
    execution_gate = nullptr;
  }

  Runtime& MakeRuntime(scheduler::SchedulerOptions scheduler = {.max_threads = 4}) {
    auto runtime =
        Runtime::Create({.backend_paths = std::vector{dir_.path()}, .scheduler = scheduler});
    EXPECT_TRUE(runtime.ok()) << runtime.error().ToString();
    runtime_ = std::move(runtime).value();
    return *runtime_;
  }
  NetworkId Load(std::string backend, std::size_t instances) {
    auto id = runtime_->LoadNetwork(
        OneIdentityLayer(), {.backend_preferences = {std::move(backend)}, .instances = instances});
    EXPECT_TRUE(id.ok()) << id.error().ToString();
    return id.ok() ? id.value() : 0;
  }
  AsyncResult Submit(NetworkId network,
                     std::optional<scheduler::Clock::time_point> deadline = std::nullopt) {
    return runtime_->ExecuteAsync(network, ZeroInputs(), deadline);
  }
  static bool Ready(AsyncResult& result) {
    return result.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

  testing::TempDir dir_;
  ExecutionGate gate_;
  std::unique_ptr<Runtime> runtime_;
};

TEST_F(InstancesTest, OneInstanceRunsSynchronousRequestsOneAtATimeBesideAnUnlimitedNetwork) {
  Runtime& runtime = MakeRuntime();
  const NetworkId limited = Load("TestSlow", 1);
  const NetworkId unlimited = Load("TestSlowOther", 0);
  OverlapSeen on_limited;
  OverlapSeen on_unlimited;
  std::latch start(8);
  std::vector<std::thread> threads;
  ExecuteFromThreads(runtime, limited, 4, 3, start, on_limited, threads);
  ExecuteFromThreads(runtime, unlimited, 4, 3, start, on_unlimited, threads);
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(on_limited.failed() + on_unlimited.failed(), 0);
  EXPECT_EQ(on_limited.most(), 1) << "executions of the network with one instance overlapped";
  EXPECT_GE(on_unlimited.most(), 2) << "the harness saw no overlap where nothing limits it";
  EXPECT_EQ(runtime.GetNetworkInstances(limited).value().running, 0u);
}

TEST_F(InstancesTest, OneInstanceRunsAsynchronousRequestsOneAtATimeBesideAnUnlimitedNetwork) {
  MakeRuntime({.max_threads = 4});
  const NetworkId limited = Load("TestSlow", 1);
  const NetworkId unlimited = Load("TestSlowOther", 0);
  std::vector<AsyncResult> on_limited;
  std::vector<AsyncResult> on_unlimited;
  for (int i = 0; i < 6; ++i) {
    on_limited.push_back(Submit(limited));
    on_unlimited.push_back(Submit(unlimited));
  }
  OverlapSeen limited_seen;
  OverlapSeen unlimited_seen;
  for (auto& result : on_limited)
    limited_seen.Record(result.get());
  for (auto& result : on_unlimited)
    unlimited_seen.Record(result.get());
  EXPECT_EQ(limited_seen.failed() + unlimited_seen.failed(), 0);
  EXPECT_EQ(limited_seen.most(), 1);
  EXPECT_GE(unlimited_seen.most(), 2);
}

// Synchronous and asynchronous requests wait in one queue: together never more than two run, and
// two do (the network is never held to one by accident).
TEST_F(InstancesTest, TwoInstancesRunAtMostTwoAtOnceSynchronousAndAsynchronousTogether) {
  Runtime& runtime = MakeRuntime({.max_threads = 4});
  const NetworkId limited = Load("TestSlow", 2);
  const NetworkId unlimited = Load("TestSlowOther", 0);
  OverlapSeen on_limited;
  OverlapSeen on_unlimited;
  std::latch start(7);
  std::vector<std::thread> threads;
  ExecuteFromThreads(runtime, limited, 3, 2, start, on_limited, threads);
  ExecuteFromThreads(runtime, unlimited, 3, 2, start, on_unlimited, threads);
  start.arrive_and_wait();
  std::vector<AsyncResult> queued;
  for (int i = 0; i < 4; ++i)
    queued.push_back(Submit(limited));
  for (auto& thread : threads)
    thread.join();
  for (auto& result : queued)
    on_limited.Record(result.get());
  EXPECT_EQ(on_limited.failed() + on_unlimited.failed(), 0);
  EXPECT_EQ(on_limited.most(), 2);
  EXPECT_GE(on_unlimited.most(), 2);
}

// Two arena threads: one runs the held execution; had the two requests waiting for the network's
// one instance each taken a thread to wait on, the other network's request could never run
// until the gate opens.
TEST_F(InstancesTest, AnAsynchronousRequestWaitingForItsTurnHoldsNoArenaThread) {
  Runtime& runtime = MakeRuntime({.max_threads = 2});
  const NetworkId gated = Load("TestGated", 1);
  const NetworkId other = Load("TestValid", 0);
  AsyncResult held = Submit(gated);
  ASSERT_TRUE(gate_.AwaitEntered(1));
  AsyncResult second = Submit(gated);
  AsyncResult third = Submit(gated);
  const auto counts = runtime.GetNetworkInstances(gated).value();
  EXPECT_EQ(counts.limit, 1u);
  EXPECT_EQ(counts.running, 1u);
  EXPECT_EQ(counts.waiting, 2u);

  AsyncResult beside = Submit(other);
  ASSERT_EQ(beside.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_TRUE(beside.get().ok());
  EXPECT_EQ(gate_.entered(), 1) << "a waiting request ran";
  EXPECT_FALSE(Ready(second));

  gate_.Open();
  EXPECT_TRUE(held.get().ok());
  EXPECT_TRUE(second.get().ok());
  EXPECT_TRUE(third.get().ok());
  EXPECT_EQ(gate_.entered(), 3);
}

TEST_F(InstancesTest, AWaitingRequestWhoseDeadlinePassesFailsWithoutRunning) {
  Runtime& runtime = MakeRuntime();
  const NetworkId gated = Load("TestGated", 1);
  AsyncResult held = Submit(gated);
  ASSERT_TRUE(gate_.AwaitEntered(1));
  const auto deadline = scheduler::Clock::now() + std::chrono::milliseconds(20);
  AsyncResult expiring = Submit(gated, deadline);
  AsyncResult after = Submit(gated);  // behind it, without a deadline
  EXPECT_EQ(runtime.GetNetworkInstances(gated).value().waiting, 2u);
  while (scheduler::Clock::now() <= deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));

  gate_.Open();
  EXPECT_TRUE(held.get().ok());
  auto expired = expiring.get();
  ASSERT_FALSE(expired.ok());
  EXPECT_EQ(expired.error().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(expired.error().message(), HasSubstr("while it waited for one of its network's 1 "
                                                   "instance(s); it was not run"));
  EXPECT_TRUE(after.get().ok()) << "the expired request's turn went to the next";
  EXPECT_EQ(gate_.entered(), 2) << "the expired request ran";
  EXPECT_TRUE(testing::WaitFor([&] { return runtime.GetNetworkInstances(gated)->running == 0; }));
}

TEST_F(InstancesTest, WaitingRequestsCountAmongTheRequestsInFlight) {
  Runtime& runtime = MakeRuntime({.max_threads = 2, .max_in_flight = 3});
  const NetworkId gated = Load("TestGated", 1);
  AsyncResult held = Submit(gated);
  ASSERT_TRUE(gate_.AwaitEntered(1));
  AsyncResult second = Submit(gated);
  AsyncResult third = Submit(gated);
  auto refused = Submit(gated).get();  // a refusal answers at once
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(runtime.GetNetworkInstances(gated).value().waiting, 2u);
  gate_.Open();
  EXPECT_TRUE(held.get().ok());
  EXPECT_TRUE(second.get().ok());
  EXPECT_TRUE(third.get().ok());
}

// The limit is the network's: a request on the binding an option update made waits for the turn
// an execution on the old binding still holds. Raising the limit starts it at once.
TEST_F(InstancesTest, TheLimitHoldsAcrossARepreparationAndChangesAtRunTime) {
  Runtime& runtime = MakeRuntime();
  const NetworkId gated = Load("TestGated", 1);
  AsyncResult on_old_binding = Submit(gated);
  ASSERT_TRUE(gate_.AwaitEntered(1));
  ASSERT_TRUE(runtime.UpdateNetworkOptions(gated, "TestGated", {{"prepared_offset", 1.0}}).ok());
  AsyncResult on_new_binding = Submit(gated);
  EXPECT_EQ(runtime.GetNetworkInstances(gated).value().waiting, 1u);

  ASSERT_TRUE(runtime.SetNetworkInstances(gated, 2).ok());
  EXPECT_TRUE(gate_.AwaitEntered(2)) << "a raised limit starts the waiting request";
  const auto counts = runtime.GetNetworkInstances(gated).value();
  EXPECT_EQ(counts.limit, 2u);
  EXPECT_EQ(counts.running, 2u);
  EXPECT_EQ(counts.waiting, 0u);

  gate_.Open();
  EXPECT_EQ(on_old_binding.get().value().at(0).Elements<float>()[0], 0.0f);
  EXPECT_EQ(on_new_binding.get().value().at(0).Elements<float>()[0], 1.0f);
  EXPECT_EQ(runtime.GetNetworkInstances(99).error().code(), StatusCode::kNotFound);
  EXPECT_EQ(runtime.SetNetworkInstances(99, 1).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace backplane
