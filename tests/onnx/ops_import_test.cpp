// Import of the activation and arithmetic ops added for MobileNetV2 and SqueezeNet: Sub, Div,
// LeakyRelu, HardSigmoid, HardSwish, Clip, Dropout. Shapes, and the refusals that name the node:
// Clip bounds that are not constant scalars, Dropout in training mode or asked for its mask.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "import_refusal.hpp"
#include "model_builder.hpp"

namespace backplane {
namespace {

using ::backplane::testing::ExpectRefused;
using ::backplane::testing::ModelBuilder;
using ::backplane::testing::SetFloat;
using ::backplane::testing::SetInt;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The inferred info of output "y", or a failed test.
TensorInfo ImportedOutput(const ModelBuilder& model) {
  auto network = model.Import();
  EXPECT_TRUE(network.ok()) << network.error().ToString();
  if (!network.ok() || network->outputs.empty())
    return {};
  return network->outputs[0].info;
}

// x[2,3] → Clip(x, inputs...) → y, with "lo" = 0 and "hi" = 6 as initializers.
ModelBuilder ClipModel(std::vector<std::string> inputs) {
  ModelBuilder model;
  model.Input("x", {2, 3}).OutputNoShape("y");
  model.FloatInitializer("lo", {}, {0.0f}).FloatInitializer("hi", {}, {6.0f});
  inputs.insert(inputs.begin(), "x");
  model.Node("Clip", inputs, {"y"}, "relu6");
  return model;
}

TEST(OpsImportTest, SubAndDivBroadcastLikeAddAndMul) {
  for (const char* op : {"Sub", "Div"}) {
    SCOPED_TRACE(op);
    ModelBuilder model;
    model.Input("a", {2, 1, 3}).Input("b", {-1, 1}).OutputNoShape("y");
    model.Node(op, {"a", "b"}, {"y"}, "op");
    EXPECT_EQ(ImportedOutput(model), (TensorInfo{DataType::kFloat32, {2, -1, 3}}));
  }
}

TEST(OpsImportTest, SubRefusesShapesThatDoNotBroadcast) {
  ModelBuilder model;
  model.Input("a", {2, 3}).Input("b", {2}).OutputNoShape("y");
  model.Node("Sub", {"a", "b"}, {"y"}, "minus");
  ExpectRefused(
      model, StatusCode::kInvalidArgument,
      AllOf(HasSubstr("node 'minus' (Sub)"), HasSubstr("shapes [2,3] and [2] do not broadcast")));
}

TEST(OpsImportTest, ActivationsKeepTheShape) {
  ModelBuilder model;
  model.Input("x", {-1, 4}).OutputNoShape("y");
  SetFloat(model.Node("LeakyRelu", {"x"}, {"a"}, "leaky"), "alpha", 0.1f);
  auto& hard_sigmoid = model.Node("HardSigmoid", {"a"}, {"b"}, "hsig");
  SetFloat(hard_sigmoid, "alpha", 0.25f);
  SetFloat(hard_sigmoid, "beta", 0.4f);
  model.Node("HardSwish", {"b"}, {"c"}, "hswish");
  model.Node("Dropout", {"c"}, {"y"}, "drop");
  EXPECT_EQ(ImportedOutput(model), (TensorInfo{DataType::kFloat32, {-1, 4}}));
}

TEST(OpsImportTest, LeakyReluAlphaMustBeAFloat) {
  ModelBuilder model;
  model.Input("x", {4}).OutputNoShape("y");
  SetInt(model.Node("LeakyRelu", {"x"}, {"y"}, "leaky"), "alpha", 1);
  ExpectRefused(
      model, StatusCode::kInvalidArgument,
      AllOf(HasSubstr("node 'leaky' (LeakyRelu)"), HasSubstr("attribute 'alpha' must be a FLOAT")));
}

TEST(OpsImportTest, ClipTakesBothOneOrNoneOfItsBounds) {
  const std::vector<std::vector<std::string>> cases = {
      {"lo", "hi"}, {"lo"}, {"", "hi"}, {}, {"", ""}};
  for (const auto& bounds : cases) {
    SCOPED_TRACE(::testing::PrintToString(bounds));
    EXPECT_EQ(ImportedOutput(ClipModel(bounds)), (TensorInfo{DataType::kFloat32, {2, 3}}));
  }
}

TEST(OpsImportTest, ClipBoundFromAConstantNodeIsAccepted) {
  ModelBuilder model;
  model.Input("x", {3}).OutputNoShape("y");
  auto& constant = model.Node("Constant", {}, {"six"}, "six");
  auto* value = constant.add_attribute();
  value->set_name("value");
  value->set_type(onnx::AttributeProto::TENSOR);
  value->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  value->mutable_t()->add_float_data(6.0f);
  model.Node("Clip", {"x", "", "six"}, {"y"}, "clip");
  EXPECT_EQ(ImportedOutput(model), (TensorInfo{DataType::kFloat32, {3}}));
}

TEST(OpsImportTest, ClipRefusesABoundThatIsNotAConstant) {
  ModelBuilder model;
  model.Input("x", {2, 3}).Input("lo", {}).OutputNoShape("y");
  model.Node("Clip", {"x", "lo"}, {"y"}, "clip");
  ExpectRefused(
      model, StatusCode::kUnimplemented,
      AllOf(HasSubstr("node 'clip' (Clip)"), HasSubstr("min input 1 ('lo') must be a constant")));
}

TEST(OpsImportTest, ClipRefusesABoundThatIsNotAScalar) {
  ModelBuilder model;
  model.Input("x", {2, 3}).OutputNoShape("y");
  model.FloatInitializer("hi", {2}, {6.0f, 7.0f});
  model.Node("Clip", {"x", "", "hi"}, {"y"}, "clip");
  ExpectRefused(model, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'clip' (Clip)"),
                      HasSubstr("max input 2 ('hi') must be a scalar, has shape [2]")));
}

TEST(OpsImportTest, ClipRefusesClip6Attributes) {
  ModelBuilder model = ClipModel({});
  SetFloat(*model.proto().mutable_graph()->mutable_node(0), "max", 6.0f);
  ExpectRefused(model, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'relu6' (Clip)"), HasSubstr("attribute 'max' is Clip-6's")));
}

TEST(OpsImportTest, DropoutWithConstantFalseTrainingModeIsTheIdentity) {
  ModelBuilder model;
  model.Input("x", {2, 3}).OutputNoShape("y");
  model.FloatInitializer("ratio", {}, {0.5f}).BoolInitializer("training", {}, {false});
  model.Node("Dropout", {"x", "ratio", "training"}, {"y"}, "drop");
  EXPECT_EQ(ImportedOutput(model), (TensorInfo{DataType::kFloat32, {2, 3}}));
}

TEST(OpsImportTest, DropoutRefusesTrainingMode) {
  ModelBuilder model;
  model.Input("x", {2, 3}).OutputNoShape("y");
  model.BoolInitializer("training", {}, {true});
  model.Node("Dropout", {"x", "", "training"}, {"y"}, "drop");
  ExpectRefused(model, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 'drop' (Dropout)"),
                      HasSubstr("training_mode input 2 ('training') is true")));
}

TEST(OpsImportTest, DropoutRefusesItsMaskOutput) {
  ModelBuilder model;
  model.Input("x", {2, 3}).OutputNoShape("y");
  model.Node("Dropout", {"x"}, {"y", "mask"}, "drop");
  ExpectRefused(model, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 'drop' (Dropout)"),
                      HasSubstr("output 1 ('mask') is the BOOL mask, and BOOL tensors are not "
                                "supported")));
}

