// CpuAcc tests: CpuRef and CpuAcc loaded for real through one Runtime (as a host loads them), and
// helpers that run an operator or a run of layers on each and compare.
#pragma once

#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backplane/runtime/runtime.hpp"

namespace backplane::cpu_acc_test {

// ../shared/data beside the checkout: the ONNX conformance cases and MNIST.
inline const std::filesystem::path kData = BACKPLANE_SHARED_DATA;

// Fewer random cases under a sanitizer (the same seeds; a prefix of the cases).
int Iterations(int release_count);

// A data-carrying FP32 tensor.
struct FloatTensor {
  Shape shape;
  std::vector<float> values;
};

// One layer of a test network: the operator and the names of its values.
struct TestLayer {
  OperatorDesc op;
  std::vector<std::string> inputs;  // "" for an omitted optional input
  std::vector<std::string> outputs;
};

// A small network built by a test: boundary inputs with data, constants (owned here, so that
// OperatorDesc::constant_inputs stay valid), layers in order.
class TestGraph {
 public:
  // A non-constant input of the graph with random data.
  void AddInput(const std::string& name, const Shape& shape, std::mt19937& rng);
  void SetInput(const std::string& name, FloatTensor tensor);
  // A constant; the returned pointer stays valid for the graph's life.
  const void* AddConstant(const std::string& name, FloatTensor tensor);
  const void* AddInt64Constant(const std::string& name, std::vector<int64_t> values);
  // Appends a layer; `inputs` name graph inputs, constants or earlier outputs. Shapes and
  // constant pointers of the OperatorDesc are filled in from the names.
  void AddLayer(std::string op_type, std::string name, std::vector<std::string> inputs,
                std::vector<std::string> outputs, std::vector<Shape> output_shapes,
                AttributeMap attributes = {});
  void MarkOutput(const std::string& name) { outputs_.push_back(name); }

  const std::vector<TestLayer>& layers() const { return layers_; }
  const std::vector<std::string>& outputs() const { return outputs_; }
  const Shape& ShapeOf(const std::string& name) const { return shapes_.at(name); }

  // The run of all layers as CompileSubgraph sees it.
  SubgraphDesc Subgraph() const;
  // Boundary input views in the order of Subgraph().inputs.
  std::vector<ConstTensorView> InputViews() const;

  // Runs every layer on `backend`, one workload per layer; every value by name.
  Result<std::map<std::string, FloatTensor>> RunPerLayer(loader::BackendInstance& backend) const;
  // Runs the whole graph as one compiled run on `backend`, with a network's own options (SDK 1.3)
  // when given; the graph's outputs by name.
  Result<std::map<std::string, FloatTensor>> RunCompiled(
      loader::BackendInstance& backend, std::vector<std::string>* notes,
      const BackendOptions& network_options = {}) const;

  // "Conv node 'c' X[1,3,8,8] W[4,3,3,3] -> [1,4,6,6] {pads=[1,1,1,1] strides=[2,2]}" per layer.
  std::string Describe() const;

 private:
  std::vector<std::string> input_names_;
  std::map<std::string, FloatTensor> inputs_;
  std::map<std::string, Shape> shapes_;
  std::map<std::string, const void*> constants_;
  std::deque<std::vector<float>> float_data_;
  std::deque<std::vector<int64_t>> int_data_;
  std::set<std::string> int64_constants_;  // typed INT64 in the layers that read them
  std::vector<TestLayer> layers_;
  std::vector<std::string> outputs_;
};

std::string Describe(const OperatorDesc& op);

// One runtime with CpuRef and CpuAcc loaded from a temporary backend directory, shared by the
// tests of a suite.
class CpuAccTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();

  static loader::BackendInstance& cpu_ref();
  static loader::BackendInstance& cpu_acc();
  static Runtime& runtime();

 private:
  struct Shared;
  static Shared* shared_;
};

// Hands freed heap memory back to the system (malloc_trim; under ASan its quarantine first), so
// that ResidentBytes counts what is held.
void ReleaseFreedMemory();

// Every element within atol 1e-4 + rtol 1e-3 (the tolerance); the first mismatch in
// `mismatch` when not.
bool AllClose(const std::vector<float>& actual, const std::vector<float>& expected,
              std::string* mismatch);

}  // namespace backplane::cpu_acc_test
