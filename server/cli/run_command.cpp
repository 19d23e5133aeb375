#include "cli/run_command.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"
#include "config/option_json.hpp"

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
  const std::vector<double> a = ElementsAsDoubles(got.View());
  const std::vector<double> b = ElementsAsDoubles(want.View());
  for (std::size_t i = 0; i < b.size(); ++i) {
    const double diff = std::abs(a[i] - b[i]);
    const double rel = b[i] != 0 ? diff / std::abs(b[i]) : diff;
    result.max_abs = std::max(result.max_abs, diff);
    result.max_rel = std::max(result.max_rel, rel);
    if (!(diff <= kAbsoluteTolerance + kRelativeTolerance * std::abs(b[i])))
      result.pass = false;
  }
  return result;
}

double MicrosecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

// The first request at a new input shape of a network with a symbolic dimension runs uncompiled
// while that shape's program builds in the background (docs/performance.md, "Shape programs"):
// with more than one run, that first run is timed apart and the program awaited, so that the
// repeated runs time what every later request at that shape runs, not a mix that depends on how
// long the compile took. Returns the first run's outputs, or nullopt when there is no program to
// wait for.
std::optional<Result<std::vector<Tensor>>> RunFirstAndAwaitItsProgram(
    Runtime& runtime, NetworkId id, const std::vector<ConstTensorView>& views) {
  auto before = runtime.GetShapePrograms(id);
  if (!before.ok() || before->capacity == 0 || !before->programs.empty())
    return std::nullopt;
  const auto start = std::chrono::steady_clock::now();
  auto outputs = runtime.Execute(id, views);
  const double first = MicrosecondsSince(start);
  if (!outputs.ok())
    return outputs;
  // A program is cached once built, compiled or not; a build dropped from a full queue never
  // comes, hence the bound.
  constexpr auto kPatience = std::chrono::seconds(60);
  bool ready = false;
  while (!ready && std::chrono::steady_clock::now() - start < kPatience) {
    auto stats = runtime.GetShapePrograms(id);
    ready = !stats.ok() || !stats->programs.empty();
    if (!ready)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::printf(
      "first run: %.1f µs, before its input shape's program was built; %s %.1f ms after it "
      "began\n",
      first, ready ? "the program was ready" : "still no program", MicrosecondsSince(start) / 1e3);
  return outputs;
}

// Runs one set of inputs `repeat` times; returns the last outputs and prints the timings, in
// microseconds with one decimal (milliseconds with three rounded a 15 µs model to ±3%).
Result<std::vector<Tensor>> RunRepeated(Runtime& runtime, NetworkId id,
                                        const std::vector<Tensor>& inputs, int repeat) {
  std::vector<ConstTensorView> views;
  for (const auto& input : inputs)
    views.push_back(input.View());
  if (repeat > 1) {
    if (auto first = RunFirstAndAwaitItsProgram(runtime, id, views); first && !first->ok())
      return std::move(*first);
  }
  std::vector<double> microseconds;
  Result<std::vector<Tensor>> outputs = Internal("not run");
  for (int i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    outputs = runtime.Execute(id, views);
    microseconds.push_back(MicrosecondsSince(start));
    if (!outputs.ok())
      return outputs;
  }
  std::sort(microseconds.begin(), microseconds.end());
  std::printf("time per run: median %.1f µs, min %.1f µs, max %.1f µs over %d run(s)\n",
              microseconds[microseconds.size() / 2], microseconds.front(), microseconds.back(),
              repeat);
  return outputs;
}

// The value as the option's declared type. Every type but string reads the text as JSON (true,
// 2, 0.5), so that the admin API's rule (OptionFromJson) types it and its error names it; text
// that is no JSON at all is that rule's string, refused for any other type with the text quoted.
Result<OptionValue> TypedOptionValue(const std::string& text, const OptionDescriptor& option,
                                     std::string_view backend_id) {
  if (option.type == OptionType::kString)
    return OptionValue(text);
  nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded())
    value = text;
  return OptionFromJson(value, option, backend_id);
}

// Applies each `--option` to its backend instance, in order, before any network loads (CpuAcc
// reads intra_op_threads when it creates a network's workloads). Stops at the first one that the
// syntax, the runtime (no such backend), the option's description (no such key, wrong type) or
// the backend itself (a value out of range) refuses, naming that --option. Prints each applied
// option as the backend reads it back.
Status ApplyBackendOptions(Runtime& runtime, const std::vector<std::string>& texts) {
  std::map<std::string, std::string, std::less<>> given;  // "ID.KEY" -> its --option text
  for (const auto& text : texts) {
    const std::string flag = "--option " + text + ": ";
    auto parsed = ParseBackendOptionText(text);
    if (!parsed.ok())
      return parsed.error().WithContext("--option ");
    const std::string id = parsed->backend_id;
    const std::string key = parsed->key;
    auto [earlier, first] = given.emplace(id + "." + key, text);
    if (!first)
      return InvalidArgument(flag + "the option was already given as " + earlier->second);
    const auto backend = runtime.Backend(id);
    if (backend == nullptr) {
      std::string have;
      for (const auto& backend_id : runtime.BackendIds())
        have += (have.empty() ? "" : ", ") + backend_id;
      return InvalidArgument(flag + "no backend " + id + " in this runtime (have: " + have + ")");
    }
    const std::vector<OptionDescriptor> descriptors = backend->DescribeOptions();
    auto descriptor = std::find_if(descriptors.begin(), descriptors.end(),
                                   [&](const auto& d) { return d.name == key; });
    if (descriptor == descriptors.end()) {
      // The check that names an unknown key and lists the known ones; the value is not looked at.
      return ValidateOptions({{key, OptionValue{}}}, descriptors, id).WithContext(flag);
    }
    auto value = TypedOptionValue(parsed->value, *descriptor, id);
    if (!value.ok())
      return value.error().WithContext(flag);
    BACKPLANE_RETURN_IF_ERROR(
        runtime.UpdateBackendOptions(id, {{key, value.value()}}).WithContext(flag));
    auto applied = backend->GetOption(key);
    std::printf("option %s.%s = %s\n", id.c_str(), key.c_str(),
                applied.ok() ? ToString(applied.value()).c_str() : "(cannot be read back)");
  }
  return Status::Ok();
}

