// Import and shape inference of the operators a transformer encoder export uses (issue 42): each
// operator's output type and shape, negative axes and clamped indices, INT64, INT32 and BOOL
// tensors; shapes computed from input shapes (Shape -> Gather -> Unsqueeze -> Concat -> Reshape)
// folded once the input shapes are known, and left dynamic before; and every refusal naming the
// node and why: bad attributes, types, axes, indices known out of range, a shape that depends on
// the values of an input, an impossible reshape computed from shapes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "import_refusal.hpp"
#include "model_builder.hpp"

namespace backplane {
namespace encoder_import_test {
namespace {

using ::backplane::testing::ExpectRefused;
using ::backplane::testing::ModelBuilder;
using ::backplane::testing::SetFloat;
using ::backplane::testing::SetInt;
using ::backplane::testing::SetInts;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int32_t kInt64 = onnx::TensorProto::INT64;
constexpr int32_t kInt32 = onnx::TensorProto::INT32;
constexpr int32_t kBool = onnx::TensorProto::BOOL;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

// Graph output `name` declared without type or shape, so that what a test sees is what inference
// gave.
void Untyped(ModelBuilder& model, const std::string& name) {
  model.OutputNoShape(name);
  auto* outputs = model.proto().mutable_graph()->mutable_output();
  outputs->rbegin()->mutable_type()->mutable_tensor_type()->set_elem_type(
      onnx::TensorProto::UNDEFINED);
}

// The inferred info of graph output `name` (declared without type or shape).
TensorInfo OutputInfo(const ModelBuilder& model, const std::string& name = "y") {
  auto network = model.Import();
  EXPECT_TRUE(network.ok()) << network.error().ToString();
  if (!network.ok())
    return {};
  return network->values.at(name);
}

// A model of opset `opset` with graph input x.
ModelBuilder WithInput(Shape dims, int32_t type = onnx::TensorProto::FLOAT, int64_t opset = 13) {
  ModelBuilder model;
  model.proto().mutable_opset_import(0)->set_version(opset);
  model.Input("x", std::move(dims), type);
  Untyped(model, "y");
  return model;
}

TEST(EncoderImportTest, GatherTakesRowsOfAnyAxisWithInt64OrInt32Indices) {
  {
    ModelBuilder model = WithInput({-1, 7}, kInt64);  // token ids
    model.FloatInitializer("table", {100, 16});
    model.Node("Gather", {"table", "x"}, {"y"}, "embed");
    EXPECT_EQ(OutputInfo(model), (TensorInfo{DataType::kFloat32, {-1, 7, 16}}));
  }
  {
    ModelBuilder model = WithInput({2, 3, 4});
    model.Int64Initializer("i", {}, {-1});
    SetInt(model.Node("Gather", {"x", "i"}, {"y"}, "last"), "axis", -2);
    EXPECT_EQ(OutputInfo(model), (TensorInfo{DataType::kFloat32, {2, 4}}));
  }
  {
    ModelBuilder model = WithInput({5, 6}, kInt32);
    model.FloatInitializer("table", {9, 3});
    SetInt(model.Node("Gather", {"table", "x"}, {"y"}, "cols"), "axis", 1);
    EXPECT_EQ(OutputInfo(model), (TensorInfo{DataType::kFloat32, {9, 5, 6}}));
  }
}

TEST(EncoderImportTest, GatherRefusesWhatItCannotTake) {
  ModelBuilder out_of_range = WithInput({2, 3});
  out_of_range.Int64Initializer("i", {2}, {0, 3});
  SetInt(out_of_range.Node("Gather", {"x", "i"}, {"y"}, "g"), "axis", 1);
  ExpectRefused(out_of_range, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'g' (Gather)"), HasSubstr("index 3"),
                      HasSubstr("out of range for dimension 1")));

  ModelBuilder too_negative = WithInput({2, 3});
  too_negative.Int64Initializer("i", {}, {-3});
  too_negative.Node("Gather", {"x", "i"}, {"y"}, "g");
  ExpectRefused(too_negative, StatusCode::kInvalidArgument, HasSubstr("index -3"));

