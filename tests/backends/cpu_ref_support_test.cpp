// CpuRef: what IsSupported and CreateWorkload accept and refuse, and how Execute treats bad calls.
#include <cmath>

#include "cpu_ref_test_util.hpp"

namespace backplane::cpu_ref_test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Ints = std::vector<int64_t>;

using CpuRefSupportTest = CpuRefTest;

// A valid description of every op of the target list.
std::vector<OperatorDesc> EveryOp() {
  static const int64_t kShape[] = {3, 4};
  OperatorDesc reshape = MakeOp("Reshape", {{2, 6}, {2}}, {{3, 4}});
  reshape.inputs[1].type = DataType::kInt64;
  reshape.constant_inputs[1] = kShape;
  static const float kBounds[] = {0, 6};
  const OperatorDesc clip = WithConstantInput(
      WithConstantInput(MakeOp("Clip", {{4}, {}, {}}, {{4}}), 1, &kBounds[0]), 2, &kBounds[1]);
  static const int64_t kPads[] = {0, 1, 0, 1};
  const OperatorDesc pad =
      WithConstantInput(MakeOp("Pad", {{2, 3}, {4}}, {{2, 5}}), 1, kPads, DataType::kInt64);
  return {
      MakeOp("Sub", {{2, 3}, {3}}, {{2, 3}}),
      MakeOp("Div", {{2, 3}, {1}}, {{2, 3}}),
      MakeOp("LeakyRelu", {{4}}, {{4}}, {{"alpha", 0.1f}}),
      MakeOp("HardSigmoid", {{4}}, {{4}}, {{"alpha", 0.1f}, {"beta", 0.6f}}),
      MakeOp("HardSwish", {{4}}, {{4}}),
      clip,
      MakeOp("Dropout", {{4}}, {{4}}, {{"seed", int64_t{1}}}),
      pad,
      MakeOp("Add", {{2, 3}, {3}}, {{2, 3}}),
      MakeOp("Mul", {{2, 3}, {1}}, {{2, 3}}),
      MakeOp("Relu", {{4}}, {{4}}),
      MakeOp("Sigmoid", {{4}}, {{4}}),
      MakeOp("Tanh", {{4}}, {{4}}),
      MakeOp("Softmax", {{2, 4}}, {{2, 4}}, {{"axis", int64_t{1}}}),
      MakeOp("Gemm", {{2, 3}, {3, 4}, {4}}, {{2, 4}}, {{"alpha", 1.0f}}),
      MakeOp("MatMul", {{2, 3}, {3, 4}}, {{2, 4}}),
      MakeOp("Conv", {{1, 2, 5, 5}, {4, 2, 3, 3}, {4}}, {{1, 4, 5, 5}},
             {{"pads", Ints{1, 1, 1, 1}}}),
      MakeOp("MaxPool", {{1, 2, 4, 4}}, {{1, 2, 2, 2}},
             {{"kernel_shape", Ints{2, 2}}, {"strides", Ints{2, 2}}}),
      MakeOp("AveragePool", {{1, 2, 4, 4}}, {{1, 2, 3, 3}}, {{"kernel_shape", Ints{2, 2}}}),
      MakeOp("GlobalAveragePool", {{1, 2, 4, 4}}, {{1, 2, 1, 1}}),
      MakeOp("GlobalMaxPool", {{1, 2, 4, 4}}, {{1, 2, 1, 1}}),
      MakeOp("BatchNormalization", {{1, 2, 4}, {2}, {2}, {2}, {2}}, {{1, 2, 4}}),
      MakeOp("Flatten", {{2, 3, 4}}, {{2, 12}}),
      reshape,
      MakeOp("Transpose", {{2, 3}}, {{3, 2}}),
      MakeOp("Concat", {{2, 3}, {2, 3}}, {{4, 3}}, {{"axis", int64_t{0}}}),
      MakeOp("Identity", {{4}}, {{4}}),
  };
}

TEST_F(CpuRefSupportTest, SupportsEveryOpOfTheTargetList) {
  const auto ops = EveryOp();
  EXPECT_EQ(ops.size(), 27u);
  for (const auto& op : ops) {
    EXPECT_TRUE(backend().IsSupported(op).ok())
        << op.op_type << ": " << backend().IsSupported(op).ToString();
    EXPECT_TRUE(backend().CreateWorkload(op).ok()) << op.op_type;
  }
}

