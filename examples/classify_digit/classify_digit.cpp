// A host program that embeds Backplane the way an inference server would: imports the MNIST model,
// loads it on CpuRef, classifies one digit image with Execute, then again with ExecuteAsync.
// docs/embedding.md walks through it.
//
//   example_classify_digit MODEL.onnx INPUT.pb [BACKEND_DIR...]
//
// BACKEND_DIR defaults to the default backend paths ($BACKPLANE_BACKEND_PATHS, else the build's).
// Exit status: 0 classified, 1 a Backplane call failed (the Status is printed), 2 usage.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"

namespace {

namespace bp = backplane;

int Fail(const char* what, const bp::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  return 1;
}

// The digit with the highest of the 10 logits. The model ends in MatMul + Add, not Softmax: the
// values are unnormalised scores, only their order means anything.
bp::Result<int> Argmax(const std::vector<bp::Tensor>& outputs) {
  if (outputs.size() != 1 || outputs[0].info().type != bp::DataType::kFloat32 ||
      outputs[0].info().ElementCount() != 10) {
    return bp::InvalidArgument("expected one FP32 output of 10 logits, got " +
                               std::to_string(outputs.size()) + " output(s)");
  }
  const auto logits = outputs[0].Elements<float>();
  return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void PrintLogits(const bp::Tensor& logits) {
  std::printf("logits:");
  for (float value : logits.Elements<float>())
    std::printf(" %.1f", value);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL.onnx INPUT.pb [BACKEND_DIR...]\n", argv[0]);
    return 2;
  }
  // Before any Backplane call: its module loggers copy the default logger's sinks when they are
  // first used. spdlog's own default writes to stdout, which is ours.
  spdlog::set_default_logger(spdlog::stderr_color_mt("classify_digit"));
  spdlog::set_level(spdlog::level::warn);

  // Import once; the Network is a value that LoadNetwork consumes.
  auto network = bp::ImportOnnxFile(argv[1]);
  if (!network.ok())
    return Fail("import", network.error());
  auto input = bp::ReadTensorProtoFile(argv[2]);
  if (!input.ok())
    return Fail("input", input.error());

  bp::RuntimeOptions options;
  if (argc > 3)
    options.backend_paths = std::vector<std::filesystem::path>(argv + 3, argv + argc);
  auto created = bp::Runtime::Create(std::move(options));
  if (!created.ok())
    return Fail("runtime", created.error());
  bp::Runtime& runtime = *created.value();

  auto id = runtime.LoadNetwork(std::move(network).value(), {.backend_preferences = {"CpuRef"}});
  if (!id.ok())
    return Fail("load", id.error());
  auto placement = runtime.GetPlacement(id.value());
  if (!placement.ok())
    return Fail("placement", placement.error());
  for (const bp::LayerPlacement& layer : placement.value()) {
    std::printf("%-30s %-8s on %s generation %llu\n", layer.node.c_str(), layer.op_type.c_str(),
                layer.backend_id.c_str(), static_cast<unsigned long long>(layer.generation));
  }

  // Synchronous: runs on this thread; the view must stay valid until Execute returns.
  const bp::ConstTensorView view = input.value().View();
  auto outputs = runtime.Execute(id.value(), {&view, 1});
  if (!outputs.ok())
    return Fail("Execute", outputs.error());
  auto digit = Argmax(outputs.value());
  if (!digit.ok())
    return Fail("Execute", digit.error());
  PrintLogits(outputs.value()[0]);
  std::printf("Execute:      digit %d\n", digit.value());

  // Asynchronous: the request owns its inputs (moved in), so nothing here needs to outlive the
  // call. A request still queued when the deadline passes is not run: DEADLINE_EXCEEDED.
  const auto deadline = bp::scheduler::Clock::now() + std::chrono::seconds(1);
  auto future = runtime.ExecuteAsync(id.value(), {input.value()}, deadline);
  auto async_outputs = future.get();
  if (!async_outputs.ok())
    return Fail("ExecuteAsync", async_outputs.error());
  auto async_digit = Argmax(async_outputs.value());
  if (!async_digit.ok())
    return Fail("ExecuteAsync", async_digit.error());
  std::printf("ExecuteAsync: digit %d\n", async_digit.value());

  if (bp::Status unloaded = runtime.UnloadNetwork(id.value()); !unloaded.ok())
    return Fail("unload", unloaded);
  return 0;
}
