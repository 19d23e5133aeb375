// Issue 10: every lifecycle operation at once, at random, from many threads, while requests run.
// Eight workers publish new versions, reload, roll back, pin, unpin, change options and load and
// unload networks for BACKPLANE_STRESS_SECONDS (by default 40 under TSan, 15 under ASan, 5
// otherwise: see StressDuration); two threads run requests on one network the whole time, and a
// health thread asks the registry and the runtime what they offer.
// No request may fail or mix generations, health must answer within a second, and at the end
// nothing but the active generation may be left in the process. Most useful under TSan.
//
// There is no watcher here: a worker that publishes calls Rescan() itself, so that the registry's
// change sequence is driven from eight threads instead of one loop thread.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backplane/runtime/runtime.hpp"
#include "runtime/swap_test_util.hpp"
#include "sanitizer_build.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using Action = DeployOutcome::Action;
using SteadyClock = std::chrono::steady_clock;
using testing::kNextOffset;
using testing::TempDir;

constexpr std::string_view kId = "TestValid";
constexpr std::string_view kFileName = "Test_Valid_backend.so";
constexpr int kWorkers = 8;
constexpr int kInferenceThreads = 2;
constexpr std::size_t kMaxExtraNetworks = 8;
constexpr auto kHealthPeriod = std::chrono::milliseconds(10);
constexpr auto kHealthDeadline = std::chrono::seconds(1);
constexpr std::size_t kProblemsKept = 20;

// What a worker does; each is picked with the weight beside it.
enum class Operation { kPublish, kReload, kRollback, kPin, kUnpin, kOptions, kLoad, kUnload };
struct OperationInfo {
  Operation operation;
  std::string_view name;
  int weight;
};
constexpr std::array kOperations = {
    OperationInfo{Operation::kPublish, "publish+rescan", 3},
    OperationInfo{Operation::kReload, "reload", 2},
    OperationInfo{Operation::kRollback, "rollback", 2},
    OperationInfo{Operation::kPin, "pin", 1},
    OperationInfo{Operation::kUnpin, "unpin", 1},
    OperationInfo{Operation::kOptions, "options", 2},
    OperationInfo{Operation::kLoad, "load network", 2},
    OperationInfo{Operation::kUnload, "unload network", 2},
};

std::chrono::seconds StressDuration() {
  if (const char* text = std::getenv("BACKPLANE_STRESS_SECONDS")) {
    char* end = nullptr;
    const long seconds = std::strtol(text, &end, 10);
    if (end != text && *end == '\0' && seconds > 0)
      return std::chrono::seconds(seconds);
  }
  // It runs alone (RUN_SERIAL: one of CI's two cores idles meanwhile), once per preset. Races are
  // what it hunts, and only TSan sees them; ASan sees a generation used after its unload; a
  // release build sees only a failed request or a leftover generation, which the sanitizer runs
  // of the same operations would show too. CI's time goes mostly to TSan, then; for hours of it,
  // BACKPLANE_STRESS_SECONDS=3600 build/tsan/bin/backplane_runtime_stress_tests.
#if defined(BACKPLANE_TSAN_BUILD)
  return std::chrono::seconds(40);
#elif defined(BACKPLANE_ASAN_BUILD)
  return std::chrono::seconds(15);
#else
  return std::chrono::seconds(5);
#endif
}

// BACKPLANE_STRESS_SEED replays a run's choices (not its interleavings).
uint64_t StressSeed() {
  if (const char* text = std::getenv("BACKPLANE_STRESS_SEED"))
    return std::strtoull(text, nullptr, 10);
  return std::random_device{}();
}