// The layer lines of PrintPlacement.
void PrintLayers(const std::vector<LayerPlacement>& placement) {
  for (const auto& layer : placement) {
    std::printf("layer %-24s %-20s on %s", layer.node.c_str(), layer.op_type.c_str(),
                layer.backend_id.c_str());
    if (layer.generation != 0) {
      std::printf(" (generation %llu)", static_cast<unsigned long long>(layer.generation));
    }
    // SDK 1.1: the layer ran inside one workload for a run of layers. The line keeps its
    // prefix, so scripts that read "layer NAME OP on BACKEND" still match.
    if (!layer.note.empty()) {
      std::printf(" [%s]", layer.note.c_str());  // a compiled run's, or "folded: ..."
    } else if (layer.compiled) {
      std::printf(" [compiled with the run from %s]", layer.subgraph.c_str());
    }
    std::printf("\n");
    // fallback_reason is "\n  ID: reason" per declining backend.
    std::size_t start = 0;
    while (start < layer.fallback_reason.size()) {
      const std::size_t end =
          std::min(layer.fallback_reason.find('\n', start), layer.fallback_reason.size());
      const std::string_view line =
          std::string_view(layer.fallback_reason).substr(start, end - start);
      const std::size_t text = line.find_first_not_of(' ');
      if (text != std::string_view::npos) {
        std::printf("  why not %.*s\n", static_cast<int>(line.size() - text), line.data() + text);
      }
      start = end + 1;
    }
  }
}

// One line per layer, "layer NAME OP on BACKEND", then, for a layer that is not on the first
// backend asked, one "  why not ID: reason" line per backend that declined it. Then, per backend
// with layers and options, "options on ID: key=value, ..." as its layers were prepared (every
// layer of a network on one backend has the same values).
void PrintPlacement(const std::vector<LayerPlacement>& placement) {
  PrintLayers(placement);
  std::map<std::string, const BackendOptions*, std::less<>> options;  // first layer's, by backend
  for (const auto& layer : placement)
    options.emplace(layer.backend_id, &layer.options);
  for (const auto& [id, values] : options) {
    if (values->empty())
      continue;
    std::string text;
    for (const auto& [key, value] : *values)
      text += (text.empty() ? "" : ", ") + key + "=" + ToString(value);
    std::printf("options on %s: %s\n", id.c_str(), text.c_str());
  }
}

// For a network with a symbolic input dimension, one line on its shape programs, then one per
// cached program: the layers compiled at that shape, and why any run would not compile there.
void PrintShapePrograms(const ShapeProgramStats& stats) {
  if (stats.capacity == 0)
    return;
  std::printf(
      "shape programs: %zu of %zu cached, hits %llu, misses %llu, compiles %llu, "
      "compile failures %llu\n",
      stats.programs.size(), stats.capacity, static_cast<unsigned long long>(stats.hits),
      static_cast<unsigned long long>(stats.misses),
      static_cast<unsigned long long>(stats.compiles),
      static_cast<unsigned long long>(stats.compile_failures));
  for (const auto& program : stats.programs) {
    std::string shapes;
    for (const auto& shape : program.input_shapes) {
      if (!shapes.empty())
        shapes += ' ';
      shapes += ToString(shape);
    }
    std::printf("shape program %s: %zu layers compiled%s%s\n", shapes.c_str(),
                program.compiled_layers,
                program.failures.empty() ? "" : "; failed: ", program.failures.c_str());
  }
}

}  // namespace

Result<BackendOptionText> ParseBackendOptionText(std::string_view text) {
  const std::size_t dot = text.find('.');
  const std::size_t equals = dot == std::string_view::npos ? dot : text.find('=', dot);
  if (dot == std::string_view::npos || equals == std::string_view::npos || dot == 0 ||
      equals == dot + 1) {
    return InvalidArgument(std::string(text) +
                           ": want ID.KEY=VALUE (a backend id, one of its option names, the "
                           "value), e.g. CpuAcc.intra_op_threads=2");
  }
  return BackendOptionText{.backend_id = std::string(text.substr(0, dot)),
                           .key = std::string(text.substr(dot + 1, equals - dot - 1)),
                           .value = std::string(text.substr(equals + 1))};
}

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
  Status options_applied = ApplyBackendOptions(*runtime.value(), options.backend_options);
  if (!options_applied.ok())
    return Fail(options_applied.message());

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
    auto outputs = RunRepeated(*runtime.value(), id.value(), loaded->inputs, options.repeat);
    // After the runs, not after the load: a network with symbolic shapes may be compiled for the
    // concrete shape of its first request, and the placement then says so. Also when a run
    // failed: where its layers were is the first thing to know.
    if (&data_set == &runs.front()) {
      PrintPlacement(runtime.value()->GetPlacement(id.value()).value());
      PrintShapePrograms(runtime.value()->GetShapePrograms(id.value()).value());
    }
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
