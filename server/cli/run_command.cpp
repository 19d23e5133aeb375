#include "cli/run_command.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"

namespace backplane::server {
namespace fs = std::filesystem;

namespace {

// The tolerance of the conformance tests: |got - want| <= atol + rtol * |want|.
constexpr double kAbsoluteTolerance = 1e-4;
constexpr double kRelativeTolerance = 1e-3;

int Fail(const std::string& message) {
  std::cerr << "backplane run: " << message << "\n";
  return 1;
}

struct Comparison {
  bool pass = true;
  double max_abs = 0;
  double max_rel = 0;
  std::string problem;  // a shape or type mismatch
};

Comparison Compare(const Tensor& got, const Tensor& want) {
  Comparison result;
  if (got.info() != want.info()) {
    result.pass = false;
    result.problem = "got " + std::string(ToString(got.info().type)) + ToString(got.info().shape) +
                     ", want " + std::string(ToString(want.info().type)) +
                     ToString(want.info().shape);
    return result;
  }
  const auto a = got.Elements<float>();
  const auto b = want.Elements<float>();
  for (std::size_t i = 0; i < b.size(); ++i) {
    const double diff = std::abs(static_cast<double>(a[i]) - b[i]);
    const double rel = b[i] != 0 ? diff / std::abs(b[i]) : diff;
    result.max_abs = std::max(result.max_abs, diff);
    result.max_rel = std::max(result.max_rel, rel);
    if (!(diff <= kAbsoluteTolerance + kRelativeTolerance * std::abs(b[i])))
      result.pass = false;
  }
  return result;
}

// Runs one set of inputs `repeat` times; returns the last outputs and prints the timings.
Result<std::vector<Tensor>> RunRepeated(Runtime& runtime, NetworkId id,
                                        const std::vector<Tensor>& inputs, int repeat) {
  std::vector<ConstTensorView> views;
  for (const auto& input : inputs)
    views.push_back(input.View());
  std::vector<double> milliseconds;
  Result<std::vector<Tensor>> outputs = Internal("not run");
  for (int i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    outputs = runtime.Execute(id, views);
    milliseconds.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
    if (!outputs.ok())
      return outputs;
  }
  std::sort(milliseconds.begin(), milliseconds.end());
  std::printf("time per run: median %.3f ms, min %.3f ms, max %.3f ms over %d run(s)\n",
              milliseconds[milliseconds.size() / 2], milliseconds.front(), milliseconds.back(),
              repeat);
  return outputs;
}

}  // namespace

int RunModel(const RunOptions& options) {
  RuntimeOptions runtime_options;
  if (!options.backend_dirs.empty()) {
    runtime_options.backend_paths =
        std::vector<fs::path>(options.backend_dirs.begin(), options.backend_dirs.end());
  }
  runtime_options.default_preferences = options.preferences;
  auto runtime = Runtime::Create(std::move(runtime_options));
  if (!runtime.ok())
    return Fail(runtime.error().message());

  // The model, with inputs from files or from each test-data set.
  std::vector<fs::path> data_sets;
  if (!options.test_data.empty()) {
    std::error_code error;
    for (fs::directory_iterator it(options.test_data, error), end; !error && it != end;
         it.increment(error)) {
      if (it->path().filename().string().starts_with("test_data_set_")) {
        data_sets.push_back(it->path());
      }
    }
    std::sort(data_sets.begin(), data_sets.end());
    if (data_sets.empty()) {
      return Fail("no test_data_set_* folder in " + options.test_data);
    }
  }
  auto load = [&](const fs::path& data_set) {
    std::vector<fs::path> files;
    if (data_set.empty()) {
      files.assign(options.inputs.begin(), options.inputs.end());
    } else {
      for (int i = 0; fs::exists(data_set / ("input_" + std::to_string(i) + ".pb")); ++i) {
        files.push_back(data_set / ("input_" + std::to_string(i) + ".pb"));
      }
    }
    return LoadOnnxModelWithInputs(options.model, files);
  };

  bool all_pass = true;
  const std::vector<fs::path> runs = data_sets.empty() ? std::vector<fs::path>{{}} : data_sets;
  for (const auto& data_set : runs) {
    auto loaded = load(data_set);
    if (!loaded.ok())
      return Fail(loaded.error().message());
    auto id = runtime.value()->LoadNetwork(std::move(loaded.value().network));
    if (!id.ok())
      return Fail(id.error().message());
    if (&data_set == &runs.front()) {
      const auto placement = runtime.value()->GetPlacement(id.value()).value();
      for (const auto& layer : placement) {
        std::printf("layer %-24s %-20s on %s", layer.node.c_str(), layer.op_type.c_str(),
                    layer.backend_id.c_str());
        if (layer.generation != 0) {
          std::printf(" (generation %llu)", static_cast<unsigned long long>(layer.generation));
        }
        // SDK 1.1: the layer ran inside one workload for a run of layers. The line keeps its
        // prefix, so scripts that read "layer NAME OP on BACKEND" still match.
        if (layer.compiled) {
          if (!layer.note.empty()) {
            std::printf(" [%s]", layer.note.c_str());
          } else {
            std::printf(" [compiled with the run from %s]", layer.subgraph.c_str());
          }
        }
        std::printf("\n");
      }
    }
    auto outputs = RunRepeated(*runtime.value(), id.value(), loaded->inputs, options.repeat);
    if (!outputs.ok())
      return Fail(outputs.error().message());

    const auto network = runtime.value()->GetNetwork(id.value()).value();
    if (!options.output_dir.empty()) {
      fs::create_directories(options.output_dir);
      for (std::size_t i = 0; i < outputs->size(); ++i) {
        const fs::path path =
            fs::path(options.output_dir) / ("output_" + std::to_string(i) + ".pb");
        Status written = WriteTensorProtoFile(path, (*outputs)[i], network->outputs[i].name);
        if (!written.ok())
          return Fail(written.message());
      }
    }
    if (!data_set.empty()) {
      for (std::size_t i = 0; i < network->outputs.size(); ++i) {
        const fs::path expected_file = data_set / ("output_" + std::to_string(i) + ".pb");
        auto expected = ReadTensorProtoFile(expected_file);
        if (!expected.ok())
          return Fail(expected.error().message());
        const Comparison comparison = Compare((*outputs)[i], expected.value());
        all_pass = all_pass && comparison.pass;
        std::printf("%s output %zu (%s): %s", data_set.filename().c_str(), i,
                    network->outputs[i].name.c_str(), comparison.pass ? "pass" : "FAIL");
        if (comparison.problem.empty()) {
          std::printf(", max abs error %.3g, max rel error %.3g\n", comparison.max_abs,
                      comparison.max_rel);
        } else {
          std::printf(", %s\n", comparison.problem.c_str());
        }
      }
    }
    (void)runtime.value()->UnloadNetwork(id.value());
  }
  if (!all_pass) {
    std::cerr << "backplane run: some outputs differ from the test data beyond atol "
              << kAbsoluteTolerance << " + rtol " << kRelativeTolerance << "\n";
  }
  return all_pass ? 0 : 1;
}

}  // namespace backplane::server