TEST_F(CpuRefSupportTest, UnknownAttributesAreRefusedNotIgnored) {
  for (auto op : EveryOp()) {
    op.attributes["bogus"] = int64_t{1};
    Status status = backend().IsSupported(op);
    EXPECT_EQ(status.code(), StatusCode::kUnimplemented) << op.op_type;
    EXPECT_THAT(status.message(), AllOf(HasSubstr(op.op_type + " node '" + op.name + "'"),
                                        HasSubstr("unsupported attribute 'bogus'")));
    auto workload = backend().CreateWorkload(op);
    ASSERT_FALSE(workload.ok());
    EXPECT_EQ(workload.error().message(), status.message()) << "same check at creation";
  }
}

TEST_F(CpuRefSupportTest, NonFloatInputsAreRefused) {
  auto conv = MakeOp("Conv", {{1, 1, 3, 3}, {1, 1, 2, 2}}, {{1, 1, 2, 2}});
  conv.inputs[1].type = DataType::kInt64;
  Status status = backend().IsSupported(conv);
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("Conv node 'Conv_node'"), HasSubstr("FP32 only; input 1 is INT64")));
  // Add takes INT64 too (shape arithmetic), but one type for both inputs.
  auto add = MakeOp("Add", {{2}, {2}}, {{2}});
  add.inputs[1].type = DataType::kInt64;
  EXPECT_EQ(backend().IsSupported(add).code(), StatusCode::kInvalidArgument);
  auto add_uint8 = MakeOp("Add", {{2}, {2}}, {{2}});
  add_uint8.inputs[0].type = add_uint8.inputs[1].type = add_uint8.outputs[0].type =
      DataType::kUint8;
  EXPECT_THAT(backend().IsSupported(add_uint8).message(), HasSubstr("input 0 is UINT8"));
  auto relu = MakeOp("Relu", {{2}}, {{2}});
  relu.inputs[0].type = DataType::kFloat64;
  EXPECT_THAT(backend().IsSupported(relu).message(), HasSubstr("input 0 is FP64"));
  auto matmul = MakeOp("MatMul", {{2, 2}, {2, 2}}, {{2, 2}});
  matmul.outputs[0].type = DataType::kInt8;
  EXPECT_THAT(backend().IsSupported(matmul).message(), HasSubstr("output 0 is INT8"));
}

TEST_F(CpuRefSupportTest, MaxPoolWithIndicesOutputIsRefused) {
  auto op = MakeOp("MaxPool", {{1, 1, 4, 4}}, {{1, 1, 2, 2}, {1, 1, 2, 2}},
                   {{"kernel_shape", Ints{2, 2}}, {"strides", Ints{2, 2}}});
  op.outputs[1].type = DataType::kInt64;
  Status status = backend().IsSupported(op);
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("MaxPool node 'MaxPool_node'"),
                    HasSubstr("optional second output Indices is not supported")));
}

TEST_F(CpuRefSupportTest, BatchNormalizationTrainingModeIsRefused) {
  const auto op = MakeOp("BatchNormalization", {{1, 2, 4}, {2}, {2}, {2}, {2}},
                         {{1, 2, 4}, {2}, {2}}, {{"training_mode", int64_t{1}}});
  Status status = backend().IsSupported(op);
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("training_mode=1 is not supported"));
}

TEST_F(CpuRefSupportTest, ConstantIsNotABackendOp) {
  const auto op = MakeOp("Constant", {}, {{2}});
  Status status = backend().IsSupported(op);
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("Constant node 'Constant_node'"),
                                      HasSubstr("Constant is not a backend op")));
  EXPECT_FALSE(backend().CreateWorkload(op).ok());
}

// ONNX defines four auto_pad values: another is a malformed model, not an op another backend may
// run (the SDK's rule, OpRulesTest.AnAutoPadOutsideOnnxsFourIsInvalid).
TEST_F(CpuRefSupportTest, UnknownAutoPadValueIsInvalid) {
  for (const char* type : {"Conv", "MaxPool", "AveragePool"}) {
    auto op = MakeOp(type, {{1, 1, 4, 4}, {1, 1, 2, 2}}, {{1, 1, 4, 4}},
                     {{"auto_pad", std::string("SAME")}, {"kernel_shape", Ints{2, 2}}});
    if (std::string(type) != "Conv")
      op.inputs.pop_back();
    Status status = backend().IsSupported(op);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << type;
    EXPECT_THAT(status.message(), HasSubstr("unknown auto_pad value 'SAME'")) << type;
  }
}

