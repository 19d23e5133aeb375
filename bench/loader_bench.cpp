// Loader costs: the numbers behind the measured costs in docs/loading-rules.md, for this code base.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

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
    benchmark::DoNotOptimize(&*generation);
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

// One call of a one-element Identity workload through the host (Workload::Execute), per backend:
// TestHostParallel (SDK 1.2: its ParallelFor of one element runs inline) against TestTbb, which
// submits TBB tasks itself and is therefore confined, so that every call enters its own arena
// first (docs/loading-rules.md rule 5). The difference is what the confinement costs a call.
void BM_ExecuteTinyWorkload(benchmark::State& state, const char* fixture) {
  auto loader = Loader::Create().value();
  auto generation = loader->Load(std::string(BACKPLANE_FIXTURE_DIR) + "/" + fixture);
  if (!generation.ok()) {
    state.SkipWithError(generation.error().message().c_str());
    return;
  }
  auto instance = loader->CreateInstance(generation.share()).value();
  const backplane::OperatorDesc op{.op_type = "Identity",
                                   .name = "identity",
                                   .inputs = {{backplane::DataType::kFloat32, {1}}},
                                   .outputs = {{backplane::DataType::kFloat32, {1}}}};
  auto workload = instance->CreateWorkload(op).value();
  float in = 1.0f, out = 0.0f;
  const backplane::ConstTensorView input{{backplane::DataType::kFloat32, {1}}, &in};
  const backplane::TensorView output{{backplane::DataType::kFloat32, {1}}, &out};
  for (auto _ : state) {
    benchmark::DoNotOptimize(workload->Execute({&input, 1}, {&output, 1}).ok());
  }
}
BENCHMARK_CAPTURE(BM_ExecuteTinyWorkload, host_parallel, "Test_HostParallel_backend.so")
    ->Unit(benchmark::kNanosecond);
BENCHMARK_CAPTURE(BM_ExecuteTinyWorkload, tbb_confined, "Test_Tbb_backend.so")
    ->Unit(benchmark::kNanosecond);

}  // namespace

BENCHMARK_MAIN();