// Empty when the request succeeded wholly on one generation: every element 0 above the input
// (Valid) or 2 * kNextOffset (ValidNext). Otherwise what went wrong.
std::string CheckInference(Runtime& runtime, NetworkId network, float& offset) {
  const std::vector<float> input(4, 5.0f);
  const ConstTensorView view{{DataType::kFloat32, {4}}, input.data()};
  auto outputs = runtime.Execute(network, std::span(&view, 1));
  if (!outputs.ok())
    return "network " + std::to_string(network) + " failed: " + outputs.error().ToString();
  std::string values;
  bool consistent = true;
  for (float value : outputs.value().at(0).Elements<float>()) {
    offset = value - 5.0f;
    consistent &= offset == 0.0f || offset == 2 * kNextOffset;
    values += std::to_string(offset) + " ";
  }
  if (!consistent)
    return "network " + std::to_string(network) + " mixed generations, offsets: " + values;
  return "";
}

std::string Answer(const Status& status) {
  return status.ok() ? "ok" : std::string(status.name());
}

// "activated", "rejected PREPARE_FAILED"...
std::string Answer(const DeployOutcome& outcome) {
  std::string answer(ToString(outcome.action));
  if (!outcome.error.ok())
    answer += " " + std::string(outcome.error.name());
  return answer;
}

// A change that a runtime kept invalidating (options, loads) gives up after a few attempts and
// says "try again": a legitimate answer under this load, not a defect.
bool KeptChanging(const Status& error) {
  return error.reason() == LoadReason::kPrepareFailed &&
         error.message().find("kept changing") != std::string::npos;
}

// Publishes only complete files (write + rename): no deploy of a good file may be rejected
// except for a runtime that kept changing; the file is never deleted, so never withdrawn.
bool Legitimate(const DeployOutcome& outcome) {
  switch (outcome.action) {
    case Action::kUnchanged:
    case Action::kActivated:
    case Action::kPinned:
    case Action::kDeferred:
      return true;
    case Action::kRejected:
      return KeptChanging(outcome.error);
    case Action::kWithdrawn:
    case Action::kCandidate:  // the immediate policy never makes one
      return false;
  }
  return false;
}

// Per operation: how often each answer came back, and the slowest call.
struct OperationTally {
  std::map<std::string, int64_t> answers;
  SteadyClock::duration slowest{};
};
using Tally = std::array<OperationTally, kOperations.size()>;

// Sets the process's log level for a scope: thousands of swaps would log a line each.
class LogLevelScope {
 public:
  explicit LogLevelScope(spdlog::level::level_enum level) : previous_(spdlog::get_level()) {
    spdlog::set_level(level);
  }
  ~LogLevelScope() { spdlog::set_level(previous_); }
  LogLevelScope(const LogLevelScope&) = delete;
  LogLevelScope& operator=(const LogLevelScope&) = delete;

 private:
  spdlog::level::level_enum previous_;
};

class StressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    valid_ = testing::Fixture("Valid");
    valid_next_ = testing::Fixture("ValidNext");
    auto loader = loader::Loader::Create({.shadow_root = shadow_root_.path()});
    ASSERT_TRUE(loader.ok()) << loader.error().ToString();
    loader_ = std::move(loader).value();
    Publish(valid_, "setup");
    // Only complete files are published: nothing is ever taken for one still being written.
    auto registry = BackendRegistry::Create({.backend_paths = std::vector{dir_.path()},
                                             .loader = loader_,
                                             .settle_time = std::chrono::milliseconds(0)});
    ASSERT_TRUE(registry.ok()) << registry.error().ToString();
    registry_ = std::move(registry).value();
    auto runtime = Runtime::Create({.registry = registry_, .swap_policy = SwapPolicy::kMigrate});
    ASSERT_TRUE(runtime.ok()) << runtime.error().ToString();
    runtime_ = std::move(runtime).value();
    auto network = runtime_->LoadNetwork(testing::TwoLayerIdentityNetwork());
    ASSERT_TRUE(network.ok()) << network.error().ToString();
    served_network_ = network.value();
  }

  // The safe publish: a finished file under a temporary name of the worker's own, renamed over
  // the backend's name.
  void Publish(const fs::path& fixture, std::string_view writer) {
    const fs::path temporary = dir_ / (".incoming-" + std::string(writer));
    testing::CopyFile(fixture, temporary);
    fs::rename(temporary, dir_ / kFileName);
  }

  void Problem(std::string what) {
    std::lock_guard lock(problems_mutex_);
    ++problem_count_;
    if (problems_.size() < kProblemsKept)
      problems_.push_back(std::move(what));
  }

  // Returns the answer to tally; reports the ones that are not legitimate as problems.
  std::string RunOperation(Operation operation, int worker, std::mt19937_64& random) {
    switch (operation) {
      case Operation::kPublish: {
        const bool next = publishes_.fetch_add(1) % 2 == 0;
        Publish(next ? valid_next_ : valid_, "worker" + std::to_string(worker));
        const RescanResult rescan = registry_->Rescan();
        if (rescan.outcomes.empty())
          return "nothing new (another rescan took it)";
        std::string answers;
        for (const auto& outcome : rescan.outcomes) {
          if (!Legitimate(outcome))
            Problem("rescan: " + outcome.message + " " + outcome.error.ToString());
          answers += (answers.empty() ? "" : ", ") + Answer(outcome);
        }
        return answers;
      }
      case Operation::kReload: {
        auto outcome = registry_->Reload(kId);
        if (!outcome.ok()) {
          Problem("reload: " + outcome.error().ToString());
          return Answer(outcome.error());
        }
        if (!Legitimate(outcome.value()))
          Problem("reload: " + outcome.value().message);
        return Answer(outcome.value());
      }
      case Operation::kRollback: {
        auto rolled_back = registry_->Rollback(kId);
        if (rolled_back.ok())
          return "ok";
        const Status& error = rolled_back.error();
        const bool nothing_to_roll_back_to =
            error.code() == StatusCode::kFailedPrecondition && !error.reason() &&
            error.message().find("no previous generation") != std::string::npos;
        if (!nothing_to_roll_back_to && !KeptChanging(error))
          Problem("rollback: " + error.ToString());
        return Answer(error);
      }
      case Operation::kPin: {
        const Status pinned = registry_->Pin(kId);
        if (!pinned.ok())
          Problem("pin: " + pinned.ToString());
        return Answer(pinned);
      }
      case Operation::kUnpin: {
        auto outcome = registry_->Unpin(kId);
        if (!outcome.ok()) {
          Problem("unpin: " + outcome.error().ToString());
          return Answer(outcome.error());
        }
        if (!Legitimate(outcome.value()))
          Problem("unpin: " + outcome.value().message);
        return Answer(outcome.value());
      }
      case Operation::kOptions: {
        BackendOptions changes;
        switch (random() % 3) {
          case 0:
            changes = {{"limit", static_cast<int64_t>(random() % 1000)}};
            break;
          case 1:
            changes = {{"scale", static_cast<double>(random() % 100) / 10.0}};
            break;
          default:
            changes = {{"label", "worker" + std::to_string(worker)}};
        }
        const Status updated = runtime_->UpdateBackendOptions(kId, changes);
        if (!updated.ok())
          Problem("options: " + updated.ToString());
        return Answer(updated);
      }
      case Operation::kLoad: {
        {
          std::lock_guard lock(extra_mutex_);
          if (extra_networks_.size() >= kMaxExtraNetworks)
            return "skipped (enough loaded)";
        }
        auto network = runtime_->LoadNetwork(testing::TwoLayerIdentityNetwork());
        if (!network.ok()) {
          Problem("load: " + network.error().ToString());
          return Answer(network.error());
        }
        // Nobody else knows it yet: its first request must succeed like any other.
        float offset = 0;
        if (std::string problem = CheckInference(*runtime_, network.value(), offset);
            !problem.empty()) {
          Problem("first request of a new network: " + problem);
        }
        std::lock_guard lock(extra_mutex_);
        extra_networks_.push_back(network.value());
        return "ok";
      }
      case Operation::kUnload: {
        NetworkId network;
        {
          std::lock_guard lock(extra_mutex_);
          if (extra_networks_.empty())
            return "skipped (none loaded)";
          const auto it = extra_networks_.begin() + random() % extra_networks_.size();
          network = *it;
          extra_networks_.erase(it);
        }
        const Status unloaded = runtime_->UnloadNetwork(network);
        if (unloaded.ok())
          return "ok";
        // The fixture's context refuses network 13, to show a refusal: it stays loaded.
        if (network == 13 && unloaded.code() == StatusCode::kFailedPrecondition) {
          std::lock_guard lock(extra_mutex_);
          refused_networks_.push_back(network);
          return "refused (network 13)";
        }
        Problem("unload: " + unloaded.ToString());
        return Answer(unloaded);
      }
    }
    return "?";
  }

  void RunWorker(int worker, uint64_t seed, Tally& tally) {
    std::mt19937_64 random(seed + static_cast<uint64_t>(worker));
    std::vector<int> weights;
    for (const auto& info : kOperations)
      weights.push_back(info.weight);
    std::discrete_distribution<std::size_t> pick(weights.begin(), weights.end());
    while (!stop_.load()) {
      const std::size_t index = pick(random);
      const auto started = SteadyClock::now();
      std::string answer = RunOperation(kOperations[index].operation, worker, random);
      auto& operation = tally[index];
      operation.slowest = std::max(operation.slowest, SteadyClock::now() - started);
      ++operation.answers[std::move(answer)];
    }
  }

  void RunInference() {
    while (!stop_.load()) {
      float offset = 0;
      std::string problem = CheckInference(*runtime_, served_network_, offset);
      if (!problem.empty()) {
        ++failed_inferences_;
        Problem("inference: " + problem);
      } else {
        ++(offset == 0.0f ? served_by_valid_ : served_by_next_);
      }
    }
  }

  void RunHealth() {
    while (!stop_.load()) {
      const auto started = SteadyClock::now();
      const auto backends = registry_->Describe();
      const auto ids = runtime_->BackendIds();
      const auto latency = SteadyClock::now() - started;
      health_max_latency_ = std::max(health_max_latency_, latency);
      ++health_polls_;
      const bool described =
          std::any_of(backends.begin(), backends.end(), [](const BackendStatus& backend) {
            return backend.id == kId && backend.active_generation != 0;
          });
      if (!described || std::find(ids.begin(), ids.end(), kId) == ids.end())
        Problem("health: backend " + std::string(kId) + " missing from Describe or BackendIds");
      std::this_thread::sleep_for(kHealthPeriod);
    }
  }

  TempDir shadow_root_;
  TempDir dir_;
  fs::path valid_;
  fs::path valid_next_;
  std::shared_ptr<loader::Loader> loader_;
  std::shared_ptr<BackendRegistry> registry_;
  std::unique_ptr<Runtime> runtime_;
  NetworkId served_network_ = 0;

  std::atomic<bool> stop_{false};
  std::atomic<int64_t> publishes_{0};
  std::mutex extra_mutex_;
  std::vector<NetworkId> extra_networks_;    // guarded by extra_mutex_
  std::vector<NetworkId> refused_networks_;  // guarded by extra_mutex_

  std::atomic<int64_t> failed_inferences_{0};
  std::atomic<int64_t> served_by_valid_{0};
  std::atomic<int64_t> served_by_next_{0};
  SteadyClock::duration health_max_latency_{};  // written by the health thread, read after join
  int64_t health_polls_ = 0;

  std::mutex problems_mutex_;
  std::vector<std::string> problems_;  // the first kProblemsKept, guarded by problems_mutex_
  int64_t problem_count_ = 0;          // guarded by problems_mutex_
};

