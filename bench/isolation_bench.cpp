// What running a backend in a worker process costs a call (issue 39): the same fixture backend
// (TestValid, an Identity) in-process through the loader and isolated through
// backplane-backend-worker, side by side, on an MNIST-sized input (784 floats) and a 4 MB one,
// from one and two calling threads. Every output is checked.
//
//   build/release/bin/backplane_bench_isolation --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true  (one line)
#include <benchmark/benchmark.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backplane/isolation/backend_worker.hpp"
#include "backplane/isolation/isolated_backend.hpp"
#include "backplane/loader/loader.hpp"
#include "backplane/loader/sealed_image.hpp"

namespace {

using namespace backplane;

const std::filesystem::path kFixture =
    std::filesystem::canonical(std::string(BACKPLANE_FIXTURE_DIR) + "/Test_Valid_backend.so");

OperatorDesc Identity(int64_t elements) {
  return {.op_type = "Identity",
          .name = "identity",
          .inputs = {{DataType::kFloat32, {elements}}},
          .outputs = {{DataType::kFloat32, {elements}}},
          .constant_inputs = {nullptr}};
}

void ExecuteLoop(benchmark::State& state, IWorkload& workload, int64_t elements) {
  const TensorInfo info{DataType::kFloat32, {elements}};
  std::vector<float> in(static_cast<std::size_t>(elements), 3.0f), out(in.size());
  const ConstTensorView input{info, in.data()};
  const TensorView output{info, out.data()};
  for (auto _ : state) {
    out.back() = 0;
    if (!workload.Execute({&input, 1}, {&output, 1}).ok() || out.back() != 3.0f) {
      state.SkipWithError("a wrong or failed execution");
      return;
    }
  }
  state.SetBytesProcessed(state.iterations() * elements * 4);
}

// In-process: the loader's generation and instance, as the runtime holds them.
void BM_ExecuteInProcess(benchmark::State& state) {
  static auto loader = loader::Loader::Create().value();
  static auto generation = loader->Load(kFixture).value();
  static auto instance = loader->CreateInstance(generation).value();
  auto workload = instance->CreateWorkload(Identity(state.range(0))).value();
  struct Adapter final : IWorkload {
    loader::Workload& inner;
    explicit Adapter(loader::Workload& w) : inner(w) {}
    Status Execute(std::span<const ConstTensorView> in, std::span<const TensorView> out) override {
      return inner.Execute(in, out);
    }
  } adapter(*workload);
  ExecuteLoop(state, adapter, state.range(0));
}

// Isolated: one worker for the whole benchmark, one workload per benchmark thread.
void BM_ExecuteIsolated(benchmark::State& state) {
  static auto image = loader::SealedImage::Read(kFixture, "bench").value();
  static std::shared_ptr<isolation::BackendWorker> worker =
      isolation::BackendWorker::Start({.label = "bench"}, image.fd()).value();
  static auto hello = isolation::Hello(*worker).value();
  static auto backend = isolation::CreateIsolatedBackend(worker, hello).value();
  auto workload = backend->CreateWorkload(Identity(state.range(0))).value();
  ExecuteLoop(state, *workload, state.range(0));
}

BENCHMARK(BM_ExecuteInProcess)->Arg(784)->Arg(1 << 20)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_ExecuteIsolated)->Arg(784)->Arg(1 << 20)->Threads(1)->Threads(2)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
