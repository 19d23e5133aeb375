// CpuRef: Sub, Div, LeakyRelu, HardSigmoid, HardSwish, Clip, Dropout, Pad (issue 20). The ONNX
// suite in
// ../shared/data has no cases for them, so expected values are worked out by hand (in the
// comments) or by a formula in the test written differently from the kernel's.
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu_ref_test_util.hpp"

namespace backplane::cpu_ref_test {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

class CpuRefActivationTest : public CpuRefTest {
 protected:
  // Runs `op` on its data input x alone, as the runtime's request would carry it: the constant
  // inputs (Clip's bounds, Dropout's ratio and training_mode) were read when the workload was
  // created.
  static std::vector<float> RunOnData(const OperatorDesc& op, const std::vector<float>& x) {
    const Shape shape = {static_cast<int64_t>(x.size())};
    return Run(op, {FloatTensor{shape, x}}, shape);
  }
};

// ---- Sub, Div ---------------------------------------------------------------------------------

TEST_F(CpuRefActivationTest, SubBroadcastsATrailingVector) {
  const auto op = MakeOp("Sub", {{2, 3}, {3}}, {{2, 3}});
  EXPECT_THAT(Run(op, {{1, 2, 3, 4, 5, 6}, {1, 0, -1}}), ElementsAre(0, 2, 4, 3, 5, 7));
}

TEST_F(CpuRefActivationTest, SubOfColumnAndRowIsEveryDifference) {
  // [3,1] - [1,2] -> [3,2]: out[i][j] = a[i] - b[j], the order of the operands kept.
  const std::vector<float> a = {1, 2, 3};
  const std::vector<float> b = {10, 100};
  EXPECT_THAT(Run(MakeOp("Sub", {{3, 1}, {1, 2}}, {{3, 2}}), {a, b}),
              ElementsAre(-9, -99, -8, -98, -7, -97));
}

TEST_F(CpuRefActivationTest, DivBroadcastsTheDivisorAcrossRanks) {
  // [2,1,2] / [2,1] aligns right as [1,2,1]: out[i][j][k] = a[i][0][k] / b[j].
  const std::vector<float> a = {2, 4, 6, 8};
  const std::vector<float> b = {2, 4};
  std::vector<float> expected;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      for (int k = 0; k < 2; ++k)
        expected.push_back(a[i * 2 + k] / b[j]);
    }
  }
  EXPECT_THAT(expected, ElementsAre(1, 2, 0.5f, 1, 3, 4, 1.5f, 2));
  EXPECT_THAT(Run(MakeOp("Div", {{2, 1, 2}, {2, 1}}, {{2, 2, 2}}), {a, b}), FloatsNear(expected));
}

TEST_F(CpuRefActivationTest, DivByZeroFollowsIeee) {
  const auto y = Run(MakeOp("Div", {{3}, {}}, {{3}}), {{1, -1, 0}, {0}});
  ASSERT_EQ(y.size(), 3u);
  EXPECT_EQ(y[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(y[1], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(y[2]));
}

TEST_F(CpuRefActivationTest, SubAndDivRefuseShapesThatDoNotBroadcast) {
  for (const char* type : {"Sub", "Div"}) {
    Status status = backend().IsSupported(MakeOp(type, {{2, 3}, {2}}, {{2, 3}}));
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), AllOf(HasSubstr(std::string(type) + " node '"),
                                        HasSubstr("shapes [2,3] and [2] do not broadcast")));
  }
}

// ---- LeakyRelu, HardSigmoid, HardSwish --------------------------------------------------------

TEST_F(CpuRefActivationTest, LeakyReluScalesNegativesByAlpha) {
  // Default alpha 0.01: -2 -> -0.02, -0.5 -> -0.005.
  EXPECT_THAT(Run(MakeOp("LeakyRelu", {{4}}, {{4}}), {{-2, -0.5f, 0, 3}}),
              FloatsNear({-0.02f, -0.005f, 0, 3}));
  EXPECT_THAT(Run(MakeOp("LeakyRelu", {{3}}, {{3}}, {{"alpha", 0.5f}}), {{-4, 1, 2}}),
              FloatsNear({-2, 1, 2}));
}

