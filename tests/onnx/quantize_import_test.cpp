// Import of QuantizeLinear and DequantizeLinear: the output types and shapes, per tensor and per
// axis (negative axes too), the opset-10 form, and every refusal naming the node and why: a scale
// that is zero, negative or not finite, a zero point of the wrong type or outside its type,
// per-axis lengths that do not match, scale and zero point of different shapes, an axis out of
// range. Also the batch rule: per axis 0 mixes rows, per tensor and other axes do not.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "backplane/onnx/row_independence.hpp"
#include "import_refusal.hpp"
#include "model_builder.hpp"

namespace backplane {
namespace {

using ::backplane::testing::ExpectRefused;
using ::backplane::testing::ModelBuilder;
using ::backplane::testing::SetInt;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int32_t kUint8 = onnx::TensorProto::UINT8;
constexpr int32_t kInt8 = onnx::TensorProto::INT8;
constexpr int32_t kUndefined = onnx::TensorProto::UNDEFINED;

Result<Network> Import(const ModelBuilder& model) {
  return model.Import();
}

// x[2,3,4] → QuantizeLinear(scale, zero) → q, declared without an element type (so that what
// the tests see is what inference gave).
ModelBuilder QuantizeModel(std::vector<int64_t> scale_dims, std::vector<float> scales,
                           int32_t zero_type, std::vector<int32_t> zeros) {
  ModelBuilder model;
  model.Input("x", {2, 3, 4}).Output("q", {2, 3, 4}, kUndefined);
  model.FloatInitializer("scale", scale_dims, std::move(scales));
  model.QuantizedInitializer("zero", scale_dims, zero_type, std::move(zeros));
  model.Node("QuantizeLinear", {"x", "scale", "zero"}, {"q"}, "quant");
  return model;
}

TEST(QuantizeImportTest, QuantizeGivesTheZeroPointsType) {
  for (const int32_t type : {kUint8, kInt8}) {
    auto network = Import(QuantizeModel({}, {0.5f}, type, {type == kInt8 ? -128 : 255}));
    ASSERT_TRUE(network.ok()) << network.error().ToString();
    EXPECT_EQ(network->outputs[0].info, (TensorInfo{static_cast<DataType>(type), {2, 3, 4}}));
  }
}

TEST(QuantizeImportTest, QuantizeWithoutZeroPointGivesUint8) {
  ModelBuilder model;
  model.Input("x", {-1, 3}).Output("q", {-1, 3}, kUndefined);
  model.FloatInitializer("scale", {}, {0.1f});
  model.Node("QuantizeLinear", {"x", "scale"}, {"q"}, "quant");
  auto network = Import(model);
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  EXPECT_EQ(network->outputs[0].info, (TensorInfo{DataType::kUint8, {-1, 3}}));
}

TEST(QuantizeImportTest, DequantizeGivesFloatOfTheInputsShape) {
  ModelBuilder model;
  model.Input("q", {-1, 3}, kInt8).Output("y", {-1, 3}, kUndefined);
  model.FloatInitializer("scale", {3}, {0.1f, 0.2f, 0.3f});
  model.QuantizedInitializer("zero", {3}, kInt8, {-128, 0, 127});
  SetInt(model.Node("DequantizeLinear", {"q", "scale", "zero"}, {"y"}, "dequant"), "axis", -1);
  auto network = Import(model);
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  EXPECT_EQ(network->inputs[0].info, (TensorInfo{DataType::kInt8, {-1, 3}}));
  EXPECT_EQ(network->outputs[0].info, (TensorInfo{DataType::kFloat32, {-1, 3}}));
}

TEST(QuantizeImportTest, PerAxisAcceptsEveryAxisPositiveAndNegative) {
  const std::vector<int64_t> dims = {2, 3, 4};
  for (int64_t axis = -3; axis < 3; ++axis) {
    const int64_t length = dims[axis < 0 ? axis + 3 : axis];
    ModelBuilder model = QuantizeModel({length}, std::vector<float>(length, 0.5f), kUint8,
                                       std::vector<int32_t>(length, 7));
    SetInt(*model.proto().mutable_graph()->mutable_node(0), "axis", axis);
    auto network = Import(model);
    EXPECT_TRUE(network.ok()) << "axis " << axis << ": " << network.error().ToString();
  }
}

TEST(QuantizeImportTest, AOneElementScaleIsPerTensorWhateverTheAxis) {
  // ONNX's reference broadcasts a [1] scale over the whole tensor, as ONNX Runtime does.
  ModelBuilder model = QuantizeModel({1}, {0.5f}, kUint8, {3});
  auto network = Import(model);
  EXPECT_TRUE(network.ok()) << network.error().ToString();
}

TEST(QuantizeImportTest, TheOpset10FormIsAccepted) {
  ModelBuilder model = QuantizeModel({}, {0.5f}, kInt8, {1});
  model.proto().mutable_opset_import(0)->set_version(10);
  model.Node("DequantizeLinear", {"q", "scale", "zero"}, {"y"}, "dequant");
  model.OutputNoShape("y");
  auto network = Import(model);
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  EXPECT_EQ(network->values.at("y"), (TensorInfo{DataType::kFloat32, {2, 3, 4}}));
}

TEST(QuantizeImportTest, PerAxisBeforeOpset13IsRefused) {
  ModelBuilder model = QuantizeModel({3}, {0.5f, 0.5f, 0.5f}, kUint8, {0, 0, 0});
  model.proto().mutable_opset_import(0)->set_version(12);
  ExpectRefused(model, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'quant' (QuantizeLinear)"), HasSubstr("needs opset 13")));
}

TEST(QuantizeImportTest, RefusesAScaleThatIsZeroNegativeOrNotFinite) {
  const float infinity = std::numeric_limits<float>::infinity();
  for (const float bad : {0.0f, -0.0f, -0.5f, infinity, std::nanf("")}) {
    SCOPED_TRACE("scale " + std::to_string(bad));
    ExpectRefused(
        QuantizeModel({3}, {0.5f, bad, 0.5f}, kUint8, {0, 0, 0}), StatusCode::kInvalidArgument,
        AllOf(StartsWith("model test.onnx: node 'quant' (QuantizeLinear): the scale"),
              HasSubstr("at index 1"), HasSubstr("a scale must be finite and greater than zero")));
  }
  // DequantizeLinear per tensor too.
  ModelBuilder model;
  model.Input("q", {4}, kUint8).OutputNoShape("y");
  model.FloatInitializer("scale", {}, {0.0f});
  model.Node("DequantizeLinear", {"q", "scale"}, {"y"}, "dequant");
  ExpectRefused(model, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'dequant' (DequantizeLinear): the scale"),
                      HasSubstr("greater than zero")));
}

TEST(QuantizeImportTest, RefusesAZeroPointOfAnotherTypeThanTheNodeRequires) {
  // QuantizeLinear: UINT8 or INT8 only.
  ModelBuilder model;
  model.Input("x", {4}).OutputNoShape("q");
  model.FloatInitializer("scale", {}, {0.5f});
  model.Int64Initializer("zero", {}, {0});
  model.Node("QuantizeLinear", {"x", "scale", "zero"}, {"q"}, "quant");
  ExpectRefused(model, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'quant' (QuantizeLinear): the zero point"),
                      HasSubstr("is INT64, expected UINT8 or INT8")));
  // DequantizeLinear: the type of x.
  ModelBuilder dequantize;
  dequantize.Input("q", {4}, kUint8).OutputNoShape("y");
  dequantize.FloatInitializer("scale", {}, {0.5f});
  dequantize.QuantizedInitializer("zero", {}, kInt8, {0});
  dequantize.Node("DequantizeLinear", {"q", "scale", "zero"}, {"y"}, "dequant");
  ExpectRefused(dequantize, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'dequant' (DequantizeLinear): the zero point"),
                      HasSubstr("is INT8, expected UINT8 as input 0")));
}

