// Hot reload, measured end to end with the real watcher, loader and runtime (a scripted run, not
// Google Benchmark: what matters are distributions across swaps, not a per-iteration cost).
//
//   build/release/bin/backplane_bench_hot_reload [--swaps N] [--debounce-ms D] [--seconds S]
//   build/release/bin/backplane_bench_hot_reload --backend-file PATH --model PATH [--swaps N] ...
//   build/release/bin/backplane_bench_hot_reload --cpu-acc [--swaps N] ...
//
// With --backend-file and --model (--cpu-acc: build/release/backends/Backplane_CpuAcc_backend.so
// and the real MNIST model), the swaps are of that backend serving that model instead of the
// fixtures; see "A real backend" below.
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
//   after 10 swaps: K KiB resident, M mappings, S generation(s) mapped; after N swaps: ...; live
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
//   CpuRef active generation after the run: G (CpuAcc with --cpu-acc: the backend swapped)
//     That a swap took at all. Generation numbers are the loader's, shared by the whole process,
//     so G also counts the generations of the runs before.
//
// A real backend (--backend-file PATH --model PATH, or --cpu-acc): the model is loaded on that
// backend alone (its id is whatever the file says; every layer must be supported), one client
// executes it throughout, and each swap copies the SAME file (a snapshot of PATH taken at start)
// to a temporary name in the watched directory, fsyncs it and rename()s it over the served name:
// a new file identity, so a new generation of identical code. The measuring thread cannot tell
// generations apart by output, so "the new generation" is the network's placement
// (Runtime::GetPlacement): before each of its requests it reads the placement, and the first
// request started once every layer is on a generation newer than the one before the rename
// stops the clock (a request runs wholly on the generations current when it starts; the
// resolution is one request). Lines:
//
//   <id>: rename -> first request on the new generation (N swaps): p50, p99, max; requests R,
//   failed F
//     As above; F counts failed requests of both clients.
//
//   <id>: after 10 swaps ... after N swaps ... (as above)
//
//   <id>: resident by kind (anon, file, shmem KiB) after 10 swaps: ...; after N: ...
//     The same two samples split as /proc/self/status does (RssAnon, RssFile, RssShmem): says
//     whether a growth is heap (anon), code and data of files, or shared memory. Then, once,
//     malloc_trim(0) and the resident and anon figures again: a growth that this gives back was
//     free memory that glibc's malloc kept (fragmented arenas), not memory in use.
//
//   <id>: replaced generations N: unloaded U (verified unmapped), leaked L [numbers], code still
//   mapped M [numbers]
//     Every generation that was replaced, after the run: U got the registry's kUnloaded event
//     (the loader's dlclose + RTLD_NOLOAD check said it left), L got kLeaked (still mapped after
//     dlclose), M still have an executable mapping of their shadow copy in /proc/self/maps. All
//     N should be U with M = 0. A backend whose dependency defines GNU_UNIQUE symbols (CpuAcc's
//     libdnnl) leaks the generation that brought the dependency in unless the loader makes it
//     resident first (docs/loading-rules.md, rule 8).
//
//   MNIST on <id>, 2 clients, steady state | <id> replaced every 100 ms: ...
//     As for CpuRef above, with the given backend and model.
#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backplane/onnx/network.hpp"
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

// RssAnon, RssFile and RssShmem of /proc/self/status (KiB): which kind of memory a growth is.
struct ResidentKinds {
  long anon = 0, file = 0, shmem = 0;
};
ResidentKinds ResidentByKind() {
  std::ifstream status("/proc/self/status");
  ResidentKinds kinds;
  for (std::string line; std::getline(status, line);) {
    long* field = line.starts_with("RssAnon:")    ? &kinds.anon
                  : line.starts_with("RssFile:")  ? &kinds.file
                  : line.starts_with("RssShmem:") ? &kinds.shmem
                                                  : nullptr;
    if (field != nullptr)
      *field = std::atol(line.c_str() + line.find(':') + 1);
  }
  return kinds;
}

