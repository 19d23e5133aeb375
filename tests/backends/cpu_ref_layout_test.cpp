// CpuRef: Identity, Flatten, Reshape, Transpose, Concat.
#include "cpu_ref_test_util.hpp"

namespace backplane::cpu_ref_test {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using Ints = std::vector<int64_t>;

using CpuRefLayoutTest = CpuRefTest;

TEST_F(CpuRefLayoutTest, IdentityCopies) {
  const auto op = MakeOp("Identity", {{2, 2}}, {{2, 2}});
  EXPECT_THAT(Run(op, {{1, -2, 3.5f, 0}}), ElementsAre(1, -2, 3.5f, 0));
}

TEST_F(CpuRefLayoutTest, FlattenSplitsTheDimsAtTheAxis) {
  struct Case {
    int64_t axis;
    Shape output;
  };
  for (const Case& c : {Case{0, {1, 24}}, Case{1, {2, 12}}, Case{2, {6, 4}}, Case{3, {24, 1}},
                        Case{-1, {6, 4}}, Case{-3, {1, 24}}}) {
    const auto op = MakeOp("Flatten", {{2, 3, 4}}, {c.output}, {{"axis", c.axis}});
    EXPECT_THAT(Run(op, {Iota(24)}), ElementsAreArray(Iota(24))) << "axis " << c.axis;
  }
  Status out_of_range =
      backend().IsSupported(MakeOp("Flatten", {{2, 3, 4}}, {{24, 1}}, {{"axis", int64_t{4}}}));
  EXPECT_EQ(out_of_range.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(out_of_range.message(), HasSubstr("axis 4 is out of range [-4,3]"));
}

TEST_F(CpuRefLayoutTest, FlattenRefusesAnOutputOfAnotherShape) {
  const auto op = MakeOp("Flatten", {{2, 3, 4}}, {{2, 12}});
  const auto x = Iota(24);
  std::vector<float> y(24);
  const ConstTensorView input{op.inputs[0], x.data()};
  const TensorView output{{DataType::kFloat32, {6, 4}}, y.data()};
  Status status = TryRun(op, {input}, {output});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("output allocated as [6,4], the inputs give [2,12]"));
}

// Reshape's shape is a constant INT64 input, as the host describes it.
class ReshapeCase {
 public:
  ReshapeCase(Shape input, Ints target, AttributeMap attributes = {}) : target_(std::move(target)) {
    op_.op_type = "Reshape";
    op_.name = "reshape";
    op_.attributes = std::move(attributes);
    op_.inputs = {{DataType::kFloat32, std::move(input)},
                  {DataType::kInt64, {static_cast<int64_t>(target_.size())}}};
    op_.outputs = {{DataType::kFloat32, {}}};
    op_.constant_inputs = {nullptr, target_.data()};
  }
  ReshapeCase(const ReshapeCase&) = delete;

  const OperatorDesc& op() const { return op_; }
  OperatorDesc& op() { return op_; }

  // Runs with the output allocated as `output_shape`; the values, or the failed status.
  Status Run(loader::BackendInstance& backend, const Shape& output_shape,
             std::vector<float>* result) const {
    auto workload = backend.CreateWorkload(op_);
    if (!workload.ok())
      return workload.error();
    const auto x = Iota(static_cast<int>(ElementCount(op_.inputs[0].shape)));
    result->assign(static_cast<std::size_t>(ElementCount(output_shape)), NAN);
    const ConstTensorView inputs[2] = {{op_.inputs[0], x.data()}, {op_.inputs[1], target_.data()}};
    const TensorView output{{DataType::kFloat32, output_shape}, result->data()};
    return workload.value()->Execute(inputs, {&output, 1});
  }

 private:
  Ints target_;
  OperatorDesc op_;
};

TEST_F(CpuRefLayoutTest, ReshapeCopiesDimsForZeroAndInfersMinusOne) {
  std::vector<float> y;
  ReshapeCase copy_and_infer({2, 3, 4}, {0, -1});
  ASSERT_TRUE(copy_and_infer.Run(backend(), {2, 12}, &y).ok());
  EXPECT_THAT(y, ElementsAreArray(Iota(24)));
  ReshapeCase middle({2, 3, 4}, {4, 0, -1});  // 0 copies dim 1 (3), -1 is 24 / 12 = 2
  ASSERT_TRUE(middle.Run(backend(), {4, 3, 2}, &y).ok());
  ReshapeCase extend({2, 3, 4}, {1, 2, 1, 12});
  ASSERT_TRUE(extend.Run(backend(), {1, 2, 1, 12}, &y).ok());
  EXPECT_THAT(y, ElementsAreArray(Iota(24)));
  Status wrong = middle.Run(backend(), {4, 6}, &y);
  EXPECT_THAT(wrong.message(), HasSubstr("output allocated as [4,6], the inputs give [4,3,2]"));
}

TEST_F(CpuRefLayoutTest, ReshapeAllowZeroKeepsAZeroDim) {
  // ONNX test_reshape_allowzero_reordered: [0,3,4] -> [3,4,0].
  std::vector<float> y;
  ReshapeCase allow({0, 3, 4}, {3, 4, 0}, {{"allowzero", int64_t{1}}});
  EXPECT_TRUE(allow.Run(backend(), {3, 4, 0}, &y).ok());
  // Without allowzero the last 0 would copy dim 2 (4): 48 elements from none.
  ReshapeCase copy({0, 3, 4}, {3, 4, 0});
  Status status = backend().IsSupported(copy.op());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("has 48 elements, the input [0,3,4] has 0"));
}

