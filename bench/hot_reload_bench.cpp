// Hot reload, measured end to end with the real watcher, loader and runtime (a scripted run, not
// Google Benchmark: what matters are distributions across swaps, not a per-iteration cost).
//
//   build/release/bin/backplane_bench_hot_reload [--swaps N] [--debounce-ms D] [--seconds S]
//
// 1. rename() of a new version into the watched directory -> first request whose output comes
//    from the new generation (two fixture builds whose outputs differ by a known offset).
// 2. MNIST request latency on CpuRef in steady state, then while CpuRef is replaced every
//    100 ms; failed requests.
// 3. Resident memory and mapping count after 10 and after 1000 swaps (must not grow).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "backplane/runtime/runtime.hpp"
#include "backplane/registry/backend_reloader.hpp"
#include "spdlog/spdlog.h"
#include "runtime/swap_test_util.hpp"
#include "test_util.hpp"

namespace {

namespace fs = std::filesystem;
using namespace backplane;
using Clock = std::chrono::steady_clock;

double Milliseconds(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty())
    return 0;
  std::sort(values.begin(), values.end());
  return values[static_cast<std::size_t>(p * static_cast<double>(values.size() - 1))];
}

// Writes `from` under a temporary name, fsyncs, and returns that name: the caller renames.
fs::path Stage(const fs::path& from, const fs::path& directory) {
  const fs::path staged = directory / ".incoming";
  fs::copy_file(from, staged, fs::copy_options::overwrite_existing);
  const int fd = open(staged.c_str(), O_RDONLY);
  fsync(fd);
  close(fd);
  return staged;
}

long ResidentKiB() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

int MappingCount() {
  std::ifstream maps("/proc/self/maps");
  int lines = 0;
  for (std::string line; std::getline(maps, line);)
    ++lines;
  return lines;
}

void RenameToServed(int swaps, std::chrono::milliseconds debounce) {
  testing::TempDir dir;
  const fs::path target = dir / "Test_Valid_backend.so";
  fs::copy_file(BACKPLANE_FIXTURE_DIR "/Test_Valid_backend.so", target);
  auto registry = BackendRegistry::Create({.backend_paths = std::vector{dir.path()}}).value();
  auto runtime = Runtime::Create({.registry = registry}).value();
  auto reloader = BackendReloader::Start(registry, {.debounce = debounce}).value();
  const NetworkId network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork()).value();

  std::atomic<bool> stop{false};
  std::atomic<long> served{0}, failed{0};
  std::thread background([&] {  // another client, to count failures while swapping
    while (!stop) {
      std::isnan(testing::ExecuteOffset(*runtime, network)) ? ++failed : ++served;
    }
  });
  std::vector<double> latencies;
  for (int swap = 0; swap < swaps; ++swap) {
    const bool next = swap % 2 == 0;
    const fs::path staged = Stage(next ? BACKPLANE_FIXTURE_DIR "/Test_ValidNext_backend.so"
                                       : BACKPLANE_FIXTURE_DIR "/Test_Valid_backend.so",
                                  dir.path());
    const float expected = next ? 2 * testing::kNextOffset : 0.0f;
    const auto renamed = Clock::now();
    fs::rename(staged, target);
    for (;;) {
      const float offset = testing::ExecuteOffset(*runtime, network);
      if (std::isnan(offset))
        ++failed;
      if (offset == expected)
        break;
      if (Clock::now() - renamed > std::chrono::seconds(10)) {
        std::fprintf(stderr, "swap %d not served within 10 s\n", swap);
        std::exit(1);
      }
    }
    latencies.push_back(Milliseconds(Clock::now() - renamed));
  }
  stop = true;
  background.join();
  std::printf(
      "rename -> first request on the new generation (debounce %lld ms, %d swaps): p50 %.1f ms, "
      "p99 %.1f ms, max %.1f ms; requests %ld, failed %ld\n",
      static_cast<long long>(debounce.count()), swaps, Percentile(latencies, 0.5),
      Percentile(latencies, 0.99), Percentile(latencies, 1.0), served.load(), failed.load());
}