struct MemorySample {
  long resident_kib = 0;
  ResidentKinds kinds;
  int mappings = 0;
  int generations = 0;  // distinct backend generations with code mapped
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
    return MemorySample{ResidentKiB(),
                        ResidentByKind(),
                        MappingCount(),
                        static_cast<int>(testing::MappedGenerations().size()),
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
      "after 10 swaps: %ld KiB resident, %d mappings, %d generation(s) mapped; after %d swaps: %ld "
      "KiB "
      "resident, %d mappings, %d generation(s) mapped; live generations %llu, leaked %llu\n",
      at_10.resident_kib, at_10.mappings, at_10.generations, swaps, at_end.resident_kib,
      at_end.mappings, at_end.generations, static_cast<unsigned long long>(at_end.live),
      static_cast<unsigned long long>(at_end.leaked));
}

// What a real-backend run serves: a backend file, a model on it, and an input for the model.
struct Served {
  fs::path backend_file;
  fs::path model;
  std::string id;  // the backend's id, once the registry has loaded the file
  Network network;
  std::vector<Tensor> inputs;
};

// The model with an input per graph input: its test_data_set_0/input_N.pb files when the model
// sits in an ONNX test-case folder (MNIST), else constant 0.5s of its shape (dynamic sizes as 1).
std::optional<Served> ServedModel(const fs::path& backend_file, const fs::path& model) {
  const fs::path data = model.parent_path() / "test_data_set_0";
  std::vector<fs::path> input_files;
  for (int i = 0; fs::exists(data / ("input_" + std::to_string(i) + ".pb")); ++i)
    input_files.push_back(data / ("input_" + std::to_string(i) + ".pb"));
  if (!input_files.empty()) {
    auto loaded = LoadOnnxModelWithInputs(model, input_files);
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s: %s\n", model.c_str(), loaded.error().ToString().c_str());
      return std::nullopt;
    }
    return Served{backend_file, model, "", std::move(loaded->network), std::move(loaded->inputs)};
  }
  auto network = ImportOnnxFile(model);
  if (!network.ok()) {
    std::fprintf(stderr, "%s: %s\n", model.c_str(), network.error().ToString().c_str());
    return std::nullopt;
  }
  Served served{backend_file, model, "", std::move(network).value(), {}};
  for (const auto& input : served.network.inputs) {
    TensorInfo info = input.info;
    for (auto& dim : info.shape)
      dim = dim < 0 ? 1 : dim;
    Tensor tensor(info);
    std::fill(tensor.Elements<float>().begin(), tensor.Elements<float>().end(), 0.5f);
    served.inputs.push_back(std::move(tensor));
  }
  return served;
}

std::vector<ConstTensorView> Views(const std::vector<Tensor>& tensors) {
  std::vector<ConstTensorView> views;
  for (const auto& tensor : tensors)
    views.push_back(tensor.View());
  return views;
}