TEST_F(CpuRefLayoutTest, ReshapeRefusesBadTargets) {
  ReshapeCase two_inferred({2, 3, 4}, {-1, -1});
  EXPECT_THAT(backend().IsSupported(two_inferred.op()).message(), HasSubstr("more than one -1"));
  ReshapeCase both({2, 3, 4}, {0, -1}, {{"allowzero", int64_t{1}}});
  EXPECT_THAT(backend().IsSupported(both.op()).message(),
              HasSubstr("has both 0 and -1, invalid with allowzero=1"));
  ReshapeCase count({2, 3, 4}, {5, -1});
  EXPECT_THAT(backend().IsSupported(count.op()).message(), HasSubstr("cannot infer the -1"));
  // A computed target is read at run time (cpu_ref_encoder_test.cpp runs it and its errors).
  ReshapeCase computed({2, 3, 4}, {24});
  computed.op().constant_inputs[1] = nullptr;
  EXPECT_TRUE(backend().IsSupported(computed.op()).ok());
  ReshapeCase int32({2, 3, 4}, {24});
  int32.op().inputs[1].type = DataType::kInt32;
  EXPECT_THAT(backend().IsSupported(int32.op()).message(),
              HasSubstr("the shape input must be INT64, is INT32"));
}

TEST_F(CpuRefLayoutTest, ReshapeWithDynamicInputResolvesPerRequest) {
  ReshapeCase dynamic({-1, 3, 4}, {0, -1});
  ASSERT_TRUE(backend().IsSupported(dynamic.op()).ok());
  auto workload = backend().CreateWorkload(dynamic.op());
  ASSERT_TRUE(workload.ok());
  const auto x = Iota(36);
  const int64_t target[2] = {0, -1};
  std::vector<float> y(36);
  const ConstTensorView inputs[2] = {{{DataType::kFloat32, {3, 3, 4}}, x.data()},
                                     {dynamic.op().inputs[1], target}};
  const TensorView output{{DataType::kFloat32, {3, 12}}, y.data()};
  ASSERT_TRUE(workload.value()->Execute(inputs, {&output, 1}).ok());
  EXPECT_THAT(y, ElementsAreArray(x));
}

TEST_F(CpuRefLayoutTest, TransposeDefaultsToReversingTheDims) {
  const auto op = MakeOp("Transpose", {{2, 3}}, {{3, 2}});
  EXPECT_THAT(Run(op, {{1, 2, 3, 4, 5, 6}}), ElementsAre(1, 4, 2, 5, 3, 6));
}

TEST_F(CpuRefLayoutTest, TransposeWithPermMatchesAnIndependentLoop) {
  // perm {2,0,1}: out[i][j][k] = in[j][k][i], in of shape [2,3,4].
  const auto x = Iota(24);
  std::vector<float> expected;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 3; ++k)
        expected.push_back(x[j * 12 + k * 4 + i]);
  const auto op = MakeOp("Transpose", {{2, 3, 4}}, {{4, 2, 3}}, {{"perm", Ints{2, 0, 1}}});
  EXPECT_THAT(Run(op, {x}), ElementsAreArray(expected));
}

TEST_F(CpuRefLayoutTest, TransposeRefusesAnythingButAPermutation) {
  for (const Ints& perm : {Ints{0, 0, 1}, Ints{0, 1}, Ints{0, 1, 3}}) {
    Status status =
        backend().IsSupported(MakeOp("Transpose", {{2, 3, 4}}, {{2, 3, 4}}, {{"perm", perm}}));
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("is not a permutation of the 3 input dims"));
  }
}

TEST_F(CpuRefLayoutTest, ConcatOfThreeInputsAlongTheLastAxis) {
  for (int64_t axis : {1, -1}) {
    const auto op = MakeOp("Concat", {{2, 1}, {2, 2}, {2, 3}}, {{2, 6}}, {{"axis", axis}});
    EXPECT_THAT(Run(op, {{1, 2}, {3, 4, 5, 6}, {7, 8, 9, 10, 11, 12}}),
                ElementsAre(1, 3, 4, 7, 8, 9, 2, 5, 6, 10, 11, 12))
        << "axis " << axis;
  }
}

TEST_F(CpuRefLayoutTest, ConcatAlongTheFirstAxisAppends) {
  const auto op = MakeOp("Concat", {{1, 2}, {2, 2}, {1, 2}}, {{4, 2}}, {{"axis", int64_t{-2}}});
  EXPECT_THAT(Run(op, {{1, 2}, {3, 4, 5, 6}, {7, 8}}), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8));
  const auto one = MakeOp("Concat", {{3}}, {{3}}, {{"axis", int64_t{0}}});
  EXPECT_THAT(Run(one, {{1, 2, 3}}), ElementsAre(1, 2, 3));
}

TEST_F(CpuRefLayoutTest, ConcatRefusesMismatchedInputs) {
  Status dims =
      backend().IsSupported(MakeOp("Concat", {{2, 1}, {3, 2}}, {{2, 3}}, {{"axis", int64_t{1}}}));
  EXPECT_EQ(dims.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(dims.message(), HasSubstr("input 1 [3,2] differs from [2,1] outside axis 1"));
  Status rank =
      backend().IsSupported(MakeOp("Concat", {{2, 1}, {2}}, {{2, 2}}, {{"axis", int64_t{0}}}));
  EXPECT_THAT(rank.message(), HasSubstr("has another rank"));
  Status no_axis = backend().IsSupported(MakeOp("Concat", {{2}, {2}}, {{4}}));
  EXPECT_THAT(no_axis.message(), HasSubstr("attribute 'axis' is required"));
}

}  // namespace
}  // namespace backplane::cpu_ref_test
