// Models of opset 7 to 12: each old form is rewritten at import into its opset-13 form (checked
// here on the imported Network), or refused with the code and a message naming the node, the
// opset and the reason. That the rewritten forms compute what opset 13 computes is checked by
// running them (tests/backends/opset_upgrade_network_test.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "model_builder.hpp"

namespace backplane {
namespace {

using ::backplane::testing::ModelBuilder;
using ::backplane::testing::SetFloat;
using ::backplane::testing::SetInt;
using ::backplane::testing::SetInts;
using ::backplane::testing::SetString;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelBuilder ModelAtOpset(int64_t opset) {
  ModelBuilder model;
  model.proto().mutable_opset_import(0)->set_version(opset);
  return model;
}

Network ImportedOrEmpty(const ModelBuilder& model) {
  auto network = model.Import();
  EXPECT_TRUE(network.ok()) << network.error().ToString();
  return network.ok() ? std::move(network).value() : Network{};
}

void ExpectUpgradeRefused(const ModelBuilder& model, StatusCode code,
                          const ::testing::Matcher<const std::string&>& message) {
  auto result = model.Import();
  ASSERT_FALSE(result.ok()) << "import succeeded";
  EXPECT_EQ(result.error().code(), code) << result.error().ToString();
  EXPECT_THAT(result.error().message(), message);
}

std::vector<float> ConstantFloats(const Network& network, const std::string& name) {
  auto it = network.constants.find(name);
  if (it == network.constants.end())
    return {};
  auto values = it->second.Elements<float>();
  return {values.begin(), values.end()};
}

int64_t IntAttribute(const Node& node, const std::string& key) {
  auto it = node.attributes.find(key);
  if (it == node.attributes.end() || !std::holds_alternative<int64_t>(it->second))
    return -100;
  return std::get<int64_t>(it->second);
}

TEST(OpsetUpgradeTest, SoftmaxDefaultAxisOnTheLastAxisBecomesExplicit) {
  // Before 13 the default axis is 1; on a rank-2 input that is the last axis.
  ModelBuilder model = ModelAtOpset(11);
  model.Input("x", {2, 3}).Output("y", {2, 3});
  model.Node("Softmax", {"x"}, {"y"}, "sm");
  const Network network = ImportedOrEmpty(model);
  ASSERT_EQ(network.nodes.size(), 1u);
  EXPECT_EQ(IntAttribute(network.nodes[0], "axis"), 1);
  EXPECT_EQ(network.opset, 11);
}

TEST(OpsetUpgradeTest, SoftmaxNegativeAxisBecomesTheExplicitLastAxis) {
  ModelBuilder model = ModelAtOpset(12);
  model.Input("x", {2, 3, 4}).Output("y", {2, 3, 4});
  SetInt(model.Node("Softmax", {"x"}, {"y"}, "sm"), "axis", -1);
  const Network network = ImportedOrEmpty(model);
  ASSERT_EQ(network.nodes.size(), 1u);
  EXPECT_EQ(IntAttribute(network.nodes[0], "axis"), 2);
}

TEST(OpsetUpgradeTest, SoftmaxAxisFollowedByOnesIsKept) {
  // A classifier head: [N, C, 1, 1] coerced to [N, C] is Softmax over C.
  ModelBuilder model = ModelAtOpset(9);
  model.Input("x", {-1, 5, 1, 1}).Output("y", {-1, 5, 1, 1});
  model.Node("Softmax", {"x"}, {"y"}, "sm");
  const Network network = ImportedOrEmpty(model);
  ASSERT_EQ(network.nodes.size(), 1u);
  EXPECT_EQ(IntAttribute(network.nodes[0], "axis"), 1);
}

TEST(OpsetUpgradeTest, SoftmaxOverSeveralAxesBecomesFlattenSoftmaxReshape) {
  ModelBuilder model = ModelAtOpset(11);
  model.Input("x", {2, 3, 4}).Output("z", {2, 3, 4});
  model.Node("Softmax", {"x"}, {"y"}, "sm");
  model.Node("Relu", {"y"}, {"z"}, "after");  // its consumer keeps reading "y"
  const Network network = ImportedOrEmpty(model);
  ASSERT_EQ(network.nodes.size(), 4u);
  const Node& flatten = network.nodes[0];
  const Node& softmax = network.nodes[1];
  const Node& reshape = network.nodes[2];
  EXPECT_EQ(flatten.op_type, "Flatten");
  EXPECT_EQ(IntAttribute(flatten, "axis"), 1);
  EXPECT_THAT(flatten.inputs, ElementsAre("x"));
  EXPECT_EQ(softmax.op_type, "Softmax");
  EXPECT_EQ(softmax.name, "sm");
  EXPECT_EQ(IntAttribute(softmax, "axis"), 1);
  EXPECT_THAT(softmax.inputs, ElementsAre(flatten.outputs[0]));
  EXPECT_EQ(reshape.op_type, "Reshape");
  ASSERT_EQ(reshape.inputs.size(), 2u);
  EXPECT_EQ(reshape.inputs[0], softmax.outputs[0]);
  EXPECT_THAT(reshape.outputs, ElementsAre("y"));
  EXPECT_EQ(network.nodes[3].op_type, "Relu");
  EXPECT_EQ(network.values.at(flatten.outputs[0]).shape, (Shape{2, 12}));
  EXPECT_EQ(network.values.at(softmax.outputs[0]).shape, (Shape{2, 12}));
  EXPECT_EQ(network.values.at("y").shape, (Shape{2, 3, 4}));
  const auto target = network.constants.at(reshape.inputs[1]).Elements<int64_t>();
  EXPECT_THAT(std::vector<int64_t>(target.begin(), target.end()), ElementsAre(2, 3, 4));
}

TEST(OpsetUpgradeTest, SoftmaxRewriteKeepsOneUnknownDimensionAsMinusOne) {
  // A symbolic batch: the Reshape back infers it from the element count.
  ModelBuilder model = ModelAtOpset(12);
  model.Input("x", {-1, 3, 4}).OutputNoShape("y");
  model.Node("Softmax", {"x"}, {"y"}, "sm");
  const Network network = ImportedOrEmpty(model);
  ASSERT_EQ(network.nodes.size(), 3u);
  const auto target = network.constants.at(network.nodes[2].inputs[1]).Elements<int64_t>();
  EXPECT_THAT(std::vector<int64_t>(target.begin(), target.end()), ElementsAre(-1, 3, 4));
  EXPECT_EQ(network.values.at(network.nodes[0].outputs[0]).shape, (Shape{-1, 12}));
}

TEST(OpsetUpgradeTest, SoftmaxRewriteNamesDoNotCollideWithTheModels) {
  ModelBuilder model = ModelAtOpset(11);
  model.Input("x", {2, 3, 4}).OutputNoShape("y");
  model.Node("Relu", {"x"}, {"sm/flattened"}, "sm/flatten");
  model.Node("Softmax", {"sm/flattened"}, {"y"}, "sm");
  const Network network = ImportedOrEmpty(model);
  ASSERT_EQ(network.nodes.size(), 4u);
  EXPECT_EQ(network.nodes[1].op_type, "Flatten");
  EXPECT_NE(network.nodes[1].name, "sm/flatten");
  EXPECT_NE(network.nodes[1].outputs[0], "sm/flattened");
  EXPECT_THAT(network.nodes[1].inputs, ElementsAre("sm/flattened"));
}

TEST(OpsetUpgradeTest, SoftmaxOverSeveralAxesWithTwoUnknownDimensionsIsRefused) {
  // The Reshape back could not tell the two unknown dimensions apart.
  ModelBuilder model = ModelAtOpset(12);
  model.Input("x", {-1, 3, -1}).OutputNoShape("y");
  model.Node("Softmax", {"x"}, {"y"}, "sm");
  ExpectUpgradeRefused(model, StatusCode::kUnimplemented,
                       AllOf(HasSubstr("node 'sm' (Softmax) at opset 12"),
                             HasSubstr("normalises its input [-1,3,-1] over axes 1 to 2"),
                             HasSubstr("2 are unknown")));
}

TEST(OpsetUpgradeTest, SoftmaxRankIsKnownAfterAnEarlierNode) {
  // The rank comes from shape inference of the nodes before, done as the rewrite goes.
  ModelBuilder model = ModelAtOpset(10);
  model.Input("x", {2, 3, 4}).OutputNoShape("y");
  model.Int64Initializer("shape", {2}, {6, 4});
  model.Node("Reshape", {"x", "shape"}, {"r"}, "reshape");
  model.Node("Softmax", {"r"}, {"y"}, "sm");
  const Network network = ImportedOrEmpty(model);
  ASSERT_EQ(network.nodes.size(), 2u);
  EXPECT_EQ(IntAttribute(network.nodes[1], "axis"), 1);
}

TEST(OpsetUpgradeTest, SoftmaxAxisOutOfRangeIsInvalid) {
  ModelBuilder model = ModelAtOpset(11);
  model.Input("x", {2, 3}).OutputNoShape("y");
  SetInt(model.Node("Softmax", {"x"}, {"y"}, "sm"), "axis", 2);
  ExpectUpgradeRefused(
      model, StatusCode::kInvalidArgument,
      AllOf(HasSubstr("node 'sm' (Softmax)"), HasSubstr("'axis' = 2 is out of range for rank 2")));
}

TEST(OpsetUpgradeTest, Clip6AttributesBecomeConstantInputs) {
  ModelBuilder model = ModelAtOpset(10);
  model.Input("x", {2, 3}).Output("y", {2, 3});
  auto& clip = model.Node("Clip", {"x"}, {"y"}, "relu6");
  SetFloat(clip, "min", 0.0f);
  SetFloat(clip, "max", 6.0f);
  const Network network = ImportedOrEmpty(model);
  ASSERT_EQ(network.nodes.size(), 1u);
  const Node& node = network.nodes[0];
  EXPECT_TRUE(node.attributes.empty());
  EXPECT_THAT(node.inputs, ElementsAre("x", "relu6/min", "relu6/max"));
  EXPECT_THAT(ConstantFloats(network, "relu6/min"), ElementsAre(0.0f));
  EXPECT_THAT(ConstantFloats(network, "relu6/max"), ElementsAre(6.0f));
}

TEST(OpsetUpgradeTest, Clip6DefaultsAreTheFloatLimits) {
  // Not "no bound": Clip-6 maps -inf to the lowest float.
  ModelBuilder model = ModelAtOpset(7);
  model.Input("x", {2, 3}).Output("y", {2, 3});
  SetFloat(model.Node("Clip", {"x"}, {"y"}, "clip"), "max", 1.0f);
  const Network network = ImportedOrEmpty(model);
  EXPECT_THAT(ConstantFloats(network, "clip/min"),
              ElementsAre(std::numeric_limits<float>::lowest()));
  EXPECT_THAT(ConstantFloats(network, "clip/max"), ElementsAre(1.0f));
}

TEST(OpsetUpgradeTest, AddedConstantsTakeUnusedNames) {
  ModelBuilder model = ModelAtOpset(10);
  model.Input("x", {2, 3}).Output("y", {2, 3});
  model.FloatInitializer("clip/min", {2, 3});
  model.Node("Add", {"x", "clip/min"}, {"a"}, "add");
  SetFloat(model.Node("Clip", {"a"}, {"y"}, "clip"), "min", -1.0f);
  const Network network = ImportedOrEmpty(model);
  ASSERT_EQ(network.nodes.size(), 2u);
  EXPECT_THAT(network.nodes[1].inputs, ElementsAre("a", "clip/min_1", "clip/max"));
  EXPECT_THAT(ConstantFloats(network, "clip/min_1"), ElementsAre(-1.0f));
}

TEST(OpsetUpgradeTest, Clip6WithASecondInputIsInvalid) {
  ModelBuilder model = ModelAtOpset(10);
  model.Input("x", {2, 3}).OutputNoShape("y");
  model.FloatInitializer("lo", {}, {0.0f});
  model.Node("Clip", {"x", "lo"}, {"y"}, "clip");
  ExpectUpgradeRefused(model, StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("node 'clip' (Clip) at opset 10"),
                             HasSubstr("Clip-6 takes one input, the node has 2")));
}

TEST(OpsetUpgradeTest, DropoutRatioAttributeIsDropped) {
  ModelBuilder model = ModelAtOpset(10);
  model.Input("x", {2, 3}).Output("y", {2, 3});
  SetFloat(model.Node("Dropout", {"x"}, {"y"}, "drop"), "ratio", 0.3f);
  const Network network = ImportedOrEmpty(model);
  ASSERT_EQ(network.nodes.size(), 1u);
  EXPECT_TRUE(network.nodes[0].attributes.empty());
  EXPECT_THAT(network.nodes[0].inputs, ElementsAre("x"));
}

TEST(OpsetUpgradeTest, Dropout7WithARatioInputIsInvalid) {
  ModelBuilder model = ModelAtOpset(11);
  model.Input("x", {2, 3}).OutputNoShape("y");
  model.FloatInitializer("ratio", {}, {0.5f});
  model.Node("Dropout", {"x", "ratio"}, {"y"}, "drop");
  ExpectUpgradeRefused(model, StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("node 'drop' (Dropout) at opset 11"),
                             HasSubstr("Dropout-7 takes one input, the node has 2")));
}