TEST_F(CpuRefActivationTest, HardSigmoidIsALineClampedToZeroAndOne) {
  // Defaults alpha 0.2, beta 0.5: 0.2x + 0.5 reaches 0 at x = -2.5 and 1 at x = 2.5.
  EXPECT_THAT(Run(MakeOp("HardSigmoid", {{6}}, {{6}}), {{-3, -2.5f, 0, 1, 2.5f, 3}}),
              FloatsNear({0, 0, 0.5f, 0.7f, 1, 1}));
  // alpha 0.25, beta 0.4: -2 -> 0, 0 -> 0.4, 2 -> 0.9, 3 -> 1 (1.15 clamped).
  EXPECT_THAT(
      Run(MakeOp("HardSigmoid", {{4}}, {{4}}, {{"alpha", 0.25f}, {"beta", 0.4f}}), {{-2, 0, 2, 3}}),
      FloatsNear({0, 0.4f, 0.9f, 1}));
}

TEST_F(CpuRefActivationTest, HardSwishMatchesItsPiecewiseForm) {
  // x * relu6(x + 3) / 6: 0 below -3, x above 3, x (x + 3) / 6 between.
  const std::vector<float> x = {-5, -3, -1.5f, -1, 0, 1, 2, 3, 4.5f};
  std::vector<float> expected;
  for (float v : x)
    expected.push_back(v <= -3 ? 0.0f : v >= 3 ? v : v * (v + 3) / 6);
  EXPECT_THAT(Run(MakeOp("HardSwish", {{9}}, {{9}}), {x}), FloatsNear(expected, 1e-6f));
  EXPECT_FLOAT_EQ(expected[3], -1.0f / 3);
}

TEST_F(CpuRefActivationTest, ActivationAttributesAreChecked) {
  Status wrong_type =
      backend().IsSupported(MakeOp("LeakyRelu", {{2}}, {{2}}, {{"alpha", int64_t{1}}}));
  EXPECT_EQ(wrong_type.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_type.message(), AllOf(HasSubstr("LeakyRelu node 'LeakyRelu_node'"),
                                          HasSubstr("attribute 'alpha' must be a float")));
  Status unknown = backend().IsSupported(MakeOp("HardSwish", {{2}}, {{2}}, {{"alpha", 0.5f}}));
  EXPECT_EQ(unknown.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(unknown.message(), HasSubstr("unsupported attribute 'alpha'"));
}

// ---- Clip -------------------------------------------------------------------------------------

// x[6] clipped by constant bounds lo = 0, hi = 6 (Relu6), or with either omitted.
const float kClipLow = 0;
const float kClipHigh = 6;
const std::vector<float> kClipInput = {-7, -0.5f, 0, 3, 6, 6.5f};

OperatorDesc ClipOp(bool with_min, bool with_max) {
  OperatorDesc op = MakeOp("Clip", {{6}, {}, {}}, {{6}});
  op = with_min ? WithConstantInput(op, 1, &kClipLow) : WithOmittedInput(op, 1);
  return with_max ? WithConstantInput(op, 2, &kClipHigh) : WithOmittedInput(op, 2);
}

TEST_F(CpuRefActivationTest, ClipWithBothBoundsIsRelu6) {
  EXPECT_THAT(RunOnData(ClipOp(true, true), kClipInput), ElementsAre(0, 0, 0, 3, 6, 6));
}

TEST_F(CpuRefActivationTest, ClipWithOnlyMinClipsBelow) {
  EXPECT_THAT(RunOnData(ClipOp(true, false), kClipInput), ElementsAre(0, 0, 0, 3, 6, 6.5f));
}

TEST_F(CpuRefActivationTest, ClipWithOnlyMaxClipsAbove) {
  EXPECT_THAT(RunOnData(ClipOp(false, true), kClipInput), ElementsAre(-7, -0.5f, 0, 3, 6, 6));
}

TEST_F(CpuRefActivationTest, ClipWithNeitherBoundIsTheIdentity) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_THAT(RunOnData(ClipOp(false, false), {-inf, -7, 7, inf}), ElementsAre(-inf, -7, 7, inf));
  // Trailing bounds left out altogether, rather than given as "".
  EXPECT_THAT(RunOnData(MakeOp("Clip", {{6}}, {{6}}), kClipInput),
              ElementsAre(-7, -0.5f, 0, 3, 6, 6.5f));
}

