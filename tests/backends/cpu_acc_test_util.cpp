#include "cpu_acc_test_util.hpp"

#include <malloc.h>

#include "sanitizer_build.hpp"

#if defined(BACKPLANE_ASAN_BUILD)
// From ASan's runtime (<sanitizer/allocator_interface.h>, which only clang installs here).
extern "C" void __sanitizer_purge_allocator();
#endif

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "test_util.hpp"

namespace backplane::cpu_acc_test {
namespace fs = std::filesystem;

int Iterations(int release_count) {
#if defined(BACKPLANE_ASAN_BUILD) || defined(BACKPLANE_TSAN_BUILD)
  return std::max(release_count / 8, 10);
#else
  return release_count;
#endif
}

void TestGraph::AddInput(const std::string& name, const Shape& shape, std::mt19937& rng) {
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  FloatTensor tensor{shape, std::vector<float>(static_cast<std::size_t>(ElementCount(shape)))};
  for (float& v : tensor.values)
    v = value(rng);
  SetInput(name, std::move(tensor));
}

void TestGraph::SetInput(const std::string& name, FloatTensor tensor) {
  input_names_.push_back(name);
  shapes_[name] = tensor.shape;
  inputs_[name] = std::move(tensor);
}

const void* TestGraph::AddConstant(const std::string& name, FloatTensor tensor) {
  shapes_[name] = tensor.shape;
  float_data_.push_back(std::move(tensor.values));
  return constants_[name] = float_data_.back().data();
}

const void* TestGraph::AddInt64Constant(const std::string& name, std::vector<int64_t> values) {
  shapes_[name] = {static_cast<int64_t>(values.size())};
  int_data_.push_back(std::move(values));
  int64_constants_.insert(name);
  return constants_[name] = int_data_.back().data();
}

void TestGraph::AddLayer(std::string op_type, std::string name, std::vector<std::string> inputs,
                         std::vector<std::string> outputs, std::vector<Shape> output_shapes,
                         AttributeMap attributes) {
  TestLayer layer;
  layer.op.op_type = std::move(op_type);
  layer.op.name = std::move(name);
  layer.op.attributes = std::move(attributes);
  for (const auto& input : inputs) {
    if (input.empty()) {
      layer.op.inputs.push_back({});
      layer.op.constant_inputs.push_back(nullptr);
      continue;
    }
    auto constant = constants_.find(input);
    const bool is_int = int64_constants_.contains(input);
    layer.op.inputs.push_back({is_int ? DataType::kInt64 : DataType::kFloat32, shapes_.at(input)});
    layer.op.constant_inputs.push_back(constant == constants_.end() ? nullptr : constant->second);
  }
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    shapes_[outputs[k]] = output_shapes[k];
    layer.op.outputs.push_back({DataType::kFloat32, output_shapes[k]});
  }
  layer.inputs = std::move(inputs);
  layer.outputs = std::move(outputs);
  layers_.push_back(std::move(layer));
}

SubgraphDesc TestGraph::Subgraph() const {
  SubgraphDesc graph;
  for (const auto& layer : layers_) {
    graph.layers.push_back(layer.op);
    graph.layer_inputs.push_back(layer.inputs);
    graph.layer_outputs.push_back(layer.outputs);
  }
  for (const auto& name : input_names_) {
    graph.inputs.push_back(name);
    graph.input_infos.push_back({DataType::kFloat32, shapes_.at(name)});
  }
  for (const auto& name : outputs_) {
    graph.outputs.push_back(name);
    graph.output_infos.push_back({DataType::kFloat32, shapes_.at(name)});
  }
  return graph;
}

std::vector<ConstTensorView> TestGraph::InputViews() const {
  std::vector<ConstTensorView> views;
  for (const auto& name : input_names_) {
    const FloatTensor& tensor = inputs_.at(name);
    views.push_back({{DataType::kFloat32, tensor.shape}, tensor.values.data()});
  }
  return views;
}

Result<std::map<std::string, FloatTensor>> TestGraph::RunPerLayer(
    loader::BackendInstance& backend) const {
  std::map<std::string, FloatTensor> values = inputs_;
  for (const auto& layer : layers_) {
    BACKPLANE_RETURN_IF_ERROR(backend.IsSupported(layer.op));
    auto workload = backend.CreateWorkload(layer.op);
    if (!workload.ok())
      return workload.error();
    std::vector<ConstTensorView> inputs;
    for (std::size_t k = 0; k < layer.inputs.size(); ++k) {
      const std::string& name = layer.inputs[k];
      if (name.empty()) {
        inputs.push_back({});
      } else if (auto constant = constants_.find(name); constant != constants_.end()) {
        inputs.push_back({layer.op.inputs[k], constant->second});
      } else {
        const FloatTensor& tensor = values.at(name);
        inputs.push_back({{DataType::kFloat32, tensor.shape}, tensor.values.data()});
      }
    }
    std::vector<TensorView> outputs;
    for (const auto& name : layer.outputs) {
      FloatTensor& tensor = values[name];
      tensor.shape = shapes_.at(name);
      tensor.values.assign(static_cast<std::size_t>(ElementCount(tensor.shape)), NAN);
      outputs.push_back({{DataType::kFloat32, tensor.shape}, tensor.values.data()});
    }
    BACKPLANE_RETURN_IF_ERROR(workload.value()->Execute(inputs, outputs));
  }
  return values;
}

