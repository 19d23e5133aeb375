// CpuRef: Add, Mul, Relu, Sigmoid, Tanh, Softmax, BatchNormalization. Expected values are worked
// out by hand (in the comments) or by an independent formula in the test.
#include <cmath>

#include "cpu_ref_test_util.hpp"

namespace backplane::cpu_ref_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using CpuRefElementwiseTest = CpuRefTest;

TEST_F(CpuRefElementwiseTest, AddBroadcastsAScalar) {
  const auto op = MakeOp("Add", {{2, 2}, {}}, {{2, 2}});
  EXPECT_THAT(Run(op, {{1, 2, 3, 4}, {10}}), ElementsAre(11, 12, 13, 14));
}

TEST_F(CpuRefElementwiseTest, AddBroadcastsRowAgainstColumn) {
  // [1,3] + [2,1] -> [2,3]: out[i][j] = a[j] + b[i].
  const auto op = MakeOp("Add", {{1, 3}, {2, 1}}, {{2, 3}});
  EXPECT_THAT(Run(op, {{1, 2, 3}, {10, 20}}), ElementsAre(11, 12, 13, 21, 22, 23));
}

TEST_F(CpuRefElementwiseTest, AddBroadcastsAcrossRanks) {
  // [2,1,3] + [2,1] aligns right as [1,2,1]: out[i][j][k] = a[i][0][k] + b[j].
  const auto op = MakeOp("Add", {{2, 1, 3}, {2, 1}}, {{2, 2, 3}});
  EXPECT_THAT(Run(op, {{1, 2, 3, 4, 5, 6}, {10, 20}}),
              ElementsAre(11, 12, 13, 21, 22, 23, 14, 15, 16, 24, 25, 26));
}

TEST_F(CpuRefElementwiseTest, MulBroadcastsTrailingVector) {
  const auto op = MakeOp("Mul", {{2, 3}, {3}}, {{2, 3}});
  EXPECT_THAT(Run(op, {{1, 2, 3, 4, 5, 6}, {2, 0, -1}}), ElementsAre(2, 0, -3, 8, 0, -6));
}

TEST_F(CpuRefElementwiseTest, MulOfColumnAndRowIsTheOuterProduct) {
  const auto op = MakeOp("Mul", {{3, 1}, {1, 2}}, {{3, 2}});
  EXPECT_THAT(Run(op, {{1, 2, 3}, {10, 100}}), ElementsAre(10, 100, 20, 200, 30, 300));
}

TEST_F(CpuRefElementwiseTest, MulOfScalarsIsAScalar) {
  const auto op = MakeOp("Mul", {{}, {}}, {{}});
  EXPECT_THAT(Run(op, {{3}, {-2.5f}}), ElementsAre(-7.5f));
}

TEST_F(CpuRefElementwiseTest, BinaryOpsRefuseShapesThatDoNotBroadcast) {
  for (const char* type : {"Add", "Mul"}) {
    Status status = backend().IsSupported(MakeOp(type, {{2, 3}, {2}}, {{2, 3}}));
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("shapes [2,3] and [2] do not broadcast"));
  }
}

TEST_F(CpuRefElementwiseTest, AddWithDynamicDimRunsOnTheRequestShape) {
  const auto op = MakeOp("Add", {{-1, 3}, {3}}, {{-1, 3}});
  ASSERT_TRUE(backend().IsSupported(op).ok());
  EXPECT_THAT(Run(op, {{{2, 3}, {1, 2, 3, 4, 5, 6}}, {{3}, {1, 1, 1}}}, {2, 3}),
              ElementsAre(2, 3, 4, 5, 6, 7));
  EXPECT_THAT(Run(op, {{{1, 3}, {1, 2, 3}}, {{3}, {1, 1, 1}}}, {1, 3}), ElementsAre(2, 3, 4));
}

TEST_F(CpuRefElementwiseTest, ReluClampsNegativesToZero) {
  const auto op = MakeOp("Relu", {{5}}, {{5}});
  EXPECT_THAT(Run(op, {{-3, -0.5f, 0, 0.5f, 7}}), ElementsAre(0, 0, 0, 0.5f, 7));
}

TEST_F(CpuRefElementwiseTest, SigmoidIsStableAtBothEnds) {
  const std::vector<float> x = {-1000, -20, -1, 0, 1, 20, 1000};
  std::vector<float> expected;
  for (float v : x)
    expected.push_back(static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(v)))));
  const auto op = MakeOp("Sigmoid", {{7}}, {{7}});
  const auto y = Run(op, {x});
  EXPECT_THAT(y, FloatsNear(expected, 1e-6f));
  ASSERT_EQ(y.size(), 7u);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[3], 0.5f);
  EXPECT_EQ(y[6], 1.0f);
}