TEST_F(CpuRefActivationTest, ClipWithMinAboveMaxGivesMaxAndKeepsNan) {
  // ONNX: when min > max every value becomes max. A NaN is no value to clip.
  const float min = 5;
  const float max = 1;
  const auto op =
      WithConstantInput(WithConstantInput(MakeOp("Clip", {{3}, {}, {}}, {{3}}), 1, &min), 2, &max);
  const auto y = RunOnData(op, {0, 3, NAN});
  ASSERT_EQ(y.size(), 3u);
  EXPECT_EQ(y[0], 1);
  EXPECT_EQ(y[1], 1);
  EXPECT_TRUE(std::isnan(y[2]));
}

TEST_F(CpuRefActivationTest, ClipRefusesABoundThatIsNotAConstant) {
  // A computed min (no constant data) cannot be read at load.
  const auto op = WithConstantInput(MakeOp("Clip", {{6}, {}, {}}, {{6}}), 2, &kClipHigh);
  Status status = backend().IsSupported(op);
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("Clip node 'Clip_node'"),
                                      HasSubstr("min (input 1) must be a constant")));
}

TEST_F(CpuRefActivationTest, ClipRefusesABoundThatIsNotAScalar) {
  const float bounds[2] = {0, 1};
  auto op = MakeOp("Clip", {{6}, {2}}, {{6}});
  op = WithConstantInput(op, 1, bounds);
  Status status = backend().IsSupported(op);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("Clip node 'Clip_node'"),
                                      HasSubstr("min (input 1) must be a scalar, has shape [2]")));
}

TEST_F(CpuRefActivationTest, ClipRefusesClip6Attributes) {
  Status status = backend().IsSupported(MakeOp("Clip", {{6}}, {{6}}, {{"max", 6.0f}}));
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("Clip node 'Clip_node'"), HasSubstr("attribute 'max' is Clip-6's")));
}

// ---- Dropout ----------------------------------------------------------------------------------

TEST_F(CpuRefActivationTest, DropoutInInferenceIsTheIdentity) {
  EXPECT_THAT(Run(MakeOp("Dropout", {{2, 2}}, {{2, 2}}), {{1, -2, 3.5f, 0}}),
              ElementsAre(1, -2, 3.5f, 0));
}

TEST_F(CpuRefActivationTest, DropoutIgnoresItsRatioAndAFalseTrainingMode) {
  // The ratio scales nothing in inference; seed only matters when training.
  const float ratio = 0.5f;
  const uint8_t training = 0;
  auto op = MakeOp("Dropout", {{3}, {}, {}}, {{3}}, {{"seed", int64_t{7}}});
  op = WithConstantInput(WithConstantInput(op, 1, &ratio), 2, &training, DataType::kBool);
  EXPECT_THAT(RunOnData(op, {1, 2, 3}), ElementsAre(1, 2, 3));
}

TEST_F(CpuRefActivationTest, DropoutRefusesTrainingMode) {
  const uint8_t training = 1;
  const auto op =
      WithConstantInput(MakeOp("Dropout", {{3}, {}, {}}, {{3}}), 2, &training, DataType::kBool);
  Status status = backend().IsSupported(op);
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("Dropout node 'Dropout_node'"), HasSubstr("training_mode is true")));
}

TEST_F(CpuRefActivationTest, DropoutRefusesATrainingModeThatIsNotAConstant) {
  auto op = MakeOp("Dropout", {{3}, {}, {}}, {{3}});
  op.inputs[2].type = DataType::kBool;
  Status status = backend().IsSupported(op);
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("Dropout node 'Dropout_node'"),
                    HasSubstr("training_mode (input 2) must be absent or a constant")));
}

TEST_F(CpuRefActivationTest, DropoutRefusesTheMaskOutput) {
  auto op = MakeOp("Dropout", {{3}}, {{3}, {3}});
  op.outputs[1].type = DataType::kBool;
  Status status = backend().IsSupported(op);
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("Dropout node 'Dropout_node'"),
                                      HasSubstr("the mask output (output 1) is a BOOL tensor")));
}

// ---- Pad --------------------------------------------------------------------------------------

// Pad of an input of `shape` by the constant `pads` (held by the caller), value omitted.
OperatorDesc PadOp(const Shape& shape, const std::vector<int64_t>& pads, const Shape& out,
                   AttributeMap attributes = {}) {
  auto op =
      MakeOp("Pad", {shape, {static_cast<int64_t>(pads.size())}}, {out}, std::move(attributes));
  return WithConstantInput(op, 1, pads.data(), DataType::kInt64);
}