TEST(QuantizeImportTest, RefusesAZeroPointOutsideItsType) {
  // int32_data widens INT8 and UINT8: 300 would otherwise wrap to 44.
  for (const auto& [type, value] : std::vector<std::pair<int32_t, int32_t>>{
           {kUint8, 256}, {kUint8, -1}, {kInt8, 128}, {kInt8, -129}}) {
    SCOPED_TRACE(value);
    ExpectRefused(QuantizeModel({}, {0.5f}, type, {value}), StatusCode::kInvalidArgument,
                  AllOf(HasSubstr("initializer 'zero'"), HasSubstr(std::to_string(value)),
                        HasSubstr("outside the range of its data type")));
  }
}

TEST(QuantizeImportTest, RefusesPerAxisLengthsThatDoNotMatchTheAxis) {
  ModelBuilder model = QuantizeModel({4}, {0.5f, 0.5f, 0.5f, 0.5f}, kUint8, {0, 0, 0, 0});
  // Default axis 1: dimension 3, not 4.
  ExpectRefused(
      model, StatusCode::kInvalidArgument,
      AllOf(StartsWith("model test.onnx: node 'quant' (QuantizeLinear): shape mismatch"),
            HasSubstr("per-axis scale and zero point length vs dimension 1"), HasSubstr("4 vs 3")));
}