TEST(OpsetUpgradeTest, Pad2AttributesBecomeConstantInputs) {
  ModelBuilder model = ModelAtOpset(10);
  model.Input("x", {2, 3}).Output("y", {3, 5});
  auto& pad = model.Node("Pad", {"x"}, {"y"}, "pad");
  SetInts(pad, "pads", {1, 0, 0, 2});
  SetFloat(pad, "value", 2.5f);
  SetString(pad, "mode", "constant");
  const Network network = ImportedOrEmpty(model);
  ASSERT_EQ(network.nodes.size(), 1u);
  const Node& node = network.nodes[0];
  EXPECT_THAT(node.inputs, ElementsAre("x", "pad/pads", "pad/constant_value"));
  EXPECT_EQ(node.attributes.size(), 1u);  // mode stays
  const auto pads = network.constants.at("pad/pads").Elements<int64_t>();
  EXPECT_THAT(std::vector<int64_t>(pads.begin(), pads.end()), ElementsAre(1, 0, 0, 2));
  EXPECT_THAT(ConstantFloats(network, "pad/constant_value"), ElementsAre(2.5f));
  EXPECT_EQ(network.values.at("y").shape, (Shape{3, 5}));
}

TEST(OpsetUpgradeTest, Pad2WithoutPadsIsInvalid) {
  ModelBuilder model = ModelAtOpset(10);
  model.Input("x", {2, 3}).OutputNoShape("y");
  model.Node("Pad", {"x"}, {"y"}, "pad");
  ExpectUpgradeRefused(model, StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("node 'pad' (Pad) at opset 10"),
                             HasSubstr("Pad-2 requires the attribute 'pads'")));
}

