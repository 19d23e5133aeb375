// Hot reload, measured end to end with the real watcher, loader and runtime (a scripted run, not
// Google Benchmark: what matters are distributions across swaps, not a per-iteration cost).
//
//   build/release/bin/backplane_bench_hot_reload [--swaps N] [--debounce-ms D] [--seconds S]
//
// Everything runs with the default configuration (BackendRegistryOptions{},
// DirectoryWatcherOptions{}: 200 ms debounce, which since the watcher scans at once on the first
// event of a name and on every rename no longer delays a rename-based deploy) unless
// --debounce-ms overrides the watcher's debounce (in both runs). --swaps defaults to 1000 (the
// latency percentiles are over all of them), --seconds (per MNIST run) to 5.
//
// What each printed line means:
//
//   rename -> first request on the new generation (debounce D ms, N swaps): p50, p99, max;
//   requests R, failed F
//     N times: a new build of the fixture backend (Valid and ValidNext alternately, whose outputs
//     differ by a known offset) is copied to a temporary name in the watched directory and
//     fsynced, then rename()d over the served name; the time is from just before rename() until a
//     request executed on this thread returns the new build's output. Percentiles are over all N
//     swaps. R counts the requests of a second client executing throughout; F counts failed
//     requests of both clients (any failure is a bug: a swap must never fail a request).
//
//   after 10 swaps: K KiB resident, M mappings, S shadow(s) mapped; after N swaps: ...; live
//   generations L, leaked X
//     Taken during the same run, after swap 10 and after swap N, with both clients paused, the
//     replaced generation destroyed and the reaper idle: VmRSS of the process, lines of
//     /proc/self/maps, and distinct shadow copies (the loader's private copies of backend files)
//     still mapped. L is the loader's count of generations not yet destroyed after swap N (1: the
//     active one), X those still mapped after dlclose. Neither column may grow with N.
//
//   MNIST on CpuRef, 2 clients, steady state | CpuRef replaced every 100 ms: requests, p50, p99,
//   failed[, files published]
//     Latency of Runtime::Execute on the real MNIST model, first without swaps, then while a
//     third thread publishes a new copy of the CpuRef file every 100 ms (temporary name + rename).
//
//   CpuRef active generation after the run: G
//     That a swap took at all. Generation numbers are the loader's, shared by the whole process,
//     so G also counts the generations of the runs before.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backplane/registry/backend_reloader.hpp"
#include "backplane/runtime/runtime.hpp"
#include "bench_util.hpp"
#include "runtime/swap_test_util.hpp"
#include "spdlog/spdlog.h"
#include "test_util.hpp"

namespace {

namespace fs = std::filesystem;
using namespace backplane;
using backplane::bench::Clock;
using backplane::bench::Milliseconds;
using backplane::bench::Percentile;

// Writes `from` under a temporary name, fsyncs, and returns that name: the caller renames.
fs::path Stage(const fs::path& from, const fs::path& directory) {
  const fs::path staged = directory / ".incoming";
  fs::copy_file(from, staged, fs::copy_options::overwrite_existing);
  const int fd = open(staged.c_str(), O_RDONLY);
  fsync(fd);
  close(fd);
  return staged;
}

// Resident memory of this process (statm's resident pages, the same figure as VmRSS).
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

// Distinct files under `shadows` (the loader's shadow directory) that are mapped: one per
// generation whose code is still in the process (a library has several mapping lines).
int MappedShadowCount(const fs::path& shadows) {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> files;
  const std::string prefix = shadows.string() + "/";
  for (std::string line; std::getline(maps, line);) {
    if (const auto at = line.find(prefix); at != std::string::npos)
      files.insert(line.substr(at));
  }
  return static_cast<int>(files.size());
}

struct MemorySample {
  long resident_kib = 0;
  int mappings = 0;
  int shadows = 0;
  uint64_t live = 0;    // the loader's generations not yet destroyed
  uint64_t leaked = 0;  // still mapped after dlclose
};

// `debounce`: nullopt keeps the watcher's default.
void RenameToServed(int swaps, std::optional<std::chrono::milliseconds> debounce) {
  testing::TempDir dir;
  const fs::path target = dir / "Test_Valid_backend.so";
  fs::copy_file(BACKPLANE_FIXTURE_DIR "/Test_Valid_backend.so", target);
  auto registry = BackendRegistry::Create({.backend_paths = std::vector{dir.path()}}).value();
  auto runtime = Runtime::Create({.registry = registry}).value();
  watcher::DirectoryWatcherOptions watch;
  if (debounce)
    watch.debounce = *debounce;
  auto reloader = BackendReloader::Start(registry, watch).value();
  const NetworkId network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork()).value();
  const fs::path shadows = registry->loader().shadow_directory().path();

