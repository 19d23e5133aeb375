// Bad models: each is refused with the right code and a message naming the node (or value) and
// the reason. Models are real protobuf built with ONNX's C++ types.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "backplane/onnx/network.hpp"
#include "model_builder.hpp"

namespace backplane {
namespace {

using ::backplane::testing::ModelBuilder;
using ::backplane::testing::SetInt;
using ::backplane::testing::SetInts;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

void ExpectError(const Result<Network>& result, StatusCode code,
                 const ::testing::Matcher<const std::string&>& message) {
  ASSERT_FALSE(result.ok()) << "import succeeded";
  EXPECT_EQ(result.error().code(), code) << result.error().ToString();
  EXPECT_THAT(result.error().message(), message);
}

// x[2,3] → Relu → y[2,3], the base most cases break in one way.
ModelBuilder ReluModel() {
  ModelBuilder model;
  model.Input("x", {2, 3}).Output("y", {2, 3});
  model.Node("Relu", {"x"}, {"y"}, "relu");
  return model;
}

TEST(NetworkImportErrorTest, GarbageBytesAreNotAModel) {
  const std::string garbage = "\xff\xff\xff\xff this is not a model";
  auto result =
      ImportOnnxModel(std::as_bytes(std::span(garbage.data(), garbage.size())), "garbage.onnx");
  ExpectError(result, StatusCode::kInvalidArgument,
              AllOf(HasSubstr("garbage.onnx"),
                    HasSubstr("is not a valid ONNX model (protobuf parse failed)")));
}

TEST(NetworkImportErrorTest, UnsupportedOperatorNamesNode) {
  ModelBuilder model;
  model.Input("x", {1, 2, 3}).Output("y", {1, 2, 3});
  model.Node("LSTM", {"x"}, {"y"}, "encoder");
  ExpectError(model.Import(), StatusCode::kUnimplemented,
              AllOf(HasSubstr("node 'encoder' (LSTM)"), HasSubstr("unsupported operator LSTM")));
}

TEST(NetworkImportErrorTest, UnsupportedAttributeTypeNamesNodeAndAttribute) {
  ModelBuilder model = ReluModel();
  auto* attribute = model.proto().mutable_graph()->mutable_node(0)->add_attribute();
  attribute->set_name("labels");
  attribute->set_type(onnx::AttributeProto::STRINGS);
  attribute->add_strings("a");
  ExpectError(model.Import(), StatusCode::kUnimplemented,
              AllOf(HasSubstr("node 'relu' (Relu)"), HasSubstr("attribute 'labels'"),
                    HasSubstr("unsupported type STRINGS")));
}

TEST(NetworkImportErrorTest, DoubleInputIsUnsupportedDataType) {
  ModelBuilder model;
  model.Input("x", {2, 3}, onnx::TensorProto::DOUBLE).Output("y", {2, 3});
  model.Node("Relu", {"x"}, {"y"}, "relu");
  ExpectError(model.Import(), StatusCode::kUnimplemented,
              AllOf(HasSubstr("graph input 'x'"), HasSubstr("unsupported data type DOUBLE")));
}

// INT64 arithmetic is supported (shape computations), but not mixed with FP32.
TEST(NetworkImportErrorTest, MixedTypeArithmeticIsRefused) {
  ModelBuilder model;
  model.Input("x", {3}).Output("y", {3});
  model.Int64Initializer("offsets", {3}, {1, 2, 3});
  model.Node("Add", {"x", "offsets"}, {"y"}, "add");
  ExpectError(model.Import(), StatusCode::kInvalidArgument,
              AllOf(HasSubstr("node 'add' (Add)"), HasSubstr("input 1 ('offsets') is INT64"),
                    HasSubstr("must have one type")));
}

TEST(NetworkImportErrorTest, Uint8ActivationIsUnsupportedDataType) {
  ModelBuilder model;
  model.Input("x", {3}, onnx::TensorProto::UINT8).Output("y", {3}, onnx::TensorProto::UINT8);
  model.Node("Relu", {"x"}, {"y"}, "relu");
  ExpectError(model.Import(), StatusCode::kUnimplemented,
              AllOf(HasSubstr("node 'relu' (Relu)"), HasSubstr("unsupported data type UINT8"),
                    HasSubstr("'x'")));
}

TEST(NetworkImportErrorTest, DanglingEdgeNamesNodeAndInput) {
  ModelBuilder model;
  model.Input("x", {2, 3}).Output("y", {2, 3});
  model.Node("Add", {"x", "ghost"}, {"y"}, "add");
  ExpectError(
      model.Import(), StatusCode::kInvalidArgument,
      AllOf(HasSubstr("node 'add' (Add)"), HasSubstr("input 'ghost'"), HasSubstr("dangling edge")));
}

TEST(NetworkImportErrorTest, CycleNamesNodeOnIt) {
  ModelBuilder model;
  model.Input("x", {2, 3}).Output("y", {2, 3});
  // "add" only consumes the cycle; the message must name a node on it.
  model.Node("Add", {"x", "a"}, {"y"}, "add");
  model.Node("Relu", {"b"}, {"a"}, "first");
  model.Node("Tanh", {"a"}, {"b"}, "second");
  ExpectError(model.Import(), StatusCode::kInvalidArgument,
              AllOf(HasSubstr("is on a cycle"),
                    AnyOf(HasSubstr("node 'first' (Relu)"), HasSubstr("node 'second' (Tanh)")),
                    Not(HasSubstr("'add'"))));
}

TEST(NetworkImportErrorTest, SelfLoopIsACycle) {
  ModelBuilder model;
  model.Input("x", {2, 3}).Output("y", {2, 3});
  model.Node("Add", {"x", "y"}, {"y"}, "accumulate");
  ExpectError(model.Import(), StatusCode::kInvalidArgument,
              HasSubstr("node 'accumulate' (Add) is on a cycle"));
}

TEST(NetworkImportErrorTest, ValueProducedTwice) {
  ModelBuilder model;
  model.Input("x", {2, 3}).Output("y", {2, 3});
  model.Node("Relu", {"x"}, {"y"}, "relu");
  model.Node("Tanh", {"x"}, {"y"}, "tanh");
  ExpectError(model.Import(), StatusCode::kInvalidArgument,
              AllOf(HasSubstr("value 'y' is produced twice"), HasSubstr("node 'relu' (Relu)"),
                    HasSubstr("node 'tanh' (Tanh)")));
}

TEST(NetworkImportErrorTest, NodeOverwritingGraphInputIsProducedTwice) {
  ModelBuilder model;
  model.Input("x", {2, 3}).Output("y", {2, 3});
  model.Node("Relu", {"x"}, {"x"}, "relu");
  model.Node("Tanh", {"x"}, {"y"}, "tanh");
  ExpectError(model.Import(), StatusCode::kInvalidArgument,
              AllOf(HasSubstr("value 'x' is produced twice"), HasSubstr("graph input 'x'")));
}

TEST(NetworkImportErrorTest, OutputNeverProduced) {
  ModelBuilder model = ReluModel();
  model.Output("z", {2, 3});
  ExpectError(model.Import(), StatusCode::kInvalidArgument,
              HasSubstr("graph output 'z' is not produced by any node"));
}

TEST(NetworkImportErrorTest, ReshapeShapeMustNotDependOnInputValues) {
  ModelBuilder model;
  model.Input("x", {2, 3}).Input("shape", {2}, onnx::TensorProto::INT64).Output("y", {3, 2});
  model.Node("Reshape", {"x", "shape"}, {"y"}, "reshape");
  ExpectError(model.Import(), StatusCode::kUnimplemented,
              AllOf(HasSubstr("node 'reshape' (Reshape)"), HasSubstr("shape input 1 ('shape')"),
                    HasSubstr("computed from the values of the graph's inputs")));
}

TEST(NetworkImportErrorTest, ConvChannelMismatchIsShapeMismatch) {
  ModelBuilder model;
  model.Input("x", {1, 3, 5, 5}).Output("y", {1, 2, 3, 3});
  model.FloatInitializer("w", {2, 2, 3, 3});  // expects 2 input channels
  model.Node("Conv", {"x", "w"}, {"y"}, "conv1");
  ExpectError(model.Import(), StatusCode::kInvalidArgument,
              AllOf(HasSubstr("node 'conv1' (Conv)"), HasSubstr("shape mismatch"),
                    HasSubstr("3 channels")));
}

TEST(NetworkImportErrorTest, BroadcastMismatchIsShapeMismatch) {
  ModelBuilder model;
  model.Input("a", {2, 3}).Input("b", {4}).Output("y", {2, 3});
  model.Node("Add", {"a", "b"}, {"y"}, "add");
  ExpectError(model.Import(), StatusCode::kInvalidArgument,
              AllOf(HasSubstr("node 'add' (Add)"), HasSubstr("shape mismatch"),
                    HasSubstr("[2,3] and [4]")));
}

TEST(NetworkImportErrorTest, DeclaredOutputShapeMismatchNamesOutput) {
  ModelBuilder model;
  model.Input("x", {2, 3}).Output("y", {3, 2});
  model.Node("Relu", {"x"}, {"y"}, "relu");
  ExpectError(model.Import(), StatusCode::kInvalidArgument,
              AllOf(HasSubstr("graph output 'y'"), HasSubstr("[3,2]"), HasSubstr("[2,3]")));
}

TEST(NetworkImportErrorTest, DeclaredScalarOutputMismatch) {
  ModelBuilder model;
  model.Input("x", {2, 3}).Output("y", {});
  model.Node("Relu", {"x"}, {"y"}, "relu");
  ExpectError(
      model.Import(), StatusCode::kInvalidArgument,
      AllOf(HasSubstr("graph output 'y' is declared with shape []"), HasSubstr("shape mismatch")));
}

TEST(NetworkImportErrorTest, UnsupportedDomainNamesDomain) {
  ModelBuilder model = ReluModel();
  auto* opset = model.proto().add_opset_import();
  opset->set_domain("com.microsoft");
  opset->set_version(1);
  auto& node = model.Node("FusedGemm", {"x"}, {"z"}, "fused");
  node.set_domain("com.microsoft");
  ExpectError(model.Import(), StatusCode::kUnimplemented,
              AllOf(HasSubstr("node 'fused' (FusedGemm)"), HasSubstr("domain 'com.microsoft'")));
}

TEST(NetworkImportErrorTest, MissingDefaultOpset) {
  ModelBuilder model = ReluModel();
  model.proto().mutable_opset_import(0)->set_domain("ai.onnx.ml");
  ExpectError(model.Import(), StatusCode::kInvalidArgument,
              HasSubstr("no opset import for the default ONNX domain"));
}

TEST(NetworkImportErrorTest, OpsetTooNew) {
  ModelBuilder model = ReluModel();
  model.proto().mutable_opset_import(0)->set_version(26);
  ExpectError(model.Import(), StatusCode::kUnimplemented,
              AllOf(HasSubstr("opset 26"), HasSubstr("7 to 25")));
}

TEST(NetworkImportErrorTest, OpsetBeforeMultidirectionalBroadcasting) {
  // Before opset 7, Add and the like broadcast only with the `broadcast`/`axis` attributes: the
  // old forms from 7 on are rewritten (opset_upgrade_test.cpp), older ones refused.
  ModelBuilder model = ReluModel();
  model.proto().mutable_opset_import(0)->set_version(6);
  ExpectError(model.Import(), StatusCode::kUnimplemented,
              AllOf(HasSubstr("opset 6"), HasSubstr("7 to 25")));
}

TEST(NetworkImportErrorTest, IrVersionOutOfRange) {
  ModelBuilder model = ReluModel();
  model.proto().set_ir_version(2);
  ExpectError(model.Import(), StatusCode::kUnimplemented,
              AllOf(HasSubstr("IR version 2"), HasSubstr("3 to 13")));
  model.proto().set_ir_version(14);
  ExpectError(model.Import(), StatusCode::kUnimplemented, HasSubstr("IR version 14"));
}

TEST(NetworkImportErrorTest, ConstantWithOtherAttributeIsRefused) {
  ModelBuilder model;
  model.Input("x", {2}).Output("y", {2});
  auto& constant = model.Node("Constant", {}, {"c"}, "c");
  auto* attribute = constant.add_attribute();
  attribute->set_name("value_float");
  attribute->set_type(onnx::AttributeProto::FLOAT);
  attribute->set_f(1.0f);
  model.Node("Add", {"x", "c"}, {"y"}, "add");
  ExpectError(model.Import(), StatusCode::kUnimplemented,
              AllOf(HasSubstr("node 'c' (Constant)"), HasSubstr("'value_float'")));
}

TEST(NetworkImportErrorTest, ExternalDataIsUnimplemented) {
  ModelBuilder model;
  model.Input("x", {2}).Output("y", {2});
  auto* weights = model.proto().mutable_graph()->add_initializer();
  weights->set_name("w");
  weights->set_data_type(onnx::TensorProto::FLOAT);
  weights->add_dims(2);
  weights->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* location = weights->add_external_data();
  location->set_key("location");
  location->set_value("weights.bin");
  model.Node("Add", {"x", "w"}, {"y"}, "add");
  ExpectError(model.Import(), StatusCode::kUnimplemented,
              AllOf(HasSubstr("initializer 'w'"), HasSubstr("external data")));
}

TEST(NetworkImportErrorTest, InitializerWithWrongDataSize) {
  ModelBuilder model;
  model.Input("x", {3}).Output("y", {3});
  auto* weights = model.proto().mutable_graph()->add_initializer();
  weights->set_name("w");
  weights->set_data_type(onnx::TensorProto::FLOAT);
  weights->add_dims(3);
  weights->set_raw_data(std::string(8, '\0'));  // 2 floats for 3 elements
  model.Node("Add", {"x", "w"}, {"y"}, "add");
  ExpectError(model.Import(), StatusCode::kInvalidArgument,
              AllOf(HasSubstr("initializer 'w'"), HasSubstr("8 bytes of raw_data, expected 12")));
}

TEST(NetworkImportErrorTest, MaxPoolIndicesOutputIsUnsupported) {
  ModelBuilder model;
  model.Input("x", {1, 1, 4, 4}).Output("y", {1, 1, 2, 2});
  auto& pool = model.Node("MaxPool", {"x"}, {"y", "indices"}, "pool");
  SetInts(pool, "kernel_shape", {2, 2});
  SetInts(pool, "strides", {2, 2});
  ExpectError(model.Import(), StatusCode::kUnimplemented,
              AllOf(HasSubstr("node 'pool' (MaxPool)"), HasSubstr("'indices'")));
}

TEST(NetworkImportErrorTest, AxisOutOfRange) {
  ModelBuilder model;
  model.Input("x", {2, 3}).Output("y", {2, 3});
  SetInt(model.Node("Softmax", {"x"}, {"y"}, "softmax"), "axis", 2);
  ExpectError(model.Import(), StatusCode::kInvalidArgument,
              AllOf(HasSubstr("node 'softmax' (Softmax)"), HasSubstr("'axis' = 2"),
                    HasSubstr("out of range for rank 2")));
}

TEST(NetworkImportErrorTest, ReshapeElementCountMismatch) {
  ModelBuilder model;
  model.Input("x", {2, 3}).Output("y", {4, 2});
  model.Int64Initializer("shape", {2}, {4, 2});
  model.Node("Reshape", {"x", "shape"}, {"y"}, "reshape");
  ExpectError(model.Import(), StatusCode::kInvalidArgument,
              AllOf(HasSubstr("node 'reshape' (Reshape)"), HasSubstr("cannot reshape [2,3]")));
}

TEST(NetworkImportErrorTest, GemmInnerDimensionMismatch) {
  ModelBuilder model;
  model.Input("a", {2, 3}).Output("y", {2, 5});
  model.FloatInitializer("b", {4, 5});
  model.Node("Gemm", {"a", "b"}, {"y"}, "gemm");
  ExpectError(
      model.Import(), StatusCode::kInvalidArgument,
      AllOf(HasSubstr("node 'gemm' (Gemm)"), HasSubstr("shape mismatch"), HasSubstr("3 vs 4")));
}

TEST(NetworkImportErrorTest, UnboundNameInOptionsIsRefused) {
  ImportOptions options;
  options.bound_inputs.emplace("nope", Tensor(TensorInfo{DataType::kInt64, {1}}));
  ExpectError(ReluModel().Import(options), StatusCode::kInvalidArgument,
              HasSubstr("bound value 'nope' is not a graph input"));
}

}  // namespace
}  // namespace backplane