TEST_F(CpuRefSupportTest, UnknownOpsAreNamed) {
  Status status = backend().IsSupported(MakeOp("LSTM", {{1}}, {{1}}));
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("CpuRef does not implement op LSTM (node 'LSTM_node')"));
}

TEST_F(CpuRefSupportTest, WrongInputCountsAndAttributeTypesAreInvalid) {
  Status count = backend().IsSupported(MakeOp("Add", {{2}}, {{2}}));
  EXPECT_EQ(count.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(count.message(), HasSubstr("needs 2 input(s), has 1"));
  Status type =
      backend().IsSupported(MakeOp("Softmax", {{2}}, {{2}}, {{"axis", std::string("last")}}));
  EXPECT_EQ(type.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(type.message(), HasSubstr("attribute 'axis' must be an int"));
}

TEST_F(CpuRefSupportTest, ExecuteRefusesBadCallsWithoutWriting) {
  const auto op = MakeOp("Add", {{2}, {2}}, {{2}});
  const float a[2] = {1, 2}, b[2] = {3, 4};
  float y[2] = {-7, -7};
  const ConstTensorView a_view{op.inputs[0], a}, b_view{op.inputs[1], b};
  const TensorView wrong_shape{{DataType::kFloat32, {1}}, y};
  Status shape = TryRun(op, {a_view, b_view}, {wrong_shape});
  EXPECT_EQ(shape.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(shape.message(), HasSubstr("output allocated as [1], the inputs give [2]"));
  const TensorView output{op.outputs[0], y};
  Status arity = TryRun(op, {a_view}, {output});
  EXPECT_EQ(arity.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(arity.message(), HasSubstr("got 1 input(s) and 1 output(s)"));
  const ConstTensorView unresolved{{DataType::kFloat32, {-1}}, a};
  EXPECT_THAT(TryRun(op, {unresolved, b_view}, {output}).message(), HasSubstr("not resolved"));
  EXPECT_EQ(y[0], -7);
  EXPECT_EQ(y[1], -7);
}

TEST_F(CpuRefSupportTest, DescribesItsOptions) {
  const auto options = backend().DescribeOptions();
  ASSERT_EQ(options.size(), 2u);
  EXPECT_EQ(options[0].name, "deterministic");
  EXPECT_EQ(options[1].name, "check_finite");
  EXPECT_EQ(backend().DescribeCallOptions(), std::vector<std::string>{"check_finite"});
  EXPECT_TRUE(backend().UpdateOptions({{"deterministic", true}}).ok());
  EXPECT_EQ(backend().UpdateOptions({{"threads", int64_t{2}}}).code(),
            StatusCode::kInvalidArgument);
}

// check_finite (SDK 1.4, per call): a Div by zero makes an infinity, which a call that asks for
// the check gets as an error naming the node; the same workload without the call's value runs
// as prepared (off), and one prepared with it on checks every call.
TEST_F(CpuRefSupportTest, CheckFiniteNamesTheNodeOnlyWhenAsked) {
  const OperatorDesc op = MakeOp("Div", {{2}, {2}}, {{2}});
  const float a[] = {1, 2};
  const float b[] = {1, 0};
  float y[2] = {};
  const std::vector<ConstTensorView> inputs = {{{DataType::kFloat32, {2}}, a},
                                               {{DataType::kFloat32, {2}}, b}};
  const std::vector<TensorView> outputs = {{{DataType::kFloat32, {2}}, y}};
  auto workload = backend().CreateWorkload(op);
  ASSERT_TRUE(workload.ok()) << workload.error().ToString();
  EXPECT_TRUE(workload.value()->Execute(inputs, outputs).ok()) << "prepared with the default";
  EXPECT_TRUE(std::isinf(y[1]));

  BackendOptions call = backend().EffectiveOptions();
  call["check_finite"] = true;
  const Status refused = workload.value()->Execute(inputs, outputs, call);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              HasSubstr("CpuRef check_finite: node '" + op.name + "' output 0 element 1 is inf"));
  EXPECT_TRUE(workload.value()->Execute(inputs, outputs).ok()) << "for that call alone";

  auto checking = backend().CreateWorkload(op, {{"check_finite", true}});
  ASSERT_TRUE(checking.ok()) << checking.error().ToString();
  EXPECT_EQ(checking.value()->Execute(inputs, outputs).code(), StatusCode::kInvalidArgument);
  call["check_finite"] = false;
  EXPECT_TRUE(checking.value()->Execute(inputs, outputs, call).ok()) << "the call's value wins";
}

}  // namespace
}  // namespace backplane::cpu_ref_test