TEST_F(StressTest, RandomLifecycleOperationsNeverFailAnInference) {
  const auto duration = StressDuration();
  const uint64_t seed = StressSeed();
  std::cout << "stress: " << kWorkers << " workers, " << kInferenceThreads << " inference threads, "
            << duration.count() << " s, BACKPLANE_STRESS_SEED=" << seed << std::endl;
  RecordProperty("seed", std::to_string(seed));

  std::array<Tally, kWorkers> tallies{};
  {
    LogLevelScope quiet(spdlog::level::warn);
    std::vector<std::thread> threads;
    for (int worker = 0; worker < kWorkers; ++worker)
      threads.emplace_back([&, worker] { RunWorker(worker, seed, tallies[worker]); });
    for (int i = 0; i < kInferenceThreads; ++i)
      threads.emplace_back([&] { RunInference(); });
    threads.emplace_back([&] { RunHealth(); });
    std::this_thread::sleep_for(duration);
    stop_ = true;
    for (auto& thread : threads)
      thread.join();
  }

  // What every operation answered, for the log and for judging a failure.
  Tally total{};
  for (const auto& tally : tallies) {
    for (std::size_t i = 0; i < kOperations.size(); ++i) {
      for (const auto& [answer, count] : tally[i].answers)
        total[i].answers[answer] += count;
      total[i].slowest = std::max(total[i].slowest, tally[i].slowest);
    }
  }
  int64_t activations = 0;
  for (std::size_t i = 0; i < kOperations.size(); ++i) {
    int64_t calls = 0;
    std::string answers;
    for (const auto& [answer, count] : total[i].answers) {
      calls += count;
      answers += "  " + answer + ": " + std::to_string(count);
      if (answer.find("activated") != std::string::npos ||
          (kOperations[i].operation == Operation::kRollback && answer == "ok"))
        activations += count;
    }
    std::cout << "stress: " << kOperations[i].name << ": " << calls << " calls, slowest "
              << std::chrono::duration_cast<std::chrono::milliseconds>(total[i].slowest).count()
              << " ms;" << answers << std::endl;
  }
  const auto health_ms = std::chrono::duration<double, std::milli>(health_max_latency_).count();
  std::cout << "stress: requests served on Valid " << served_by_valid_.load() << ", on ValidNext "
            << served_by_next_.load() << ", failed " << failed_inferences_.load()
            << "; health polls " << health_polls_ << ", slowest " << health_ms << " ms"
            << std::endl;

  {
    std::lock_guard lock(problems_mutex_);
    EXPECT_EQ(problem_count_, 0) << "first problems:\n" << ::testing::PrintToString(problems_);
  }
  EXPECT_EQ(failed_inferences_.load(), 0);
  EXPECT_GT(served_by_valid_.load() + served_by_next_.load(), 0);
  EXPECT_GT(activations, 0) << "no generation ever changed: the test tested nothing";
  EXPECT_LE(health_max_latency_, kHealthDeadline) << health_ms << " ms";

  // Unload everything that can be; what stays (network 13) has migrated to the active generation.
  for (NetworkId network : extra_networks_)
    EXPECT_TRUE(runtime_->UnloadNetwork(network).ok()) << network;
  EXPECT_TRUE(runtime_->UnloadNetwork(served_network_).ok());
  loader_->WaitForUnloads();

  // Every generation but the active one left the process, with its shadow copy.
  EXPECT_EQ(loader_->stats().leaked.load(), 0u);
  const auto status = registry_->Describe(kId);
  ASSERT_TRUE(status.has_value());
  const uint64_t active = status->active_generation;
  ASSERT_NE(active, 0u);
  for (const auto& generation : status->generations) {
    if (generation.generation == active) {
      EXPECT_EQ(generation.state, GenerationState::kActive);
    } else {
      EXPECT_TRUE(generation.state == GenerationState::kUnloaded ||
                  generation.state == GenerationState::kRejected)
          << "generation " << generation.generation << " is " << ToString(generation.state);
    }
  }
  EXPECT_EQ(testing::MappedGenerations(kFileName),
            std::set<std::string>{testing::GenerationMapping(active, kFileName)});

  // And the active one leaves with the last runtime and the registry.
  runtime_.reset();
  registry_.reset();
  loader_->WaitForUnloads();
  EXPECT_TRUE(testing::MappedGenerations(kFileName).empty())
      << ::testing::PrintToString(testing::MappedGenerations(kFileName));
  EXPECT_EQ(loader_->stats().leaked.load(), 0u);
}

}  // namespace
}  // namespace backplane
