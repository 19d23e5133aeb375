// Loader costs: the numbers behind the measured costs in docs/loading-rules.md, for this code base.
#include <benchmark/benchmark.h>

#include "backplane/loader/loader.hpp"

namespace {

using backplane::loader::Loader;

// Load (copy + inspect + dlopen + dlsym + probe) and unload (reaper: dlclose + verify + delete)
// of the CpuRef backend, one generation per iteration.
void BM_LoadAndUnloadGeneration(benchmark::State& state) {
  auto loader = Loader::Create().value();
  for (auto _ : state) {
    auto generation = loader->Load(BACKPLANE_BENCH_BACKEND);
    if (!generation.ok()) {
      state.SkipWithError(generation.error().message().c_str());
      return;
    }
    benchmark::DoNotOptimize(generation.value().get());
    generation = backplane::Status{};  // release; the reaper unloads
    loader->WaitForUnloads();
  }
}
BENCHMARK(BM_LoadAndUnloadGeneration)->Unit(benchmark::kMicrosecond);

// A cache hit: the same unchanged file already mapped.
void BM_LoadUnchangedFile(benchmark::State& state) {
  auto loader = Loader::Create().value();
  auto pinned = loader->Load(BACKPLANE_BENCH_BACKEND);
  for (auto _ : state) {
    auto again = loader->Load(BACKPLANE_BENCH_BACKEND);
    benchmark::DoNotOptimize(again.ok());
  }
}
BENCHMARK(BM_LoadUnchangedFile)->Unit(benchmark::kMicrosecond);

// Creating a backend instance (the factory, guarded) and releasing it through the reaper.
void BM_CreateInstance(benchmark::State& state) {
  auto loader = Loader::Create().value();
  auto generation = loader->Load(BACKPLANE_BENCH_BACKEND).value();
  for (auto _ : state) {
    auto instance = loader->CreateInstance(generation);
    benchmark::DoNotOptimize(instance.ok());
  }
  loader->WaitForUnloads();
}
BENCHMARK(BM_CreateInstance)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