  std::atomic<bool> stop{false};
  std::atomic<long> served{0}, failed{0};
  std::mutex client_busy;       // held by the second client around each request
  std::thread background([&] {  // another client, to count failures while swapping
    while (!stop) {
      std::lock_guard lock(client_busy);
      std::isnan(testing::ExecuteOffset(*runtime, network)) ? ++failed : ++served;
    }
  });
  // With both clients idle (this thread is one), waits for the reaper to unload every replaced
  // generation, then samples: a request in flight would keep its generation mapped.
  // The request that saw the new output may come before the watcher thread has finished the
  // swap and let go of the old generation, so wait (up to 5 s) for it to be destroyed first.
  auto sample = [&] {
    std::lock_guard lock(client_busy);
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (registry->loader().stats().live.load() > 1 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    registry->loader().WaitForUnloads();
    return MemorySample{ResidentKiB(), MappingCount(), MappedShadowCount(shadows),
                        registry->loader().stats().live.load(),
                        registry->loader().stats().leaked.load()};
  };
  MemorySample at_10, at_end;
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
    if (swap + 1 == 10)
      at_10 = sample();
  }
  at_end = sample();
  stop = true;
  background.join();
  std::printf(
      "rename -> first request on the new generation (debounce %lld ms%s, %d swaps): p50 %.1f ms, "
      "p99 %.1f ms, max %.1f ms; requests %ld, failed %ld\n",
      static_cast<long long>(watch.debounce.count()), debounce ? "" : " (default)", swaps,
      Percentile(latencies, 0.5), Percentile(latencies, 0.99), Percentile(latencies, 1.0),
      served.load(), failed.load());
  std::printf(
      "after 10 swaps: %ld KiB resident, %d mappings, %d shadow(s) mapped; after %d swaps: %ld KiB "
      "resident, %d mappings, %d shadow(s) mapped; live generations %llu, leaked %llu\n",
      at_10.resident_kib, at_10.mappings, at_10.shadows, swaps, at_end.resident_kib,
      at_end.mappings, at_end.shadows, static_cast<unsigned long long>(at_end.live),
      static_cast<unsigned long long>(at_end.leaked));
}

void LatencyDuringSwaps(std::chrono::seconds duration,
                        std::optional<std::chrono::milliseconds> debounce) {
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
  watcher::DirectoryWatcherOptions watch;
  if (debounce)
    watch.debounce = *debounce;
  auto reloader = BackendReloader::Start(registry, watch).value();
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

}  // namespace

int main(int argc, char** argv) {
  int swaps = 1000;
  std::optional<std::chrono::milliseconds> debounce;  // the watcher's default
  int seconds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--swaps")
      swaps = value;
    else if (flag == "--debounce-ms")
      debounce = std::chrono::milliseconds(value);
    else if (flag == "--seconds")
      seconds = value;
  }
  if (swaps < 10) {
    std::fprintf(stderr, "--swaps must be at least 10 (memory is sampled after 10)\n");
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);  // one info line per swap would drown the results
  RenameToServed(swaps, debounce);
  LatencyDuringSwaps(std::chrono::seconds(seconds), debounce);
}