  ModelBuilder bad_axis = WithInput({2, 3});
  bad_axis.Int64Initializer("i", {}, {0});
  SetInt(bad_axis.Node("Gather", {"x", "i"}, {"y"}, "g"), "axis", 2);
  ExpectRefused(bad_axis, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'g' (Gather)"), HasSubstr("'axis' = 2 is out of range")));

  ModelBuilder float_indices = WithInput({2, 3});
  float_indices.FloatInitializer("i", {}, {0.0f});
  float_indices.Node("Gather", {"x", "i"}, {"y"}, "g");
  ExpectRefused(float_indices, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 'g' (Gather)"), HasSubstr("FP32 for input 1")));
}

TEST(EncoderImportTest, ShapeTakesStartAndEndClamped) {
  struct Case {
    std::optional<int64_t> start, end;
    int64_t length;
  };
  for (const Case& c :
       {Case{{}, {}, 4}, Case{1, -1, 2}, Case{-10, 10, 4}, Case{3, 1, 0}, Case{-1, {}, 1}}) {
    ModelBuilder model = WithInput({-1, 3, 4, 5}, onnx::TensorProto::FLOAT, 15);
    auto& node = model.Node("Shape", {"x"}, {"y"}, "shape");
    if (c.start)
      SetInt(node, "start", *c.start);
    if (c.end)
      SetInt(node, "end", *c.end);
    EXPECT_EQ(OutputInfo(model), (TensorInfo{DataType::kInt64, {c.length}}));
  }
}

// x[batch, seq, 8] -> Reshape to [batch, seq, 2, 4], the target computed from x's shape as
// torch.onnx.export writes it; `last` are the constant trailing dims.
ModelBuilder ShapeChainModel(std::vector<int64_t> last, Shape input = {-1, -1, 8}) {
  ModelBuilder model;
  model.Input("x", input);
  Untyped(model, "y");
  if (input[1] < 0)
    model.NameDimension("x", 1, "S");
  model.Int64Initializer("zero", {}, {0});
  model.Int64Initializer("one", {}, {1});
  model.Int64Initializer("axes0", {1}, {0});
  model.Int64Initializer("last", {static_cast<int64_t>(last.size())}, last);
  model.Node("Shape", {"x"}, {"shape"}, "shape");
  model.Node("Gather", {"shape", "zero"}, {"batch"}, "batch");
  model.Node("Gather", {"shape", "one"}, {"seq"}, "seq");
  model.Node("Unsqueeze", {"batch", "axes0"}, {"batch1"}, "batch1");
  model.Node("Unsqueeze", {"seq", "axes0"}, {"seq1"}, "seq1");
  SetInt(model.Node("Concat", {"batch1", "seq1", "last"}, {"target"}, "target"), "axis", 0);
  model.Node("Reshape", {"x", "target"}, {"y"}, "split_heads");
  return model;
}

TEST(EncoderImportTest, ShapeChainsFoldPerInputShapeIntoStaticReshapeTargets) {
  auto network = ShapeChainModel({2, 4}).Import();
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  // Before a request the target's length is known, its values not.
  EXPECT_EQ(network->values.at("y"), (TensorInfo{DataType::kFloat32, {-1, -1, -1, -1}}));
  EXPECT_EQ(network->values.at("target"), (TensorInfo{DataType::kInt64, {4}}));
  // At a request's shapes the chain is evaluated: the Reshape's output is static.
  for (const Shape& shape : {Shape{3, 5, 8}, Shape{1, 1, 8}, Shape{0, 2, 8}}) {
    auto values = InferShapes(*network, std::vector{TensorInfo{DataType::kFloat32, shape}});
    ASSERT_TRUE(values.ok()) << values.error().ToString();
    EXPECT_EQ(values->at("y"), (TensorInfo{DataType::kFloat32, {shape[0], shape[1], 2, 4}}));
  }
  // With static input shapes, import itself folds it.
  EXPECT_EQ(OutputInfo(ShapeChainModel({2, 4}, {2, 3, 8})),
            (TensorInfo{DataType::kFloat32, {2, 3, 2, 4}}));
}

TEST(EncoderImportTest, AnImpossibleReshapeComputedFromShapesIsRefusedNamingTheNode) {
  auto network = ShapeChainModel({3, 4}).Import();  // 8 elements per row reshaped to 12
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  auto values = InferShapes(*network, std::vector{TensorInfo{DataType::kFloat32, {2, 3, 8}}});
  ASSERT_FALSE(values.ok());
  EXPECT_EQ(values.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(values.error().message(),
              AllOf(HasSubstr("node 'split_heads' (Reshape)"), HasSubstr("cannot reshape")));
  ExpectRefused(ShapeChainModel({3, 4}, {2, 3, 8}), StatusCode::kInvalidArgument,
                HasSubstr("node 'split_heads' (Reshape)"));
}

TEST(EncoderImportTest, AShapeThatDependsOnInputValuesIsRefusedOnceShapesAreKnown) {
  // Reshape's target read from an input's data: unknown before the run whatever the shapes.
  ModelBuilder model;
  model.Input("x", {2, 6}).Input("target", {2}, kInt64);
  Untyped(model, "y");
  model.Node("Reshape", {"x", "target"}, {"y"}, "reshape");
  ExpectRefused(model, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 'reshape' (Reshape)"),
                      HasSubstr("computed from the values of the graph's inputs")));

  ModelBuilder range;
  range.Input("n", {}, kInt64);
  Untyped(range, "y");
  range.Int64Initializer("zero", {}, {0});
  range.Int64Initializer("one", {}, {1});
  range.Node("Range", {"zero", "n", "one"}, {"y"}, "positions");
  ExpectRefused(range, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 'positions' (Range)"), HasSubstr("limit input 1")));
}

TEST(EncoderImportTest, UnsqueezeAndSqueezeTakeAxesAsInputs) {
  {
    ModelBuilder model = WithInput({-1, 7}, kInt64);
    model.Int64Initializer("axes", {2}, {1, -1});
    model.Node("Unsqueeze", {"x", "axes"}, {"y"}, "mask4d");
    EXPECT_EQ(OutputInfo(model), (TensorInfo{DataType::kInt64, {-1, 1, 7, 1}}));
  }
  {
    ModelBuilder model = WithInput({1, 3, 1, 2}, kBool);
    model.Int64Initializer("axes", {1}, {-2});
    model.Node("Squeeze", {"x", "axes"}, {"y"}, "squeeze");
    EXPECT_EQ(OutputInfo(model), (TensorInfo{DataType::kBool, {1, 3, 2}}));
  }
  {
    ModelBuilder model = WithInput({1, 3, 1, 2});
    model.Node("Squeeze", {"x"}, {"y"}, "squeeze_all");
    EXPECT_EQ(OutputInfo(model), (TensorInfo{DataType::kFloat32, {3, 2}}));
  }
}

TEST(EncoderImportTest, UnsqueezeAndSqueezeRefuseBadAxes) {
  ModelBuilder old_form = WithInput({2, 3}, onnx::TensorProto::FLOAT, 11);
  SetInts(old_form.Node("Unsqueeze", {"x"}, {"y"}, "u"), "axes", {0});
  ExpectRefused(old_form, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 'u' (Unsqueeze)"), HasSubstr("attribute 'axes'")));

  ModelBuilder out_of_range = WithInput({2, 3});
  out_of_range.Int64Initializer("axes", {1}, {3});
  out_of_range.Node("Unsqueeze", {"x", "axes"}, {"y"}, "u");
  ExpectRefused(out_of_range, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'u' (Unsqueeze)"), HasSubstr("out of range for rank 3")));

  ModelBuilder twice = WithInput({2, 3});
  twice.Int64Initializer("axes", {2}, {0, -4});  // rank 4: -4 is 0
  twice.Node("Unsqueeze", {"x", "axes"}, {"y"}, "u");
  ExpectRefused(twice, StatusCode::kInvalidArgument, HasSubstr("names an axis twice"));

  ModelBuilder not_one = WithInput({2, 3});
  not_one.Int64Initializer("axes", {1}, {0});
  not_one.Node("Squeeze", {"x", "axes"}, {"y"}, "s");
  ExpectRefused(not_one, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 's' (Squeeze)"), HasSubstr("is not 1")));

  ModelBuilder dynamic = WithInput({-1, 1});
  dynamic.Node("Squeeze", {"x"}, {"y"}, "s");
  ExpectRefused(dynamic, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 's' (Squeeze)"), HasSubstr("give axes")));

  ModelBuilder computed_axes;
  computed_axes.Input("x", {2, 1}).Input("axes", {1}, kInt64);
  Untyped(computed_axes, "y");
  computed_axes.Node("Squeeze", {"x", "axes"}, {"y"}, "s");
  ExpectRefused(computed_axes, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 's' (Squeeze)"), HasSubstr("must be a constant")));
}

// Slice of x[10, 8] along both axes.
TensorInfo SliceInfo(std::vector<int64_t> starts, std::vector<int64_t> ends,
                     std::vector<int64_t> axes, std::vector<int64_t> steps) {
  ModelBuilder model = WithInput({10, 8});
  const auto n = static_cast<int64_t>(starts.size());
  model.Int64Initializer("starts", {n}, starts);
  model.Int64Initializer("ends", {n}, ends);
  model.Int64Initializer("axes", {n}, axes);
  model.Int64Initializer("steps", {n}, steps);
  model.Node("Slice", {"x", "starts", "ends", "axes", "steps"}, {"y"}, "slice");
  return OutputInfo(model);
}

TEST(EncoderImportTest, SliceClampsNegativeAndHugeIndicesAndTakesSteps) {
  EXPECT_EQ(SliceInfo({-3, 0}, {kMax, 8}, {0, 1}, {1, 3}).shape, (Shape{3, 3}));
  EXPECT_EQ(SliceInfo({-1}, {kMin}, {0}, {-2}).shape, (Shape{5, 8}));  // 9, 7, 5, 3, 1
  EXPECT_EQ(SliceInfo({-100}, {100}, {-1}, {1}).shape, (Shape{10, 8}));
  EXPECT_EQ(SliceInfo({5}, {2}, {0}, {1}).shape, (Shape{0, 8}));
  EXPECT_EQ(SliceInfo({20}, {-20}, {1}, {-1}).shape, (Shape{10, 8}));
  EXPECT_EQ(SliceInfo({0}, {10}, {0}, {kMax}).shape, (Shape{1, 8}));
  EXPECT_EQ(SliceInfo({9}, {-11}, {0}, {kMin}).shape, (Shape{1, 8}));
}

TEST(EncoderImportTest, SliceRefusesAZeroStepAndLengthsThatDiffer) {
  ModelBuilder zero = WithInput({10});
  zero.Int64Initializer("s", {1}, {0});
  zero.Int64Initializer("e", {1}, {5});
  zero.Int64Initializer("a", {1}, {0});
  zero.Int64Initializer("st", {1}, {0});
  zero.Node("Slice", {"x", "s", "e", "a", "st"}, {"y"}, "slice");
  ExpectRefused(zero, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'slice' (Slice)"), HasSubstr("steps must not be 0")));

  ModelBuilder lengths = WithInput({10, 3});
  lengths.Int64Initializer("s", {2}, {0, 0});
  lengths.Int64Initializer("e", {1}, {5});
  lengths.Node("Slice", {"x", "s", "e"}, {"y"}, "slice");
  ExpectRefused(lengths, StatusCode::kInvalidArgument, HasSubstr("must have one length"));
}

TEST(EncoderImportTest, CastConvertsBetweenFloatInt64Int32AndBool) {
  const std::pair<int32_t, DataType> kTypes[] = {{onnx::TensorProto::FLOAT, DataType::kFloat32},
                                                 {kInt64, DataType::kInt64},
                                                 {kInt32, DataType::kInt32},
                                                 {kBool, DataType::kBool}};
  for (const auto& [from, from_type] : kTypes) {
    for (const auto& [to, to_type] : kTypes) {
      ModelBuilder model = WithInput({-1, 3}, from);
      SetInt(model.Node("Cast", {"x"}, {"y"}, "cast"), "to", to);
      EXPECT_EQ(OutputInfo(model), (TensorInfo{to_type, {-1, 3}}));
    }
  }
  ModelBuilder half = WithInput({2});
  SetInt(half.Node("Cast", {"x"}, {"y"}, "cast"), "to", onnx::TensorProto::FLOAT16);
  ExpectRefused(half, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 'cast' (Cast)"), HasSubstr("'to' = 10")));
  ModelBuilder missing = WithInput({2});
  missing.Node("Cast", {"x"}, {"y"}, "cast");
  ExpectRefused(missing, StatusCode::kInvalidArgument, HasSubstr("attribute 'to' is required"));
}

TEST(EncoderImportTest, EqualGivesBoolAndWhereBroadcastsThree) {
  ModelBuilder model;
  model.Input("mask", {-1, 1, 1, 7}, kInt64);
  Untyped(model, "y");
  model.Int64Initializer("zero", {}, {0});
  model.FloatInitializer("neg", {}, {-1e4f});
  model.FloatInitializer("scores", {4, 7, 7});
  model.Node("Equal", {"mask", "zero"}, {"masked"}, "eq");
  model.Node("Where", {"masked", "neg", "scores"}, {"y"}, "where");
  auto network = model.Import();
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  EXPECT_EQ(network->values.at("masked"), (TensorInfo{DataType::kBool, {-1, 1, 1, 7}}));
  EXPECT_EQ(network->values.at("y"), (TensorInfo{DataType::kFloat32, {-1, 4, 7, 7}}));

  ModelBuilder not_bool = WithInput({3});
  not_bool.FloatInitializer("a", {3});
  not_bool.Node("Where", {"x", "a", "a"}, {"y"}, "where");
  ExpectRefused(not_bool, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 'where' (Where)"), HasSubstr("expected BOOL")));

  ModelBuilder mixed = WithInput({3}, kInt64);
  mixed.FloatInitializer("a", {3});
  mixed.Node("Equal", {"x", "a"}, {"y"}, "eq");
  ExpectRefused(mixed, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'eq' (Equal)"), HasSubstr("must have one type")));
}

TEST(EncoderImportTest, ExpandAndConstantOfShapeTakeConstantOrFoldedShapes) {
  {
    ModelBuilder model = WithInput({3, 1});
    model.Int64Initializer("shape", {3}, {2, 1, 4});
    model.Node("Expand", {"x", "shape"}, {"y"}, "expand");
    EXPECT_EQ(OutputInfo(model), (TensorInfo{DataType::kFloat32, {2, 3, 4}}));
  }
  {
    // ConstantOfShape(Shape(ids)) with an INT64 value: the mask a model makes when none is given.
    ModelBuilder model = WithInput({-1, -1}, kInt64);
    model.Node("Shape", {"x"}, {"shape"}, "shape");
    auto& node = model.Node("ConstantOfShape", {"shape"}, {"y"}, "ones");
    auto* value = node.add_attribute();
    value->set_name("value");
    value->set_type(onnx::AttributeProto::TENSOR);
    value->mutable_t()->set_data_type(kInt64);
    value->mutable_t()->add_dims(1);
    value->mutable_t()->add_int64_data(1);
    auto network = model.Import();
    ASSERT_TRUE(network.ok()) << network.error().ToString();
    EXPECT_EQ(network->values.at("y"), (TensorInfo{DataType::kInt64, {-1, -1}}));
    auto values = InferShapes(*network, std::vector{TensorInfo{DataType::kInt64, {2, 9}}});
    ASSERT_TRUE(values.ok()) << values.error().ToString();
    EXPECT_EQ(values->at("y"), (TensorInfo{DataType::kInt64, {2, 9}}));
  }
  ModelBuilder bad = WithInput({3, 2});
  bad.Int64Initializer("shape", {2}, {3, 3});
  bad.Node("Expand", {"x", "shape"}, {"y"}, "expand");
  ExpectRefused(bad, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'expand' (Expand)"), HasSubstr("do not broadcast")));
}

TEST(EncoderImportTest, RangeHasItsLengthWhenItsBoundsAreKnown) {
  ModelBuilder model;
  model.Input("x", {-1, -1});
  Untyped(model, "y");
  model.Int64Initializer("zero", {}, {0});
  model.Int64Initializer("one", {}, {1});
  model.Int64Initializer("two", {}, {2});
  model.Node("Shape", {"x"}, {"shape"}, "shape");
  model.Node("Gather", {"shape", "one"}, {"seq"}, "seq");
  model.Node("Range", {"zero", "seq", "two"}, {"y"}, "positions");
  auto network = model.Import();
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  EXPECT_EQ(network->values.at("y"), (TensorInfo{DataType::kInt64, {-1}}));
  auto values = InferShapes(*network, std::vector{TensorInfo{DataType::kFloat32, {1, 7}}});
  ASSERT_TRUE(values.ok()) << values.error().ToString();
  EXPECT_EQ(values->at("y"), (TensorInfo{DataType::kInt64, {4}}));  // 0, 2, 4, 6

  ModelBuilder zero_delta = WithInput({1});
  zero_delta.FloatInitializer("a", {}, {0.0f});
  zero_delta.FloatInitializer("b", {}, {3.0f});
  zero_delta.Node("Range", {"a", "b", "a"}, {"y"}, "range");
  ExpectRefused(zero_delta, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'range' (Range)"), HasSubstr("delta is 0")));
}

TEST(EncoderImportTest, ReductionsTakeAxesAsAttributeOrInputAndKeepdims) {
  {
    ModelBuilder model = WithInput({2, -1, 8});
    auto& node = model.Node("ReduceMean", {"x"}, {"y"}, "mean");
    SetInts(node, "axes", {-1});
    EXPECT_EQ(OutputInfo(model), (TensorInfo{DataType::kFloat32, {2, -1, 1}}));
  }
  {
    ModelBuilder model = WithInput({2, 3, 8});
    model.Int64Initializer("axes", {2}, {0, 2});
    SetInt(model.Node("ReduceSum", {"x", "axes"}, {"y"}, "sum"), "keepdims", 0);
    EXPECT_EQ(OutputInfo(model), (TensorInfo{DataType::kFloat32, {3}}));
  }
  {
    ModelBuilder model = WithInput({2, 3});
    model.Node("ReduceSum", {"x"}, {"y"}, "sum_all");
    EXPECT_EQ(OutputInfo(model), (TensorInfo{DataType::kFloat32, {1, 1}}));
  }
  ModelBuilder both = WithInput({2, 3});
  both.Int64Initializer("axes", {1}, {0});
  SetInts(both.Node("ReduceSum", {"x", "axes"}, {"y"}, "sum"), "axes", {0});
  ExpectRefused(both, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'sum' (ReduceSum)"), HasSubstr("both")));
  ModelBuilder bad_axis = WithInput({2, 3});
  SetInts(bad_axis.Node("ReduceMean", {"x"}, {"y"}, "mean"), "axes", {2});
  ExpectRefused(bad_axis, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'mean' (ReduceMean)"), HasSubstr("out of range")));
}

TEST(EncoderImportTest, ElementwiseOperatorsKeepTheirTypes) {
  for (const std::string op : {"Sqrt", "Erf", "Neg", "Tanh"}) {
    ModelBuilder model = WithInput({2, -1});
    model.Node(op, {"x"}, {"y"}, "op");
    EXPECT_EQ(OutputInfo(model), (TensorInfo{DataType::kFloat32, {2, -1}})) << op;
  }
  ModelBuilder neg = WithInput({3}, kInt64);
  neg.Node("Neg", {"x"}, {"y"}, "neg");
  EXPECT_EQ(OutputInfo(neg), (TensorInfo{DataType::kInt64, {3}}));
  ModelBuilder logical = WithInput({3}, kBool);
  logical.Node("Not", {"x"}, {"y"}, "not");
  EXPECT_EQ(OutputInfo(logical), (TensorInfo{DataType::kBool, {3}}));
  ModelBuilder pow = WithInput({2, 3});
  pow.FloatInitializer("two", {}, {2.0f});
  pow.Node("Pow", {"x", "two"}, {"y"}, "square");
  EXPECT_EQ(OutputInfo(pow), (TensorInfo{DataType::kFloat32, {2, 3}}));
  ModelBuilder ints = WithInput({3}, kInt64);
  ints.Int64Initializer("two", {}, {2});
  ints.Node("Div", {"x", "two"}, {"y"}, "halve");
  EXPECT_EQ(OutputInfo(ints), (TensorInfo{DataType::kInt64, {3}}));

  ModelBuilder not_float = WithInput({3});
  not_float.Node("Not", {"x"}, {"y"}, "not");
  ExpectRefused(not_float, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 'not' (Not)"), HasSubstr("expected BOOL")));
  ModelBuilder mixed = WithInput({3}, kInt64);
  mixed.FloatInitializer("one", {}, {1.0f});
  mixed.Node("Add", {"x", "one"}, {"y"}, "add");
  ExpectRefused(mixed, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'add' (Add)"), HasSubstr("must have one type")));
}

TEST(EncoderImportTest, LayerNormalizationNormalizesFromItsAxis) {
  ModelBuilder model = WithInput({-1, -1, 16}, onnx::TensorProto::FLOAT, 17);
  model.FloatInitializer("gamma", {16});
  model.FloatInitializer("beta", {16});
  SetFloat(model.Node("LayerNormalization", {"x", "gamma", "beta"}, {"y"}, "ln"), "epsilon",
           1e-12f);
  EXPECT_EQ(OutputInfo(model), (TensorInfo{DataType::kFloat32, {-1, -1, 16}}));

  ModelBuilder stash = WithInput({2, 16}, onnx::TensorProto::FLOAT, 17);
  stash.FloatInitializer("gamma", {16});
  SetInt(stash.Node("LayerNormalization", {"x", "gamma"}, {"y"}, "ln"), "stash_type", 0);
  ExpectRefused(stash, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 'ln' (LayerNormalization)"), HasSubstr("stash_type 0")));

  ModelBuilder mean_output = WithInput({2, 16}, onnx::TensorProto::FLOAT, 17);
  mean_output.FloatInitializer("gamma", {16});
  mean_output.Node("LayerNormalization", {"x", "gamma"}, {"y", "mean"}, "ln");
  ExpectRefused(mean_output, StatusCode::kUnimplemented,
                AllOf(HasSubstr("node 'ln' (LayerNormalization)"), HasSubstr("optional output 1")));

  ModelBuilder wrong_scale = WithInput({2, 16}, onnx::TensorProto::FLOAT, 17);
  wrong_scale.FloatInitializer("gamma", {8});
  wrong_scale.Node("LayerNormalization", {"x", "gamma"}, {"y"}, "ln");
  ExpectRefused(wrong_scale, StatusCode::kInvalidArgument,
                AllOf(HasSubstr("node 'ln' (LayerNormalization)"),
                      HasSubstr("does not broadcast to the normalized dimensions [16]")));

  ModelBuilder bad_axis = WithInput({2, 16}, onnx::TensorProto::FLOAT, 17);
  bad_axis.FloatInitializer("gamma", {16});
  SetInt(bad_axis.Node("LayerNormalization", {"x", "gamma"}, {"y"}, "ln"), "axis", 2);
  ExpectRefused(bad_axis, StatusCode::kInvalidArgument, HasSubstr("'axis' = 2 is out of range"));
}

TEST(EncoderImportTest, Int32AndBoolGraphInputsAreAccepted) {
  ModelBuilder model;
  model.Input("ids", {-1, 4}, kInt32).Input("keep", {-1, 4}, kBool);
  Untyped(model, "y");
  SetInt(model.Node("Cast", {"keep"}, {"keep32"}, "cast"), "to", kInt32);
  model.Node("Mul", {"ids", "keep32"}, {"y"}, "mul");
  auto network = model.Import();
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  EXPECT_EQ(network->inputs[0].info, (TensorInfo{DataType::kInt32, {-1, 4}}));
  EXPECT_EQ(network->inputs[1].info, (TensorInfo{DataType::kBool, {-1, 4}}));
  EXPECT_EQ(network->values.at("y"), (TensorInfo{DataType::kInt32, {-1, 4}}));
}

}  // namespace
}  // namespace encoder_import_test
}  // namespace backplane
