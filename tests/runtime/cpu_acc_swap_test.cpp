// CpuAcc hot-swapped under load (issue 9): the real MNIST model served on the oneDNN backend while
// the same Backplane_CpuAcc_backend.so is republished (temporary name + rename: a new file
// identity, so a new generation) and the registry rescans, at least 200 times. No request may
// fail or answer wrong, and every replaced generation must leave the process: the registry
// reports it unloaded (dlclose + RTLD_NOLOAD said it is gone), not leaked, and no executable
// mapping of its shadow copy is left.
//
// Needs the built CpuAcc backend (BACKPLANE_CPU_ACC from CMake; the environment variable
// BACKPLANE_CPU_ACC_BACKEND overrides it) and ../shared/data: without them the test skips, and
// fails under CI=true. It includes nothing of CpuAcc's sources, so it builds in a tree without
// them. Trap: Debian's libdnnl defines GNU_UNIQUE symbols and is never unloaded; unless the
// loader makes it resident before the first CpuAcc generation (docs/loading-rules.md, rule 8),
// the generation that brought it in stays mapped with it, and this test says so.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"
#include "runtime/cpu_acc_backend_path.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using Action = DeployOutcome::Action;
using testing::TempDir;

// The contract's number, in every build: about 4 s in release on 2 busy cores (20 ms a swap:
// copy, inspection, dlopen, compiling MNIST on oneDNN); sanitizers stay well inside the 300 s
// timeout of the runtime tests.
constexpr int kSwaps = 200;
constexpr std::string_view kFileName = "Backplane_CpuAcc_backend.so";

std::size_t ArgMax(std::span<const float> values) {
  return static_cast<std::size_t>(std::max_element(values.begin(), values.end()) - values.begin());
}