TEST_F(CpuRefElementwiseTest, TanhMatchesKnownValues) {
  const auto op = MakeOp("Tanh", {{2, 2}}, {{2, 2}});
  // tanh(0.5) = 0.46211715726, tanh(-2) = -0.96402758008.
  EXPECT_THAT(Run(op, {{0, 0.5f, -2, 50}}), FloatsNear({0, 0.46211715726f, -0.96402758008f, 1}));
}

TEST_F(CpuRefElementwiseTest, SoftmaxDefaultsToTheLastAxis) {
  // e^{-2}, e^{-1}, e^0 over their sum 1.503214724.
  const auto op = MakeOp("Softmax", {{2, 3}}, {{2, 3}});
  EXPECT_THAT(Run(op, {{1, 2, 3, 0, 0, 0}}), FloatsNear({0.0900305732f, 0.244728471f, 0.665240956f,
                                                         1.0f / 3, 1.0f / 3, 1.0f / 3}));
}

TEST_F(CpuRefElementwiseTest, SoftmaxOfLargeNumbersDoesNotOverflow) {
  const auto op = MakeOp("Softmax", {{2, 3}}, {{2, 3}});
  EXPECT_THAT(Run(op, {{1000, 1001, 1002, -1000, -1001, -1002}}),
              FloatsNear({0.0900305732f, 0.244728471f, 0.665240956f, 0.665240956f, 0.244728471f,
                          0.0900305732f}));
}

TEST_F(CpuRefElementwiseTest, SoftmaxOverAxisZeroNormalisesColumns) {
  // Columns {1,3}, {2,2}, {3,1}: 1/(1+e^2) = 0.119202922.
  const auto op = MakeOp("Softmax", {{2, 3}}, {{2, 3}}, {{"axis", int64_t{0}}});
  EXPECT_THAT(Run(op, {{1, 2, 3, 3, 2, 1}}),
              FloatsNear({0.119202922f, 0.5f, 0.880797078f, 0.880797078f, 0.5f, 0.119202922f}));
}

TEST_F(CpuRefElementwiseTest, SoftmaxOverAMiddleAxisUsesTheInnerStride) {
  // x[a][b][c] = 4a + 2b + c; softmax over b pairs values 2 apart.
  const auto op = MakeOp("Softmax", {{2, 2, 2}}, {{2, 2, 2}}, {{"axis", int64_t{-2}}});
  const float lo = 0.119202922f, hi = 0.880797078f;
  EXPECT_THAT(Run(op, {{0, 1, 2, 3, 4, 5, 6, 7}}), FloatsNear({lo, lo, hi, hi, lo, lo, hi, hi}));
}

TEST_F(CpuRefElementwiseTest, SoftmaxRefusesAnAxisOutOfRange) {
  Status status =
      backend().IsSupported(MakeOp("Softmax", {{2, 3}}, {{2, 3}}, {{"axis", int64_t{2}}}));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("axis 2 is out of range"));
}

TEST_F(CpuRefElementwiseTest, BatchNormalizationAddsEpsilonToTheVariance) {
  // Channel 0: var 0.25 + eps 0.75 = 1, so y = (x - 1) * 1 + 0.
  // Channel 1: var 3.25 + eps 0.75 = 4 (std 2), so y = (x - 3) / 2 * 2 + 1.
  const auto op = MakeOp("BatchNormalization", {{2, 2, 1, 2}, {2}, {2}, {2}, {2}}, {{2, 2, 1, 2}},
                         {{"epsilon", 0.75f}});
  EXPECT_THAT(Run(op, {{1, 2, 3, 4, 5, 6, 7, 8}, {1, 2}, {0, 1}, {1, 3}, {0.25f, 3.25f}}),
              FloatsNear({0, 1, 1, 2, 4, 5, 5, 6}));
}

TEST_F(CpuRefElementwiseTest, BatchNormalizationDefaultEpsilonIsOneHundredThousandth) {
  const auto op =
      MakeOp("BatchNormalization", {{1, 1}, {1}, {1}, {1}, {1}}, {{1, 1}}, {{"momentum", 0.5f}});
  EXPECT_THAT(Run(op, {{2}, {1}, {0}, {0}, {1}}), FloatsNear({float(2 / std::sqrt(1.00001))}));
}

TEST_F(CpuRefElementwiseTest, BatchNormalizationRefusesStatisticsOfTheWrongSize) {
  Status status = backend().IsSupported(
      MakeOp("BatchNormalization", {{1, 2, 2}, {2}, {2}, {3}, {2}}, {{1, 2, 2}}));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("input_mean must have shape [C] = [2], is [3]"));
}

}  // namespace
}  // namespace backplane::cpu_ref_test