TEST_F(CpuRefActivationTest, PadSurroundsTheInputWithTheConstant) {
  // [2,2] padded by one row above, one column left and two right, with 9:
  //   9 9 9 9 9
  //   9 1 2 9 9
  //   9 3 4 9 9
  const std::vector<int64_t> pads = {1, 1, 0, 2};
  const float value = 9;
  const auto op = WithConstantInput(MakeOp("Pad", {{2, 2}, {4}, {}}, {{3, 5}}), 1, pads.data(),
                                    DataType::kInt64);
  const auto with_value = WithConstantInput(op, 2, &value);
  EXPECT_THAT(Run(with_value, {FloatTensor{{2, 2}, {1, 2, 3, 4}}}, {3, 5}),
              ElementsAre(9, 9, 9, 9, 9, 9, 1, 2, 9, 9, 9, 3, 4, 9, 9));
}

TEST_F(CpuRefActivationTest, PadDefaultsToZeroAndNegativePadsCrop) {
  // [2,3]: crop the first column, add a row of zeros below.
  //   1 2 3      2 3
  //   4 5 6  ->  5 6
  //              0 0
  const std::vector<int64_t> pads = {0, -1, 1, 0};
  const auto op = PadOp({2, 3}, pads, {3, 2}, {{"mode", std::string("constant")}});
  EXPECT_THAT(Run(op, {FloatTensor{{2, 3}, {1, 2, 3, 4, 5, 6}}}, {3, 2}),
              ElementsAre(2, 3, 5, 6, 0, 0));
}

TEST_F(CpuRefActivationTest, PadOfThreeAxesMatchesCoordinateArithmetic) {
  // Every output element checked against its coordinates: x[a][b][c] = 100a + 10b + c + 1 where
  // (a, b, c) = the output's minus the begin pads lies inside [2,3,2], else 0.
  const std::vector<int64_t> pads = {1, 0, 2, 0, 1, 1};
  const Shape in = {2, 3, 2}, out = {3, 4, 5};
  std::vector<float> x, expected;
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 2; ++c)
        x.push_back(100.0f * a + 10.0f * b + c + 1);
  for (int a = 0; a < 3; ++a) {
    for (int b = 0; b < 4; ++b) {
      for (int c = 0; c < 5; ++c) {
        const int ia = a - 1, ib = b, ic = c - 2;
        const bool inside = ia >= 0 && ia < 2 && ib >= 0 && ib < 3 && ic >= 0 && ic < 2;
        expected.push_back(inside ? 100.0f * ia + 10.0f * ib + ic + 1 : 0.0f);
      }
    }
  }
  EXPECT_THAT(Run(PadOp(in, pads, out), {FloatTensor{in, x}}, out), ElementsAreArray(expected));
}

TEST_F(CpuRefActivationTest, PadRefusesOtherModes) {
  const std::vector<int64_t> pads = {0, 1, 0, 1};
  Status reflect =
      backend().IsSupported(PadOp({2, 2}, pads, {2, 4}, {{"mode", std::string("reflect")}}));
  EXPECT_EQ(reflect.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(reflect.message(), AllOf(HasSubstr("Pad node 'Pad_node'"),
                                       HasSubstr("mode 'reflect' is not supported")));
  Status unknown =
      backend().IsSupported(PadOp({2, 2}, pads, {2, 4}, {{"mode", std::string("mirror")}}));
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(),
              AllOf(HasSubstr("Pad node 'Pad_node'"), HasSubstr("unknown mode 'mirror'")));
}

TEST_F(CpuRefActivationTest, PadRefusesPadsThatAreNotAConstantOrDoNotFit) {
  auto computed = MakeOp("Pad", {{2, 2}, {4}}, {{2, 4}});
  computed.inputs[1].type = DataType::kInt64;
  Status status = backend().IsSupported(computed);
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("Pad node 'Pad_node'"),
                                      HasSubstr("pads (input 1) must be a constant")));
  const std::vector<int64_t> cropping = {0, -2, 0, -1};
  Status cropped = backend().IsSupported(PadOp({2, 2}, cropping, {2, 0}));
  EXPECT_EQ(cropped.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(cropped.message(), HasSubstr("axis 1: pads -2 and -1 crop a dim of 2 below 0"));
}

}  // namespace
}  // namespace backplane::cpu_ref_test