TEST(CpuAccSwapTest, SwapsUnderLoadFailNoRequestAndUnmapEveryReplacedGeneration) {
  const fs::path cpu_acc = testing::CpuAccBackend();
  BACKPLANE_REQUIRE_PATH(cpu_acc);
  const fs::path mnist = BACKPLANE_SHARED_DATA "/models/mnist";
  BACKPLANE_REQUIRE_PATH(mnist / "model.onnx");

  TempDir shadow_root, dir, source;
  // Every publish copies from a snapshot: the build may relink the file in place meanwhile.
  const fs::path snapshot = source / kFileName;
  testing::CopyFile(cpu_acc, snapshot);
  auto loader = loader::Loader::Create({.shadow_root = shadow_root.path()});
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  // The safe publish: a finished file under a temporary name, renamed over the served name.
  auto publish = [&] {
    testing::CopyFile(snapshot, dir / ".incoming");
    fs::rename(dir / ".incoming", dir / kFileName);
  };
  publish();
  auto registry = BackendRegistry::Create({.backend_paths = std::vector{dir.path()},
                                           .loader = loader.share(),
                                           .settle_time = std::chrono::milliseconds(0)});
  ASSERT_TRUE(registry.ok()) << registry.error().ToString();
  for (const auto& rejected : registry->Rejected())
    ADD_FAILURE() << rejected.file << " rejected: " << rejected.error.ToString();
  ASSERT_TRUE(registry->Find("CpuAcc").has_value()) << cpu_acc << " gives no CpuAcc";

  std::mutex events_mutex;
  std::map<uint64_t, GenerationEvent::Kind> ends;  // kUnloaded or kLeaked, per generation
  const uint64_t observer = registry->AddObserver([&](const GenerationEvent& event) {
    if (event.kind == GenerationEvent::Kind::kUnloaded ||
        event.kind == GenerationEvent::Kind::kLeaked) {
      std::lock_guard lock(events_mutex);
      ends[event.generation] = event.kind;
    }
  });

  auto runtime =
      Runtime::Create({.backend_options = {{"CpuAcc", {{"intra_op_threads", int64_t{1}}}}},
                       .registry = registry.share()});
  ASSERT_TRUE(runtime.ok()) << runtime.error().ToString();
  auto test_case = LoadOnnxTestCase(mnist);  // test_data_set_0: a 5 (output_0.pb is one-hot)
  ASSERT_TRUE(test_case.ok()) << test_case.error().ToString();
  const std::size_t label = ArgMax(test_case->expected_outputs.at(0).Elements<float>());
  auto network = runtime.value()->LoadNetwork(std::move(test_case->network),
                                              {.backend_preferences = {"CpuAcc"}});
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  const auto placement = runtime.value()->GetPlacement(network.value());
  for (const auto& layer : placement.value())
    EXPECT_EQ(layer.backend_id, "CpuAcc") << layer.node;
  const ConstTensorView input = test_case->inputs.at(0).View();

  // Memory is sampled with the clients held between requests, so that no request keeps a replaced
  // generation mapped at that moment. (Not a shared_mutex: glibc's prefers readers, and two
  // clients executing back to back starve the sampler for minutes.) A client announces itself in
  // `executing` before it looks at `hold`, so the sampler that set `hold` and then saw
  // `executing` at 0 knows no request runs until it clears `hold`.
  std::atomic<bool> hold{false};
  std::atomic<int> executing{0};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> served{0}, failed{0}, wrong{0};
  std::mutex first_error_mutex;
  std::string first_error;
  std::vector<std::thread> clients;
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back([&] {
      while (!stop) {
        ++executing;
        if (hold) {
          --executing;
          std::this_thread::yield();
          continue;
        }
        auto outputs = runtime.value()->Execute(network.value(), std::span(&input, 1));
        if (!outputs.ok()) {
          if (failed++ == 0) {
            std::lock_guard error_lock(first_error_mutex);
            first_error = outputs.error().ToString();
          }
        } else if (ArgMax(outputs->at(0).Elements<float>()) != label) {
          ++wrong;
        }
        ++served;
        --executing;
      }
    });
  }
  auto settled_resident_kib = [&] {
    hold = true;
    while (executing > 0)
      std::this_thread::yield();
    loader->WaitForUnloads();
    const long resident =
        static_cast<long>(testing::ProcStatusBytes(getpid(), "VmRSS").value() / 1024);
    hold = false;
    return resident;
  };

  long resident_at_10 = 0, resident_at_end = 0;
  std::vector<uint64_t> replaced;
  for (int swap = 0; swap < kSwaps; ++swap) {
    const uint64_t before = registry->Describe("CpuAcc")->active_generation;
    publish();
    const auto rescan = registry->Rescan();
    ASSERT_EQ(rescan.outcomes.size(), 1u) << "swap " << swap;
    ASSERT_EQ(rescan.outcomes[0].action, Action::kActivated)
        << "swap " << swap << ": " << rescan.outcomes[0].message << " "
        << rescan.outcomes[0].error.ToString();
    const uint64_t after = registry->Describe("CpuAcc")->active_generation;
    ASSERT_GT(after, before);
    for (const auto& layer : runtime.value()->GetPlacement(network.value()).value())
      ASSERT_EQ(layer.generation, after) << "swap " << swap << ": " << layer.node;
    replaced.push_back(before);
    if (swap + 1 == 10)
      resident_at_10 = settled_resident_kib();
  }
  resident_at_end = settled_resident_kib();
  stop = true;
  for (auto& client : clients)
    client.join();
  EXPECT_EQ(failed.load(), 0) << "the first: " << first_error;
  EXPECT_EQ(wrong.load(), 0) << "answers other than the label " << label;
  EXPECT_GT(served.load(), kSwaps);

  // Every replaced generation ended, as unloaded; the reaper may report the last one just after
  // the swap returned.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    loader->WaitForUnloads();
    std::lock_guard lock(events_mutex);
    if (ends.size() >= replaced.size() || std::chrono::steady_clock::now() > deadline)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  registry->RemoveObserver(observer);
  std::vector<uint64_t> not_unloaded, still_mapped;
  {
    std::lock_guard lock(events_mutex);
    for (const uint64_t generation : replaced) {
      const auto end = ends.find(generation);
      if (end == ends.end() || end->second != GenerationEvent::Kind::kUnloaded)
        not_unloaded.push_back(generation);
      std::string shadow = "/";  // shadow copies are "<generation>-<file name>"
      shadow += std::to_string(generation);
      shadow += '-';
      shadow += kFileName;
      if (testing::IsCodeMapped(shadow))
        still_mapped.push_back(generation);
    }
  }
  auto list = [](const std::vector<uint64_t>& generations) {
    std::string text;
    for (const uint64_t generation : generations)
      text += std::to_string(generation) + ' ';
    return text;
  };
  EXPECT_TRUE(not_unloaded.empty())
      << not_unloaded.size() << " of " << replaced.size()
      << " replaced generations were not reported unloaded (leaked, or no end reported): "
      << list(not_unloaded)
      << "(the first one alone: libdnnl was not made resident first, loading rule 8)";
  EXPECT_TRUE(still_mapped.empty()) << "code still mapped of generations " << list(still_mapped);
  EXPECT_EQ(loader->stats().leaked.load(), 0u);
  EXPECT_EQ(loader->stats().live.load(), 1u) << "only the active generation";
  // Reported, not asserted: the 1 MiB bound of issue 9 is over 1000 swaps, in the bench
  // (backplane_bench_hot_reload --cpu-acc), and glibc's per-thread malloc arenas keep freed
  // memory resident in amounts that depend on the threads and the machine.
  RecordProperty("resident_kib_after_10_swaps", std::to_string(resident_at_10));
  RecordProperty("resident_kib_after_all_swaps", std::to_string(resident_at_end));
  std::printf("resident memory after 10 swaps %ld KiB, after %d: %ld KiB\n", resident_at_10, kSwaps,
              resident_at_end);
}

}  // namespace
}  // namespace backplane
