// Import of well-formed models: IR contents, ordering, constants, attributes, and shape inference
// with fixed and dynamic dimensions.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "model_builder.hpp"

namespace backplane {
namespace {

using ::backplane::testing::ModelBuilder;
using ::backplane::testing::SetInt;
using ::backplane::testing::SetInts;
using ::backplane::testing::SetString;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TensorInfo Float(Shape shape) {
  return {DataType::kFloat32, std::move(shape)};
}

Network ImportOrDie(const ModelBuilder& model, const ImportOptions& options = {}) {
  auto network = model.Import(options);
  EXPECT_TRUE(network.ok()) << network.error().ToString();
  return network.ok() ? std::move(network).value() : Network{};
}

// Output shape of a single-node model with input x of `input_shape`.
Shape SingleNodeShape(const std::string& op, Shape input_shape,
                      const std::function<void(onnx::NodeProto&)>& set_attributes) {
  ModelBuilder model;
  model.Input("x", input_shape).OutputNoShape("y");
  set_attributes(model.Node(op, {"x"}, {"y"}, "op"));
  Network network = ImportOrDie(model);
  return network.outputs.empty() ? Shape{} : network.outputs[0].info.shape;
}

TEST(NetworkImportTest, DynamicBatchGemmIsResolvedPerRequest) {
  ModelBuilder model;
  model.Input("x", {-1, 4}).Output("y", {-1, 5});
  model.FloatInitializer("w", {4, 5}).FloatInitializer("b", {5});
  model.Node("Gemm", {"x", "w", "b"}, {"y"}, "dense");
  Network network = ImportOrDie(model);
  ASSERT_EQ(network.inputs.size(), 1u);  // initializers are not network inputs
  EXPECT_EQ(network.inputs[0].info, Float({-1, 4}));
  EXPECT_EQ(network.values.at("y"), Float({-1, 5}));
  EXPECT_EQ(network.outputs[0].info, Float({-1, 5}));

  const std::vector<TensorInfo> request = {Float({3, 4})};
  auto values = InferShapes(network, request);
  ASSERT_TRUE(values.ok()) << values.error().ToString();
  EXPECT_EQ(values->at("y"), Float({3, 5}));
  EXPECT_EQ(values->at("x"), Float({3, 4}));
  EXPECT_EQ(values->at("w"), Float({4, 5}));
}

TEST(NetworkImportTest, InferShapesRejectsRequestsThatDoNotFit) {
  ModelBuilder model;
  model.Input("x", {-1, 4}).Output("y", {-1, 5});
  model.FloatInitializer("w", {4, 5});
  model.Node("Gemm", {"x", "w"}, {"y"}, "dense");
  Network network = ImportOrDie(model);

  const std::vector<TensorInfo> wrong_dim = {Float({3, 5})};
  auto result = InferShapes(network, wrong_dim);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(result.error().message(), HasSubstr("input 'x' has shape [3,5]"));

  const std::vector<TensorInfo> wrong_type = {{DataType::kInt64, {3, 4}}};
  result = InferShapes(network, wrong_type);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.error().message(), HasSubstr("input 'x' must be FP32, got INT64"));

