// Loads the real CpuRef backend through Runtime (as a host does) and runs single operators on it.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backplane/runtime/runtime.hpp"

namespace backplane::cpu_ref_test {

// A data-carrying FP32 input or output: its shape and its elements.
struct FloatTensor {
  Shape shape;
  std::vector<float> values;
};

// An operator description with FP32 inputs and outputs of the given shapes.
OperatorDesc MakeOp(std::string op_type, std::vector<Shape> inputs, std::vector<Shape> outputs,
                    AttributeMap attributes = {});

// `op` with input `index` turned into a constant of `type` at `data` (which must outlive every
// workload created from the result), as the runtime describes an initializer.
OperatorDesc WithConstantInput(OperatorDesc op, std::size_t index, const void* data,
                               DataType type = DataType::kFloat32);
// `op` with input `index` omitted (an ONNX "" input): undefined type, no shape, no constant.
OperatorDesc WithOmittedInput(OperatorDesc op, std::size_t index);

// One runtime with CpuRef loaded from a temporary backend directory, shared by the tests of a
// suite (SetUpTestSuite/TearDownTestSuite).
class CpuRefTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();

  static loader::BackendInstance& backend();

  // Creates a workload for `op`, runs it once on `inputs` (their shapes are the request's), with
  // outputs allocated with `output_shapes`, and returns the outputs' values. Fails the test
  // (ADD_FAILURE) and returns empty on any error.
  static std::vector<float> Run(const OperatorDesc& op, const std::vector<FloatTensor>& inputs,
                                const Shape& output_shape);
  // The same with the shapes of `op` and its single output.
  static std::vector<float> Run(const OperatorDesc& op,
                                const std::vector<std::vector<float>>& inputs);

  // The status of one execution, for the error paths.
  static Status TryRun(const OperatorDesc& op, const std::vector<ConstTensorView>& inputs,
                       const std::vector<TensorView>& outputs);

 private:
  struct Shared;
  static Shared* shared_;
};

// start, start + 1, ... (n values): inputs whose every element differs.
std::vector<float> Iota(int n, float start = 0);

// Element-wise comparison with a relative+absolute tolerance suited to FP32 kernels that
// accumulate in double.
::testing::Matcher<const std::vector<float>&> FloatsNear(std::vector<float> expected,
                                                         float tolerance = 1e-5f);

}  // namespace backplane::cpu_ref_test
