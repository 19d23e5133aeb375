// Request execution on CpuRef: the real MNIST model, one request at a time and from several
// threads at once, through Runtime::Execute (admission, arena, per-request memory included).
#include <benchmark/benchmark.h>

#include <filesystem>

#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"

namespace {

namespace fs = std::filesystem;
using namespace backplane;

struct Mnist {
  std::unique_ptr<Runtime> runtime;
  NetworkId id = 0;
  Tensor input;
};

// Built once: a runtime with only CpuRef and the MNIST network loaded.
Mnist* LoadMnist() {
  static Mnist* mnist = []() -> Mnist* {
    const fs::path model = fs::path(BACKPLANE_SHARED_DATA) / "models" / "mnist";
    auto test_case = LoadOnnxTestCase(model);
    if (!test_case.ok())
      return nullptr;
    static const fs::path dir = fs::temp_directory_path() / "backplane-bench-backends";
    fs::create_directories(dir);
    fs::permissions(dir, fs::perms(0700));
    std::error_code ignored;
    fs::remove(dir / "Backplane_CpuRef_backend.so", ignored);
    fs::create_symlink(BACKPLANE_CPU_REF, dir / "Backplane_CpuRef_backend.so");
    auto runtime = Runtime::Create({.backend_paths = std::vector{dir},
                                    .default_preferences = {"CpuRef"},
                                    .scheduler = {.max_in_flight = 1024}});
    if (!runtime.ok())
      return nullptr;
    auto* loaded = new Mnist{std::move(runtime).value(), 0, test_case->inputs[0]};
    loaded->id = loaded->runtime->LoadNetwork(std::move(test_case.value().network)).value();
    return loaded;
  }();
  return mnist;
}

void BM_MnistExecute(benchmark::State& state) {
  Mnist* mnist = LoadMnist();
  if (mnist == nullptr) {
    state.SkipWithError("MNIST model or CpuRef not available");
    return;
  }
  const ConstTensorView input = mnist->input.View();
  for (auto _ : state) {
    auto outputs = mnist->runtime->Execute(mnist->id, {&input, 1});
    if (!outputs.ok())
      state.SkipWithError(outputs.error().message().c_str());
    benchmark::DoNotOptimize(outputs);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MnistExecute)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Threads(1)
    ->Threads(2)
    ->Threads(4);

}  // namespace

BENCHMARK_MAIN();