// `served`: null for CpuRef serving MNIST.
void LatencyDuringSwaps(std::chrono::seconds duration,
                        std::optional<std::chrono::milliseconds> debounce,
                        const Served* served = nullptr) {
  const fs::path mnist = BACKPLANE_SHARED_DATA "/models/mnist";
  if (served == nullptr && !fs::exists(mnist / "model.onnx")) {
    std::printf("MNIST latency: skipped (no %s)\n", mnist.c_str());
    return;
  }
  const fs::path backend_file = served ? served->backend_file : fs::path(BACKPLANE_CPU_REF);
  const std::string id = served ? served->id : "CpuRef";
  const std::string model_name = served ? served->model.filename().string() : "MNIST";
  const std::string what =
      (served && served->model.parent_path().filename() == "mnist") ? "MNIST" : model_name;
  testing::TempDir dir;
  const fs::path target = dir.path() / backend_file.filename();
  fs::copy_file(backend_file, target);
  auto registry = BackendRegistry::Create({.backend_paths = std::vector{dir.path()}}).value();
  auto runtime = Runtime::Create({.registry = registry}).value();
  watcher::DirectoryWatcherOptions watch;
  if (debounce)
    watch.debounce = *debounce;
  auto reloader = BackendReloader::Start(registry, watch).value();
  std::optional<Served> mnist_on_cpu_ref;
  if (served == nullptr)
    mnist_on_cpu_ref = ServedModel(BACKPLANE_CPU_REF, mnist / "model.onnx");
  const Served& serving = served ? *served : *mnist_on_cpu_ref;
  auto loaded = runtime->LoadNetwork(serving.network, {.backend_preferences = {id}});
  if (!loaded.ok()) {
    std::printf("%s on %s: %s\n", what.c_str(), id.c_str(), loaded.error().ToString().c_str());
    return;
  }
  const NetworkId network = loaded.value();
  const std::vector<ConstTensorView> views = Views(serving.inputs);

  auto measure = [&](bool swapping) {
    std::atomic<bool> stop{false};
    std::atomic<long> failed{0};
    std::atomic<int> swaps{0};
    std::vector<std::vector<double>> per_client(2);
    std::vector<std::thread> clients;
    for (auto& latencies : per_client) {
      clients.emplace_back([&] {
        while (!stop) {
          const auto start = Clock::now();
          auto outputs = runtime->Execute(network, views);
          latencies.push_back(Milliseconds(Clock::now() - start));
          if (!outputs.ok())
            ++failed;
        }
      });
    }
    std::thread swapper([&] {
      while (swapping && !stop) {
        fs::rename(Stage(backend_file, dir.path()), target);
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
    std::printf("%s on %s, 2 clients, %s: %zu requests, p50 %.2f ms, p99 %.2f ms, failed %ld%s\n",
                what.c_str(), id.c_str(),
                swapping ? (id + " replaced every 100 ms").c_str() : "steady state", all.size(),
                Percentile(all, 0.5), Percentile(all, 0.99), failed.load(),
                swapping ? (", " + std::to_string(swaps.load()) + " files published").c_str() : "");
  };
  measure(false);
  measure(true);
  registry->loader().WaitForUnloads();
  const auto status = registry->Describe(id).value();
  std::printf("%s active generation after the run: %llu\n", id.c_str(),
              static_cast<unsigned long long>(status.active_generation));
}

// The generation every layer of `network` is on, or 0 while they differ (mid-switch never
// happens: a switch is atomic; 0 also when the placement cannot be read).
uint64_t NetworkGeneration(const Runtime& runtime, NetworkId network) {
  const auto placement = runtime.GetPlacement(network);
  if (!placement.ok() || placement->empty())
    return 0;
  const uint64_t first = placement->front().generation;
  for (const auto& layer : placement.value()) {
    if (layer.generation != first)
      return 0;
  }
  return first;
}

// Swaps of a real backend file (see the header): the same file republished `swaps` times.
// Returns false when it could not run at all.
bool SwapServedBackend(Served& served, int swaps,
                       std::optional<std::chrono::milliseconds> debounce) {
  testing::TempDir dir;
  const std::string file_name = served.backend_file.filename().string();
  const fs::path target = dir / file_name;
  testing::CopyFile(served.backend_file, target);
  auto registry = BackendRegistry::Create({.backend_paths = std::vector{dir.path()}});
  if (!registry.ok() || registry->BackendIds().empty()) {
    std::fprintf(stderr, "%s: no backend loaded from it%s\n", served.backend_file.c_str(),
                 registry.ok() ? "" : (": " + registry.error().ToString()).c_str());
    if (registry.ok()) {
      for (const auto& rejected : registry->Rejected())
        std::fprintf(stderr, "  rejected %s: %s\n", rejected.file.c_str(),
                     rejected.error.ToString().c_str());
    }
    return false;
  }
  served.id = registry->BackendIds().front();
  auto runtime = Runtime::Create({.registry = registry.share()}).value();
  watcher::DirectoryWatcherOptions watch;
  if (debounce)
    watch.debounce = *debounce;
  auto reloader = BackendReloader::Start(registry.share(), watch).value();
  auto loaded = runtime->LoadNetwork(served.network, {.backend_preferences = {served.id}});
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s on %s: %s\n", served.model.c_str(), served.id.c_str(),
                 loaded.error().ToString().c_str());
    return false;
  }
  const NetworkId network = loaded.value();
  const std::vector<ConstTensorView> views = Views(served.inputs);

  // Which replaced generations the registry reported unloaded (verified gone) or leaked.
  std::mutex events_mutex;
  std::map<uint64_t, GenerationEvent::Kind> ends;
  const uint64_t observer = registry->AddObserver([&](const GenerationEvent& event) {
    if (event.kind == GenerationEvent::Kind::kUnloaded ||
        event.kind == GenerationEvent::Kind::kLeaked) {
      std::lock_guard lock(events_mutex);
      ends[event.generation] = event.kind;
    }
  });

  std::atomic<bool> stop{false};
  std::atomic<long> served_requests{0}, failed{0};
  std::mutex client_busy;
  std::thread background([&] {
    while (!stop) {
      std::lock_guard lock(client_busy);
      runtime->Execute(network, views).ok() ? ++served_requests : ++failed;
    }
  });
  auto sample = [&] {
    std::lock_guard lock(client_busy);
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (registry->loader().stats().live.load() > 1 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    registry->loader().WaitForUnloads();
    return MemorySample{ResidentKiB(),
                        ResidentByKind(),
                        MappingCount(),
                        static_cast<int>(testing::MappedGenerations().size()),
                        registry->loader().stats().live.load(),
                        registry->loader().stats().leaked.load()};
  };

  MemorySample at_10, at_end;
  std::vector<double> latencies;
  std::vector<uint64_t> replaced;
  for (int swap = 0; swap < swaps; ++swap) {
    const uint64_t before = NetworkGeneration(*runtime, network);
    const fs::path staged = Stage(served.backend_file, dir.path());
    const auto renamed = Clock::now();
    fs::rename(staged, target);
    for (;;) {
      // Read before the request starts: a request runs on the generation current at its start.
      const uint64_t now = NetworkGeneration(*runtime, network);
      const bool moved = now > before;
      if (!runtime->Execute(network, views).ok())
        ++failed;
      else if (moved)
        break;
      if (Clock::now() - renamed > std::chrono::seconds(10)) {
        std::fprintf(stderr, "swap %d not served within 10 s (generation still %llu)\n", swap,
                     static_cast<unsigned long long>(before));
        std::exit(1);
      }
    }
    latencies.push_back(Milliseconds(Clock::now() - renamed));
    replaced.push_back(before);
    if (swap + 1 == 10)
      at_10 = sample();
  }
  at_end = sample();
  stop = true;
  background.join();
  // The last generation replaced may be released by the watcher thread just after the request
  // that saw its successor: wait (bounded) for its end to be reported.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    registry->loader().WaitForUnloads();
    std::lock_guard lock(events_mutex);
    if (ends.size() >= replaced.size() || Clock::now() > deadline)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  registry->RemoveObserver(observer);

  int unloaded = 0;
  std::vector<uint64_t> leaked, still_mapped, unreported;
  {
    std::lock_guard lock(events_mutex);
    for (const uint64_t generation : replaced) {
      const auto end = ends.find(generation);
      if (end == ends.end())
        unreported.push_back(generation);
      else if (end->second == GenerationEvent::Kind::kUnloaded)
        ++unloaded;
      else
        leaked.push_back(generation);
      // The shadow is "<generation>-<file name>"; appended, since g++ 12 warns (-Wrestrict,
      // wrongly) on "/" + std::to_string(...).
      std::string shadow = "/";
      shadow += std::to_string(generation);
      if (testing::IsCodeMapped(shadow + "-" + file_name))
        still_mapped.push_back(generation);
    }
  }
  auto list = [](const std::vector<uint64_t>& generations) {
    std::string text;
    for (std::size_t i = 0; i < generations.size() && i < 10; ++i) {
      if (i > 0)
        text += ' ';
      text += std::to_string(generations[i]);
    }
    if (generations.size() > 10)
      text += " ...";
    return "[" + text + "]";
  };
  const char* id = served.id.c_str();
  std::printf(
      "%s: rename -> first request on the new generation (debounce %lld ms%s, %d swaps): p50 "
      "%.1f ms, p99 %.1f ms, max %.1f ms; requests %ld, failed %ld\n",
      id, static_cast<long long>(watch.debounce.count()), debounce ? "" : " (default)", swaps,
      Percentile(latencies, 0.5), Percentile(latencies, 0.99), Percentile(latencies, 1.0),
      served_requests.load(), failed.load());
  std::printf(
      "%s: after 10 swaps: %ld KiB resident, %d mappings, %d generation(s) mapped; after %d swaps: "
      "%ld KiB resident, %d mappings, %d generation(s) mapped; live generations %llu, leaked "
      "%llu\n",
      id, at_10.resident_kib, at_10.mappings, at_10.generations, swaps, at_end.resident_kib,
      at_end.mappings, at_end.generations, static_cast<unsigned long long>(at_end.live),
      static_cast<unsigned long long>(at_end.leaked));
  // Diagnostic, after every number above was taken: how much of the growth is memory malloc
  // holds free (returned by malloc_trim) rather than memory still in use.
  malloc_trim(0);
  std::printf(
      "%s: resident by kind (anon, file, shmem KiB) after 10 swaps: %ld, %ld, %ld; after %d: %ld, "
      "%ld, %ld; then after malloc_trim(0): %ld KiB resident, anon %ld\n",
      id, at_10.kinds.anon, at_10.kinds.file, at_10.kinds.shmem, swaps, at_end.kinds.anon,
      at_end.kinds.file, at_end.kinds.shmem, ResidentKiB(), ResidentByKind().anon);
  std::printf(
      "%s: replaced generations %zu: unloaded %d (verified unmapped), leaked %zu %s, code still "
      "mapped %zu %s%s\n",
      id, replaced.size(), unloaded, leaked.size(), list(leaked).c_str(), still_mapped.size(),
      list(still_mapped).c_str(),
      unreported.empty() ? "" : (", no end reported " + list(unreported)).c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int swaps = 1000;
  std::optional<std::chrono::milliseconds> debounce;  // the watcher's default
  int seconds = 5;
  std::optional<fs::path> backend_file, model;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--cpu-acc") {
      backend_file = BACKPLANE_CPU_ACC;
      model = BACKPLANE_SHARED_DATA "/models/mnist/model.onnx";
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      return 2;
    }
    const std::string text = argv[++i];
    const int value = std::atoi(text.c_str());
    if (flag == "--swaps") {
      swaps = value;
    } else if (flag == "--debounce-ms") {
      debounce = std::chrono::milliseconds(value);
    } else if (flag == "--seconds") {
      seconds = value;
    } else if (flag == "--backend-file") {
      backend_file = text;
    } else if (flag == "--model") {
      model = text;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (swaps < 10) {
    std::fprintf(stderr, "--swaps must be at least 10 (memory is sampled after 10)\n");
    return 2;
  }
  if (backend_file.has_value() != model.has_value()) {
    std::fprintf(stderr, "--backend-file and --model go together\n");
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);  // one info line per swap would drown the results
  if (backend_file) {
    for (const auto& path : {*backend_file, *model}) {
      if (!fs::exists(path)) {
        std::fprintf(stderr, "%s is missing\n", path.c_str());
        return 1;
      }
    }
    // Every swap copies from a private snapshot, taken once: the file given may sit in a build
    // tree that a linker rewrites in place meanwhile (seen: a half-written copy, rejected).
    testing::TempDir snapshot_dir;
    const fs::path snapshot = snapshot_dir / backend_file->filename().string();
    testing::CopyFile(*backend_file, snapshot);
    auto served = ServedModel(snapshot, *model);
    if (!served || !SwapServedBackend(*served, swaps, debounce))
      return 1;
    LatencyDuringSwaps(std::chrono::seconds(seconds), debounce, &*served);
    return 0;
  }
  RenameToServed(swaps, debounce);
  LatencyDuringSwaps(std::chrono::seconds(seconds), debounce);
}
