// A complete embedding of Backplane, the way an inference server holds it (docs/embedding.md):
// one shared registry with an observer, a reloader that deploys new backend files while serving,
// a runtime, synchronous Execute from more threads than cores, asynchronous execution, an option
// update that reaches the loaded network, and an orderly shutdown that waits until every backend
// generation has left the process.
//
//   example_embed_runtime MODEL.onnx INPUT.pb BACKEND_DIR
//
// MODEL is MNIST (../shared/data/models/mnist/model.onnx), INPUT one of its test images. The
// network is loaded on CpuAcc when BACKEND_DIR has it, else on CpuRef. Exit status: 0 served and
// shut down cleanly, 1 a Backplane call failed (the Status is printed), 2 usage.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "backplane/registry/backend_reloader.hpp"
#include "backplane/runtime/runtime.hpp"

namespace {

namespace bp = backplane;

int Fail(const char* what, const bp::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  return 1;
}

// MNIST ends in MatMul + Add: 10 unnormalised scores, of which only the order means anything.
int Digit(const std::vector<bp::Tensor>& outputs) {
  const auto logits = outputs.at(0).Elements<float>();
  return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL.onnx INPUT.pb BACKEND_DIR\n", argv[0]);
    return 2;
  }
  // Before any Backplane call: its loggers copy the default logger's sinks on first use.
  spdlog::set_default_logger(spdlog::stderr_color_mt("embed_runtime"));
  spdlog::set_level(spdlog::level::warn);

  // 1. One registry for the process. std::move(...).value() takes the pointer out of the Result:
  //    a copy left inside would keep the registry, and every generation it holds, alive.
  auto created_registry =
      bp::BackendRegistry::Create({.backend_paths = std::vector<std::filesystem::path>{argv[3]}});
  if (!created_registry.ok())
    return Fail("registry", created_registry.error());
  std::shared_ptr<bp::BackendRegistry> registry = std::move(created_registry).value();
  // Taken now, waited on at the end: the registry's generations leave after the registry.
  const bp::LiveGenerations live = registry->live_generations();

  // 2. An observer: deploys, rejections and unloads as they happen (on the registry's threads).
  std::atomic<int> activations{0};
  const uint64_t observer = registry->AddObserver([&](const bp::GenerationEvent& event) {
    if (event.kind == bp::GenerationEvent::Kind::kActivated)
      activations.fetch_add(1);
    std::fprintf(stderr, "event: backend %s generation %llu %s\n", event.backend_id.c_str(),
                 static_cast<unsigned long long>(event.generation),
                 std::string(bp::ToString(event.kind)).c_str());
  });

  // 3. A reloader: a backend file published into BACKEND_DIR while serving is deployed without
  //    a restart (docs/hot-reload.md).
  auto started = bp::BackendReloader::Start(registry);
  if (!started.ok())
    return Fail("reloader", started.error());
  std::unique_ptr<bp::BackendReloader> reloader = std::move(started).value();

  // 4. A runtime on the shared registry. Option values given here survive hot swaps.
  const bool have_cpu_acc = registry->Find("CpuAcc").has_value();
  const std::string backend = have_cpu_acc ? "CpuAcc" : "CpuRef";
  bp::RuntimeOptions options{.registry = registry};
  if (have_cpu_acc)
    options.backend_options["CpuAcc"] = {{"intra_op_threads", int64_t{1}}};
  auto created_runtime = bp::Runtime::Create(std::move(options));
  if (!created_runtime.ok())
    return Fail("runtime", created_runtime.error());
  std::unique_ptr<bp::Runtime> runtime = std::move(created_runtime).value();

  auto network = bp::ImportOnnxFile(argv[1]);
  if (!network.ok())
    return Fail("import", network.error());
  auto input = bp::ReadTensorProtoFile(argv[2]);
  if (!input.ok())
    return Fail("input", input.error());
  auto loaded =
      runtime->LoadNetwork(std::move(network).value(), {.backend_preferences = {backend}});
  if (!loaded.ok())
    return Fail("load", loaded.error());
  const bp::NetworkId id = loaded.value();
  auto placement = runtime->GetPlacement(id);
  if (!placement.ok())
    return Fail("placement", placement.error());
  std::printf("loaded on %s: %zu layers, generation %llu\n", backend.c_str(), placement->size(),
              static_cast<unsigned long long>(placement->front().generation));

  // 5. Synchronous Execute from more threads than cores: each call runs on its caller's thread.
  const bp::ConstTensorView view = input->View();
  constexpr int kCallers = 8;
  constexpr int kRequestsEach = 50;
  std::atomic<int> wrong{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> callers;
  const int expected = [&] {
    auto outputs = runtime->Execute(id, std::span(&view, 1));
    return outputs.ok() ? Digit(*outputs) : -1;
  }();
  if (expected < 0)
    return Fail("execute", runtime->Execute(id, std::span(&view, 1)).error());
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&] {
      for (int request = 0; request < kRequestsEach; ++request) {
        auto outputs = runtime->Execute(id, std::span(&view, 1));
        if (!outputs.ok())
          failed.fetch_add(1);
        else if (Digit(*outputs) != expected)
          wrong.fetch_add(1);
      }
    });
  }
  for (auto& caller : callers)
    caller.join();
  std::printf("Execute: digit %d; %d callers x %d requests, %d failed, %d wrong\n", expected,
              kCallers, kRequestsEach, failed.load(), wrong.load());

  // 6. Asynchronous execution, with an option update in the middle: the loaded network is
  //    re-prepared with the new value and switched; requests in flight finish on the old one.
  std::vector<std::future<bp::Result<std::vector<bp::Tensor>>>> pending;
  for (int request = 0; request < 16; ++request) {
    std::vector<bp::Tensor> inputs;
    inputs.push_back(*input);
    pending.push_back(runtime->ExecuteAsync(id, std::move(inputs)));
    if (request == 8 && have_cpu_acc) {
      bp::Status updated =
          runtime->UpdateBackendOptions("CpuAcc", {{"intra_op_threads", int64_t{2}}});
      if (!updated.ok())
        return Fail("option update", updated);
      std::printf("option update: CpuAcc intra_op_threads 2, applied to the loaded network\n");
    }
  }
  int async_digits_right = 0;
  for (auto& future : pending) {
    auto outputs = future.get();
    if (!outputs.ok())
      return Fail("ExecuteAsync", outputs.error());
    async_digits_right += Digit(*outputs) == expected ? 1 : 0;
  }
  std::printf("ExecuteAsync: digit %d in %d of %zu requests\n", expected, async_digits_right,
              pending.size());

  // 7. Orderly shutdown: no more deploys, then the runtime (it waits for its requests), then the
  //    observer (RemoveObserver waits for a call in progress), then the registry. The generations
  //    leave the process afterwards, on the loader's reaper thread: wait for them.
  reloader.reset();
  runtime.reset();
  registry->RemoveObserver(observer);
  registry.reset();
  if (!live.WaitForNone(std::chrono::seconds(10))) {
    std::fprintf(stderr, "%llu generation(s) still in the process after 10 s\n",
                 static_cast<unsigned long long>(live.count()));
    return 1;
  }
  std::printf("shutdown: every backend generation has left the process\n");
  return failed.load() == 0 && wrong.load() == 0 &&
                 async_digits_right == static_cast<int>(pending.size())
             ? 0
             : 1;
}