void LatencyDuringSwaps(std::chrono::seconds duration) {
  const fs::path mnist = BACKPLANE_SHARED_DATA "/models/mnist";
  if (!fs::exists(mnist / "model.onnx")) {
    std::printf("MNIST latency: skipped (no %s)\n", mnist.c_str());
    return;
  }
  testing::TempDir dir;
  const fs::path target = dir / "Backplane_CpuRef_backend.so";
  fs::copy_file(BACKPLANE_CPU_REF, target);
  auto registry = BackendRegistry::Create({.backend_paths = std::vector{dir.path()}}).value();
  auto runtime = Runtime::Create({.registry = registry}).value();
  auto reloader =
      BackendReloader::Start(registry, {.debounce = std::chrono::milliseconds(20)})
          .value();
  auto test_case = LoadOnnxModelWithInputs(mnist / "model.onnx",
                                           std::vector{mnist / "test_data_set_0" / "input_0.pb"})
                       .value();
  const NetworkId network = runtime->LoadNetwork(std::move(test_case.network)).value();
  const Tensor input = std::move(test_case.inputs[0]);

  auto measure = [&](bool swapping) {
    std::atomic<bool> stop{false};
    std::atomic<long> failed{0};
    std::atomic<int> swaps{0};
    std::vector<std::vector<double>> per_client(2);
    std::vector<std::thread> clients;
    for (auto& latencies : per_client) {
      clients.emplace_back([&] {
        const ConstTensorView view = input.View();
        while (!stop) {
          const auto start = Clock::now();
          auto outputs = runtime->Execute(network, std::span(&view, 1));
          latencies.push_back(Milliseconds(Clock::now() - start));
          if (!outputs.ok())
            ++failed;
        }
      });
    }
    std::thread swapper([&] {
      while (swapping && !stop) {
        fs::rename(Stage(BACKPLANE_CPU_REF, dir.path()), target);
        ++swaps;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
    std::this_thread::sleep_for(duration);
    stop = true;
    for (auto& client : clients)
      client.join();
    swapper.join();
    std::vector<double> all;
    for (const auto& latencies : per_client)
      all.insert(all.end(), latencies.begin(), latencies.end());
    std::printf(
        "MNIST on CpuRef, 2 clients, %s: %zu requests, p50 %.2f ms, p99 %.2f ms, "
        "failed %ld%s\n",
        swapping ? "CpuRef replaced every 100 ms" : "steady state", all.size(),
        Percentile(all, 0.5), Percentile(all, 0.99), failed.load(),
        swapping ? (", " + std::to_string(swaps.load()) + " files published").c_str() : "");
  };
  measure(false);
  measure(true);
  registry->loader().WaitForUnloads();
  const auto status = registry->Describe("CpuRef").value();
  std::printf("CpuRef active generation after the run: %llu\n",
              static_cast<unsigned long long>(status.active_generation));
}

void MemoryAfterSwaps(int many) {
  testing::TempDir dir;
  const fs::path target = dir / "Test_Valid_backend.so";
  fs::copy_file(BACKPLANE_FIXTURE_DIR "/Test_Valid_backend.so", target);
  auto registry = BackendRegistry::Create({.backend_paths = std::vector{dir.path()}}).value();
  auto runtime = Runtime::Create({.registry = registry}).value();
  const NetworkId network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork()).value();
  long rss_at_10 = 0;
  int maps_at_10 = 0;
  for (int swap = 1; swap <= many; ++swap) {
    fs::rename(Stage(swap % 2 ? BACKPLANE_FIXTURE_DIR "/Test_ValidNext_backend.so"
                              : BACKPLANE_FIXTURE_DIR "/Test_Valid_backend.so",
                     dir.path()),
               target);
    const auto rescan = registry->Rescan();
    if (rescan.outcomes.empty() || rescan.outcomes[0].action != DeployOutcome::Action::kActivated) {
      std::fprintf(stderr, "swap %d was not activated\n", swap);
      std::exit(1);
    }
    (void)testing::ExecuteOffset(*runtime, network);
    if (swap == 10) {
      registry->loader().WaitForUnloads();
      rss_at_10 = ResidentKiB();
      maps_at_10 = MappingCount();
    }
  }
  registry->loader().WaitForUnloads();
  std::printf(
      "after 10 swaps: %ld KiB resident, %d mappings; after %d swaps: %ld KiB resident, "
      "%d mappings; live generations %llu, leaked %llu\n",
      rss_at_10, maps_at_10, many, ResidentKiB(), MappingCount(),
      static_cast<unsigned long long>(registry->loader().stats().live.load()),
      static_cast<unsigned long long>(registry->loader().stats().leaked.load()));
}

}  // namespace

int main(int argc, char** argv) {
  int swaps = 100;
  int debounce_ms = 200;
  int seconds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--swaps")
      swaps = value;
    else if (flag == "--debounce-ms")
      debounce_ms = value;
    else if (flag == "--seconds")
      seconds = value;
  }
  spdlog::set_level(spdlog::level::warn);  // one info line per swap would drown the results
  RenameToServed(swaps, std::chrono::milliseconds(debounce_ms));
  LatencyDuringSwaps(std::chrono::seconds(seconds));
  MemoryAfterSwaps(1000);
}