TEST(OpsetUpgradeTest, Pad2ReflectModeIsRefusedAsAtOpset13) {
  ModelBuilder model = ModelAtOpset(10);
  model.Input("x", {2, 3}).OutputNoShape("y");
  auto& pad = model.Node("Pad", {"x"}, {"y"}, "pad");
  SetInts(pad, "pads", {0, 1, 0, 1});
  SetString(pad, "mode", "reflect");
  ExpectUpgradeRefused(
      model, StatusCode::kUnimplemented,
      AllOf(HasSubstr("node 'pad' (Pad)"), HasSubstr("mode 'reflect' is not supported")));
}

ModelBuilder BatchNormalizationAtOpset(int64_t opset) {
  ModelBuilder model = ModelAtOpset(opset);
  model.Input("x", {1, 2, 2, 2}).Output("y", {1, 2, 2, 2});
  model.FloatInitializer("scale", {2}, {1.0f, 2.0f}).FloatInitializer("bias", {2}, {0.0f, 1.0f});
  model.FloatInitializer("mean", {2}, {0.5f, -1.0f}).FloatInitializer("var", {2}, {1.0f, 4.0f});
  model.Node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"y"}, "bn");
  return model;
}

TEST(OpsetUpgradeTest, BatchNormalizationSpatialOneIsDropped) {
  ModelBuilder model = BatchNormalizationAtOpset(8);
  SetInt(*model.proto().mutable_graph()->mutable_node(0), "spatial", 1);
  const Network network = ImportedOrEmpty(model);
  ASSERT_EQ(network.nodes.size(), 1u);
  EXPECT_FALSE(network.nodes[0].attributes.contains("spatial"));
}

TEST(OpsetUpgradeTest, BatchNormalizationSpatialZeroIsRefused) {
  ModelBuilder model = BatchNormalizationAtOpset(7);
  SetInt(*model.proto().mutable_graph()->mutable_node(0), "spatial", 0);
  ExpectUpgradeRefused(model, StatusCode::kUnimplemented,
                       AllOf(HasSubstr("node 'bn' (BatchNormalization) at opset 7"),
                             HasSubstr("spatial=0"), HasSubstr("only spatial=1")));
}

TEST(OpsetUpgradeTest, Opset13ModelIsNotRewritten) {
  // From 13 on a Clip attribute is not rewritten but refused (shape inference).
  ModelBuilder model = ModelAtOpset(13);
  model.Input("x", {2, 3}).OutputNoShape("y");
  SetFloat(model.Node("Clip", {"x"}, {"y"}, "clip"), "max", 6.0f);
  ExpectUpgradeRefused(
      model, StatusCode::kInvalidArgument,
      AllOf(HasSubstr("node 'clip' (Clip)"), HasSubstr("attribute 'max' is Clip-6's")));
}

}  // namespace
}  // namespace backplane