TEST(OpsImportTest, DropoutWithItsMaskLeftOutHasOneOutput) {
  // "" names an optional output not asked for; backends see only the outputs that exist.
  ModelBuilder model;
  model.Input("x", {2, 3}).OutputNoShape("y");
  model.Node("Dropout", {"x"}, {"y", ""}, "drop");
  auto network = model.Import();
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  ASSERT_EQ(network->nodes.size(), 1u);
  EXPECT_EQ(network->nodes[0].outputs, std::vector<std::string>{"y"});
}

// x[2,3] → Pad(x, pads, value) → y, pads and value as initializers.
ModelBuilder PadModel(std::vector<int64_t> pads, const std::string& mode = "") {
  ModelBuilder model;
  model.Input("x", {-1, 3}).OutputNoShape("y");
  model.Int64Initializer("pads", {static_cast<int64_t>(pads.size())}, pads);
  model.FloatInitializer("value", {}, {1.5f});
  auto& node = model.Node("Pad", {"x", "pads", "value"}, {"y"}, "pad");
  if (!mode.empty())
    ::backplane::testing::SetString(node, "mode", mode);
  return model;
}

TEST(OpsImportTest, PadAddsItsPadsAndCropsWithNegativeOnes) {
  // Axis 0 is dynamic and stays so; axis 1: 3 + 2 - 1.
  EXPECT_EQ(ImportedOutput(PadModel({1, 2, 0, -1})), (TensorInfo{DataType::kFloat32, {-1, 4}}));
  EXPECT_EQ(ImportedOutput(PadModel({0, 0, 0, 0}, "constant")),
            (TensorInfo{DataType::kFloat32, {-1, 3}}));
}