  const std::vector<TensorInfo> dynamic = {Float({-1, 4})};
  EXPECT_FALSE(InferShapes(network, dynamic).ok());
  EXPECT_FALSE(InferShapes(network, {}).ok());
}

TEST(NetworkImportTest, DynamicDimensionPropagatesThroughConvPoolAndReshape) {
  ModelBuilder model;
  model.Input("x", {-1, 1, 8, 8}).OutputNoShape("y");
  model.FloatInitializer("w", {4, 1, 3, 3});
  auto& conv = model.Node("Conv", {"x", "w"}, {"c"}, "conv");
  SetString(conv, "auto_pad", "SAME_UPPER");
  auto& pool = model.Node("MaxPool", {"c"}, {"p"}, "pool");
  SetInts(pool, "kernel_shape", {2, 2});
  SetInts(pool, "strides", {2, 2});
  model.Int64Initializer("shape", {2}, {0, -1});
  model.Node("Reshape", {"p", "shape"}, {"y"}, "flatten");
  Network network = ImportOrDie(model);
  EXPECT_EQ(network.values.at("c"), Float({-1, 4, 8, 8}));
  EXPECT_EQ(network.values.at("p"), Float({-1, 4, 4, 4}));
  EXPECT_EQ(network.values.at("y"), Float({-1, 64}));

  const std::vector<TensorInfo> request = {Float({2, 1, 8, 8})};
  auto values = InferShapes(network, request);
  ASSERT_TRUE(values.ok()) << values.error().ToString();
  EXPECT_EQ(values->at("y"), Float({2, 64}));
}

TEST(NetworkImportTest, NodesOutOfOrderAreSortedAndUnnamedNodesGetNames) {
  ModelBuilder model;
  model.Input("x", {2, 3}).Output("y", {2, 3});
  model.Node("Tanh", {"r"}, {"y"});
  model.Node("Relu", {"x"}, {"r"});
  Network network = ImportOrDie(model);
  ASSERT_EQ(network.nodes.size(), 2u);
  EXPECT_EQ(network.nodes[0].name, "Relu_1");
  EXPECT_EQ(network.nodes[1].name, "Tanh_0");
  EXPECT_THAT(network.nodes[0].inputs, ElementsAre("x"));
  EXPECT_THAT(network.nodes[1].outputs, ElementsAre("y"));
}

TEST(NetworkImportTest, WellOrderedNodesKeepTheirOrder) {
  ModelBuilder model;
  model.Input("x", {2}).Output("y", {2});
  model.Node("Relu", {"x"}, {"a"}, "a");
  model.Node("Sigmoid", {"x"}, {"b"}, "b");
  model.Node("Add", {"a", "b"}, {"y"}, "c");
  Network network = ImportOrDie(model);
  ASSERT_EQ(network.nodes.size(), 3u);
  EXPECT_EQ(network.nodes[0].name, "a");
  EXPECT_EQ(network.nodes[1].name, "b");
  EXPECT_EQ(network.nodes[2].name, "c");
}

TEST(NetworkImportTest, ConstantNodesAndInitializersBecomeConstants) {
  ModelBuilder model;
  model.Input("x", {2}).Input("w", {2}).Output("y", {2});
  model.FloatInitializer("w", {2});  // listed as an input too, as IR < 4 requires
  auto& constant = model.Node("Constant", {}, {"c"}, "const");
  auto* attribute = constant.add_attribute();
  attribute->set_name("value");
  attribute->set_type(onnx::AttributeProto::TENSOR);
  auto* tensor = attribute->mutable_t();
  tensor->set_data_type(onnx::TensorProto::FLOAT);
  tensor->add_dims(2);
  const float values[] = {1.5f, -2.0f};
  tensor->set_raw_data(values, sizeof(values));
  model.Node("Add", {"x", "w"}, {"s"}, "add");
  model.Node("Mul", {"s", "c"}, {"y"}, "mul");
  Network network = ImportOrDie(model);
  ASSERT_EQ(network.inputs.size(), 1u);
  EXPECT_EQ(network.inputs[0].name, "x");
  ASSERT_EQ(network.nodes.size(), 2u);  // the Constant node is folded
  ASSERT_TRUE(network.constants.contains("c"));
  EXPECT_THAT(network.constants.at("c").Elements<float>(), ElementsAre(1.5f, -2.0f));
  EXPECT_THAT(network.constants.at("w").Elements<float>(), ElementsAre(0.0f, 0.5f));
  EXPECT_EQ(network.values.at("c"), Float({2}));
}

TEST(NetworkImportTest, AttributesMapToTheirTypes) {
  ModelBuilder model;
  model.Input("a", {3, 2}).Output("y", {2, 4});
  model.FloatInitializer("b", {4, 3});
  auto& gemm = model.Node("Gemm", {"a", "b"}, {"y"}, "gemm");
  SetInt(gemm, "transA", 1);
  SetInt(gemm, "transB", 1);
  auto* alpha = gemm.add_attribute();
  alpha->set_name("alpha");
  alpha->set_type(onnx::AttributeProto::FLOAT);
  alpha->set_f(0.25f);
  SetString(gemm, "note", "text");
  SetInts(gemm, "ints", {1, 2});
  auto* floats = gemm.add_attribute();
  floats->set_name("floats");
  floats->set_type(onnx::AttributeProto::FLOATS);
  floats->add_floats(1.0f);
  Network network = ImportOrDie(model);
  ASSERT_EQ(network.nodes.size(), 1u);
  const AttributeMap& attributes = network.nodes[0].attributes;
  EXPECT_EQ(std::get<int64_t>(attributes.at("transA")), 1);
  EXPECT_EQ(std::get<float>(attributes.at("alpha")), 0.25f);
  EXPECT_EQ(std::get<std::string>(attributes.at("note")), "text");
  EXPECT_THAT(std::get<std::vector<int64_t>>(attributes.at("ints")), ElementsAre(1, 2));
  EXPECT_THAT(std::get<std::vector<float>>(attributes.at("floats")), ElementsAre(1.0f));
  EXPECT_EQ(network.values.at("y"), Float({2, 4}));
}

TEST(NetworkImportTest, BoundInputsBecomeConstants) {
  ModelBuilder model;
  model.Input("x", {2, 3}).Input("shape", {2}, onnx::TensorProto::INT64).Output("y", {3, 2});
  model.Node("Reshape", {"x", "shape"}, {"y"}, "reshape");
  ImportOptions options;
  Tensor shape(TensorInfo{DataType::kInt64, {2}});
  shape.Elements<int64_t>()[0] = 3;
  shape.Elements<int64_t>()[1] = -1;
  options.bound_inputs.emplace("shape", shape);
  Network network = ImportOrDie(model, options);
  ASSERT_EQ(network.inputs.size(), 1u);
  EXPECT_EQ(network.inputs[0].name, "x");
  EXPECT_TRUE(network.constants.contains("shape"));
  EXPECT_EQ(network.outputs[0].info, Float({3, 2}));
}

TEST(NetworkImportTest, MatMulFollowsNumpy) {
  auto matmul = [](Shape a, Shape b) {
    ModelBuilder model;
    model.Input("a", a).Input("b", b).OutputNoShape("y");
    model.Node("MatMul", {"a", "b"}, {"y"}, "matmul");
    Network network = ImportOrDie(model);
    return network.outputs.empty() ? Shape{-2} : network.outputs[0].info.shape;
  };
  EXPECT_EQ(matmul({3}, {3}), Shape{});
  EXPECT_EQ(matmul({3}, {2, 3, 4}), (Shape{2, 4}));
  EXPECT_EQ(matmul({2, 3, 4}, {4}), (Shape{2, 3}));
  EXPECT_EQ(matmul({5, 1, 3, 4}, {2, 4, 6}), (Shape{5, 2, 3, 6}));
  EXPECT_EQ(matmul({-1, 3, 4}, {4, 6}), (Shape{-1, 3, 6}));
}

TEST(NetworkImportTest, BroadcastingWithDynamicDimensions) {
  ModelBuilder model;
  model.Input("a", {-1, 1, 3}).Input("b", {4, 1}).OutputNoShape("y");
  model.Node("Add", {"a", "b"}, {"y"}, "add");
  Network network = ImportOrDie(model);
  EXPECT_EQ(network.outputs[0].info, Float({-1, 4, 3}));
}

TEST(NetworkImportTest, PoolGeometry) {
  // ceil_mode drops a last window that would start in the end padding.
  EXPECT_EQ(SingleNodeShape("MaxPool", {1, 1, 4, 4},
                            [](onnx::NodeProto& node) {
                              SetInts(node, "kernel_shape", {1, 1});
                              SetInts(node, "strides", {2, 2});
                              SetInt(node, "ceil_mode", 1);
                              SetInts(node, "pads", {1, 1, 1, 1});
                            }),
            (Shape{1, 1, 3, 3}));
  EXPECT_EQ(SingleNodeShape("AveragePool", {1, 3, 7, 5},
                            [](onnx::NodeProto& node) {
                              SetInts(node, "kernel_shape", {3, 2});
                              SetInts(node, "strides", {2, 2});
                              SetString(node, "auto_pad", "SAME_LOWER");
                            }),
            (Shape{1, 3, 4, 3}));
  EXPECT_EQ(SingleNodeShape("MaxPool", {1, 3, 7, 5},
                            [](onnx::NodeProto& node) {
                              SetInts(node, "kernel_shape", {3, 2});
                              SetInts(node, "dilations", {2, 1});
                              SetString(node, "auto_pad", "VALID");
                            }),
            (Shape{1, 3, 3, 4}));
  EXPECT_EQ(SingleNodeShape("GlobalAveragePool", {-1, 3, 7, 5}, [](onnx::NodeProto&) {}),
            (Shape{-1, 3, 1, 1}));
}

TEST(NetworkImportTest, FlattenTransposeAndConcat) {
  EXPECT_EQ(SingleNodeShape("Flatten", {2, 3, 4, 5},
                            [](onnx::NodeProto& node) { SetInt(node, "axis", -1); }),
            (Shape{24, 5}));
  EXPECT_EQ(SingleNodeShape("Flatten", {-1, 3, 4}, [](onnx::NodeProto&) {}), (Shape{-1, 12}));
  EXPECT_EQ(
      SingleNodeShape("Flatten", {2, 3}, [](onnx::NodeProto& node) { SetInt(node, "axis", 0); }),
      (Shape{1, 6}));
  EXPECT_EQ(SingleNodeShape("Transpose", {2, 3, 4}, [](onnx::NodeProto&) {}), (Shape{4, 3, 2}));
  EXPECT_EQ(SingleNodeShape("Transpose", {2, 3, 4},
                            [](onnx::NodeProto& node) {
                              SetInts(node, "perm", {1, 0, 2});
                            }),
            (Shape{3, 2, 4}));

  ModelBuilder model;
  model.Input("a", {2, 3}).Input("b", {2, 5}).Input("c", {-1, 1}).OutputNoShape("y");
  SetInt(model.Node("Concat", {"a", "b", "c"}, {"y"}, "concat"), "axis", -1);
  Network network = ImportOrDie(model);
  EXPECT_EQ(network.outputs[0].info, Float({2, 9}));
}

TEST(NetworkImportTest, ReshapeZeroAndAllowZero) {
  auto reshape = [](Shape input, std::vector<int64_t> shape, int64_t allow_zero) {
    ModelBuilder model;
    model.Input("x", input).OutputNoShape("y");
    model.Int64Initializer("shape", {static_cast<int64_t>(shape.size())}, shape);
    auto& node = model.Node("Reshape", {"x", "shape"}, {"y"}, "reshape");
    SetInt(node, "allowzero", allow_zero);
    model.proto().mutable_opset_import(0)->set_version(14);
    Network network = ImportOrDie(model);
    return network.outputs.empty() ? Shape{-2} : network.outputs[0].info.shape;
  };
  EXPECT_EQ(reshape({2, 3, 4}, {0, -1}, 0), (Shape{2, 12}));
  EXPECT_EQ(reshape({2, 3, 4}, {-1}, 0), (Shape{24}));
  EXPECT_EQ(reshape({0, 3, 4}, {3, 4, 0}, 1), (Shape{3, 4, 0}));
  EXPECT_EQ(reshape({-1, 3, 4}, {0, 12}, 0), (Shape{-1, 12}));
  EXPECT_EQ(reshape({-1, 3, 4}, {-1, 6}, 0), (Shape{-1, 6}));
}

TEST(NetworkImportTest, BatchNormalizationAndSoftmaxKeepShape) {
  ModelBuilder model;
  model.Input("x", {2, 3, 4}).OutputNoShape("y");
  for (const char* name : {"scale", "bias", "mean", "var"})
    model.FloatInitializer(name, {3});
  model.Node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"n"}, "bn");
  model.Node("Softmax", {"n"}, {"y"}, "softmax");
  Network network = ImportOrDie(model);
  EXPECT_EQ(network.outputs[0].info, Float({2, 3, 4}));
}

TEST(NetworkImportTest, ImportFileNamesMissingFile) {
  auto result = ImportOnnxFile("/nonexistent/model.onnx");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code(), StatusCode::kNotFound);
  EXPECT_THAT(result.error().message(), HasSubstr("/nonexistent/model.onnx"));
}

}  // namespace
}  // namespace backplane