Result<std::map<std::string, FloatTensor>> TestGraph::RunCompiled(
    loader::BackendInstance& backend, std::vector<std::string>* notes,
    const BackendOptions& network_options) const {
  auto compiled = backend.CompileSubgraph(Subgraph(), network_options);
  if (!compiled.ok())
    return compiled.error();
  if (notes != nullptr)
    *notes = compiled.value().layer_notes;
  std::map<std::string, FloatTensor> results;
  std::vector<TensorView> outputs;
  for (const auto& name : outputs_) {
    FloatTensor& tensor = results[name];
    tensor.shape = shapes_.at(name);
    tensor.values.assign(static_cast<std::size_t>(ElementCount(tensor.shape)), NAN);
  }
  for (const auto& name : outputs_) {
    FloatTensor& tensor = results[name];
    outputs.push_back({{DataType::kFloat32, tensor.shape}, tensor.values.data()});
  }
  const auto inputs = InputViews();
  BACKPLANE_RETURN_IF_ERROR(compiled.value().workload->Execute(inputs, outputs));
  return results;
}

void ReleaseFreedMemory() {
#if defined(BACKPLANE_ASAN_BUILD)
  __sanitizer_purge_allocator();  // ASan's quarantine holds freed memory back from malloc_trim
#endif
  malloc_trim(0);
}

std::string Describe(const OperatorDesc& op) {
  std::ostringstream text;
  text << op.op_type << " node '" << op.name << "'";
  for (std::size_t k = 0; k < op.inputs.size(); ++k) {
    text << " " << ToString(op.inputs[k].shape)
         << (k < op.constant_inputs.size() && op.constant_inputs[k] ? "c" : "");
  }
  text << " ->";
  for (const auto& output : op.outputs)
    text << " " << ToString(output.shape);
  text << " {";
  for (const auto& [key, value] : op.attributes) {
    text << " " << key << "=";
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::vector<int64_t>>) {
            text << ToString(v);
          } else if constexpr (std::is_same_v<V, std::vector<float>>) {
            text << "[floats]";
          } else {
            text << v;
          }
        },
        value);
  }
  text << " }";
  return text.str();
}

std::string TestGraph::Describe() const {
  std::string text;
  for (const auto& layer : layers_)
    text += "\n  " + cpu_acc_test::Describe(layer.op);
  text += "\n  outputs:";
  for (const auto& name : outputs_)
    text += " " + name;
  return text;
}

struct CpuAccTest::Shared {
  std::unique_ptr<testing::TempDir> dir;
  std::unique_ptr<Runtime> runtime;
  std::shared_ptr<loader::BackendInstance> cpu_ref, cpu_acc;
};

CpuAccTest::Shared* CpuAccTest::shared_ = nullptr;

void CpuAccTest::SetUpTestSuite() {
  auto shared = std::make_unique<Shared>();
  shared->dir = std::make_unique<testing::TempDir>();
  fs::create_symlink(testing::CpuRefBackend(), *shared->dir / "Backplane_CpuRef_backend.so");
  fs::create_symlink(BACKPLANE_CPU_ACC, *shared->dir / "Backplane_CpuAcc_backend.so");
  auto runtime = Runtime::Create({.backend_paths = std::vector{shared->dir->path()},
                                  .default_preferences = {"CpuAcc", "CpuRef"}});
  if (!runtime.ok())
    throw std::runtime_error("Runtime::Create: " + runtime.error().ToString());
  shared->runtime = std::move(runtime).value();
  shared->cpu_ref = shared->runtime->Backend("CpuRef");
  shared->cpu_acc = shared->runtime->Backend("CpuAcc");
  if (shared->cpu_ref == nullptr || shared->cpu_acc == nullptr)
    throw std::runtime_error("CpuRef or CpuAcc did not load");
  shared_ = shared.release();
}

void CpuAccTest::TearDownTestSuite() {
  if (shared_ == nullptr)
    return;
  shared_->cpu_ref.reset();
  shared_->cpu_acc.reset();
  shared_->runtime.reset();
  delete shared_;
  shared_ = nullptr;
}

loader::BackendInstance& CpuAccTest::cpu_ref() {
  return *shared_->cpu_ref;
}
loader::BackendInstance& CpuAccTest::cpu_acc() {
  return *shared_->cpu_acc;
}
Runtime& CpuAccTest::runtime() {
  return *shared_->runtime;
}

bool AllClose(const std::vector<float>& actual, const std::vector<float>& expected,
              std::string* mismatch) {
  if (actual.size() != expected.size()) {
    *mismatch = "size " + std::to_string(actual.size()) + " vs " + std::to_string(expected.size());
    return false;
  }
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const float tolerance = 1e-4f + 1e-3f * std::abs(expected[i]);
    // Equal infinities agree (a max pool window entirely in the padding is -inf on both).
    if (actual[i] != expected[i] && !(std::abs(actual[i] - expected[i]) <= tolerance)) {
      *mismatch = "element " + std::to_string(i) + ": CpuAcc " + std::to_string(actual[i]) +
                  ", CpuRef " + std::to_string(expected[i]);
      return false;
    }
  }
  return true;
}

}  // namespace backplane::cpu_acc_test