TEST(OpsImportTest, PadRefusesModesOtherThanConstant) {
  ExpectRefused(PadModel({0, 1, 0, 1}, "reflect"), StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 'pad' (Pad)"),
                      HasSubstr("mode 'reflect' is not supported (only 'constant')")));
  ExpectRefused(PadModel({0, 1, 0, 1}, "mirror"), StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'pad' (Pad)"), HasSubstr("unknown mode 'mirror'")));
}

TEST(OpsImportTest, PadRefusesPadsThatDoNotFit) {
  ExpectRefused(
      PadModel({1, 1}), StatusCode::kInvalidArgument,
      AllOf(HasSubstr("node 'pad' (Pad)"),
            HasSubstr("pads has 2 values, expected 4 (begin and end of each of 2 axes)")));
  ExpectRefused(PadModel({0, -2, 0, -2}), StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'pad' (Pad)"),
                      HasSubstr("axis 1: pads -2 and -2 crop a dim of 3 below 0")));
  ExpectRefused(PadModel({0, int64_t{1} << 62, 0, int64_t{1} << 62}), StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'pad' (Pad)"), HasSubstr("is beyond the limit of 2^40")));
}

TEST(OpsImportTest, PadRefusesPadsThatAreNotAConstant) {
  ModelBuilder model;
  model.Input("x", {2, 3}).Input("pads", {4}, onnx::TensorProto::INT64).OutputNoShape("y");
  model.Node("Pad", {"x", "pads"}, {"y"}, "pad");
  ExpectRefused(
      model, StatusCode::kUnimplemented,
      AllOf(HasSubstr("node 'pad' (Pad)"), HasSubstr("pads input 1 ('pads') must be a constant")));
}

TEST(OpsImportTest, PadRefusesPad2Attributes) {
  ModelBuilder model;
  model.Input("x", {2, 3}).OutputNoShape("y");
  ::backplane::testing::SetInts(model.Node("Pad", {"x"}, {"y"}, "pad"), "pads", {0, 1, 0, 1});
  ExpectRefused(
      model, StatusCode::kInvalidArgument,
      AllOf(HasSubstr("node 'pad' (Pad)"), HasSubstr("attributes 'pads' and 'value' are Pad-2's")));
}

}  // namespace
}  // namespace backplane