TEST(QuantizeImportTest, RefusesScaleAndZeroPointOfDifferentShapes) {
  ModelBuilder model;
  model.Input("x", {2, 3}).OutputNoShape("q");
  model.FloatInitializer("scale", {3}, {0.5f, 0.5f, 0.5f});
  model.QuantizedInitializer("zero", {}, kUint8, {0});
  model.Node("QuantizeLinear", {"x", "scale", "zero"}, {"q"}, "quant");
  ExpectRefused(model, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'quant' (QuantizeLinear)"),
                      HasSubstr("the zero point, input 2 ('zero') [], and the scale, input 1 "
                                "('scale') [3], must have the same shape")));
}

TEST(QuantizeImportTest, RefusesAnAxisOutOfRange) {
  for (const int64_t axis : {3, -4}) {
    ModelBuilder model = QuantizeModel({3}, {0.5f, 0.5f, 0.5f}, kUint8, {0, 0, 0});
    SetInt(*model.proto().mutable_graph()->mutable_node(0), "axis", axis);
    ExpectRefused(model, StatusCode::kInvalidArgument,
                  AllOf(HasSubstr("node 'quant' (QuantizeLinear)"),
                        HasSubstr("attribute 'axis' = " + std::to_string(axis) +
                                  " is out of range for rank 3")));
  }
}

TEST(QuantizeImportTest, RefusesBlockedQuantizationAndOutputDtype) {
  ModelBuilder blocked = QuantizeModel({}, {0.5f}, kUint8, {0});
  SetInt(*blocked.proto().mutable_graph()->mutable_node(0), "block_size", 2);
  ExpectRefused(
      blocked, StatusCode::kUnimplemented,
      AllOf(HasSubstr("node 'quant' (QuantizeLinear)"), HasSubstr("blocked quantization")));
  ModelBuilder typed = QuantizeModel({}, {0.5f}, kUint8, {0});
  SetInt(*typed.proto().mutable_graph()->mutable_node(0), "output_dtype", kInt8);
  ExpectRefused(typed, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 'quant' (QuantizeLinear)"), HasSubstr("output_dtype")));
}

TEST(QuantizeImportTest, RefusesAFloatInputToDequantize) {
  ModelBuilder model;
  model.Input("x", {4}).OutputNoShape("y");
  model.FloatInitializer("scale", {}, {0.5f});
  model.Node("DequantizeLinear", {"x", "scale"}, {"y"}, "dequant");
  ExpectRefused(model, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 'dequant' (DequantizeLinear)"),
                      HasSubstr("FP32 for input 0 ('x'), expected UINT8, INT8 or INT32")));
}

// x[N,3] → QuantizeLinear → DequantizeLinear, per tensor or per axis `axis`.
ModelBuilder BatchedQdq(std::optional<int64_t> axis, int64_t length) {
  ModelBuilder model;
  model.Input("x", {-1, 3}).Output("y", {-1, 3});
  const std::vector<int64_t> shape = axis ? std::vector<int64_t>{length} : std::vector<int64_t>{};
  model.FloatInitializer("scale", shape, std::vector<float>(length, 0.5f));
  auto& quantize = model.Node("QuantizeLinear", {"x", "scale"}, {"q"}, "quant");
  auto& dequantize = model.Node("DequantizeLinear", {"q", "scale"}, {"y"}, "dequant");
  if (axis) {
    SetInt(quantize, "axis", *axis);
    SetInt(dequantize, "axis", *axis);
  }
  return model;
}

TEST(QuantizeImportTest, BatchRuleAcceptsPerTensorAndPerAxisAwayFromTheBatch) {
  for (const auto& [axis, length] : std::vector<std::pair<std::optional<int64_t>, int64_t>>{
           {std::nullopt, 1}, {1, 3}, {-1, 3}}) {
    auto network = Import(BatchedQdq(axis, length));
    ASSERT_TRUE(network.ok()) << network.error().ToString();
    const Status status = CheckRowsIndependent(*network);
    EXPECT_TRUE(status.ok()) << status.ToString();
  }
}

TEST(QuantizeImportTest, BatchRuleRefusesPerAxisOnTheBatch) {
  for (const int64_t axis : {0, -2}) {
    auto network = Import(BatchedQdq(axis, 4));
    ASSERT_TRUE(network.ok()) << network.error().ToString();
    const Status status = CheckRowsIndependent(*network);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(),
                AllOf(StartsWith("node 'quant' (QuantizeLinear) has a scale of shape [4] per "
                                 "index of axis 0, the batch dimension"),
                      HasSubstr("row r would meet scale r")));
  }
}

}  // namespace
}  // namespace backplane
