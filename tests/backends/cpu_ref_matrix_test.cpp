// CpuRef: Gemm and MatMul.
#include "cpu_ref_test_util.hpp"

namespace backplane::cpu_ref_test {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

using CpuRefMatrixTest = CpuRefTest;

// A = [[1,2,3],[4,5,6]], B = [[1,0],[0,1],[1,1]]: A*B = [[4,5],[10,11]].
const std::vector<float> kA = {1, 2, 3, 4, 5, 6};
const std::vector<float> kB = {1, 0, 0, 1, 1, 1};
const std::vector<float> kATransposed = {1, 4, 2, 5, 3, 6};
const std::vector<float> kBTransposed = {1, 0, 1, 0, 1, 1};

TEST_F(CpuRefMatrixTest, GemmWithoutCIsAPlainProduct) {
  const auto op = MakeOp("Gemm", {{2, 3}, {3, 2}}, {{2, 2}});
  EXPECT_THAT(Run(op, {kA, kB}), ElementsAre(4, 5, 10, 11));
}

TEST_F(CpuRefMatrixTest, GemmTransposesBothOperandsAndScalesWithScalarC) {
  // 2 * [[4,5],[10,11]] + 0.5 * 10.
  const auto op =
      MakeOp("Gemm", {{3, 2}, {2, 3}, {}}, {{2, 2}},
             {{"transA", int64_t{1}}, {"transB", int64_t{1}}, {"alpha", 2.0f}, {"beta", 0.5f}});
  EXPECT_THAT(Run(op, {kATransposed, kBTransposed, {10}}), ElementsAre(13, 15, 25, 27));
}

TEST_F(CpuRefMatrixTest, GemmBroadcastsEveryShapeOfC) {
  struct Case {
    Shape c_shape;
    std::vector<float> c;
    std::vector<float> expected;
  };
  const Case cases[] = {
      {{2}, {1, 2}, {5, 7, 11, 13}},           // [N]: per column
      {{1, 2}, {1, 2}, {5, 7, 11, 13}},        // [1,N]
      {{2, 1}, {1, 2}, {5, 6, 12, 13}},        // [M,1]: per row
      {{2, 2}, {1, 2, 3, 4}, {5, 7, 13, 15}},  // [M,N]
      {{1}, {3}, {7, 8, 13, 14}},              // single-element vector
  };
  for (const Case& c : cases) {
    const auto op = MakeOp("Gemm", {{2, 3}, {3, 2}, c.c_shape}, {{2, 2}});
    EXPECT_THAT(Run(op, {kA, kB, c.c}), ElementsAreArray(c.expected)) << ToString(c.c_shape);
  }
}

TEST_F(CpuRefMatrixTest, GemmWithOnlyTransA) {
  const auto op =
      MakeOp("Gemm", {{3, 2}, {3, 2}, {2, 2}}, {{2, 2}}, {{"transA", int64_t{1}}, {"beta", 2.0f}});
  EXPECT_THAT(Run(op, {kATransposed, kB, {1, 2, 3, 4}}), ElementsAre(6, 9, 16, 19));
}

TEST_F(CpuRefMatrixTest, GemmOmittedCMarkedUndefinedIsNoBias) {
  auto op = MakeOp("Gemm", {{2, 3}, {3, 2}, {}}, {{2, 2}});
  op.inputs[2].type = DataType::kUndefined;
  EXPECT_THAT(Run(op, {kA, kB}), ElementsAre(4, 5, 10, 11));
}

// ONNX backend test data (onnx/backend/test/data/node/test_gemm_all_attributes, Apache-2.0):
// alpha 0.25, beta 0.35, transA, transB, C [1,5].
TEST_F(CpuRefMatrixTest, GemmMatchesOnnxAllAttributesCase) {
  const auto op = MakeOp(
      "Gemm", {{4, 3}, {5, 4}, {1, 5}}, {{3, 5}},
      {{"alpha", 0.25f}, {"beta", 0.349999994f}, {"transA", int64_t{1}}, {"transB", int64_t{1}}});
  const std::vector<float> a = {0.548813522f, 0.715189338f, 0.602763355f, 0.544883192f,
                                0.423654795f, 0.64589411f,  0.437587202f, 0.891772985f,
                                0.963662744f, 0.383441508f, 0.791725039f, 0.528894901f};
  const std::vector<float> b = {0.568044543f,  0.925596654f, 0.0710360557f, 0.0871293023f,
                                0.0202183966f, 0.832619846f, 0.778156757f,  0.870012164f,
                                0.978618324f,  0.799158573f, 0.461479366f,  0.780529201f,
                                0.118274428f,  0.63992101f,  0.143353283f,  0.944668889f,
                                0.521848321f,  0.414661944f, 0.264555603f,  0.774233699f};
  const std::vector<float> c = {0.456150323f, 0.56843394f, 0.0187897999f, 0.617635489f,
                                0.612095714f};
  EXPECT_THAT(Run(op, {a, b, c}),
              FloatsNear({0.379799128f, 0.483673602f, 0.375014365f, 0.425809324f, 0.44547832f,
                          0.392333448f, 0.636440158f, 0.523567438f, 0.524035096f, 0.563682914f,
                          0.423345327f, 0.638951063f, 0.497470319f, 0.496769249f, 0.525935829f}));
}

TEST_F(CpuRefMatrixTest, GemmRefusesInconsistentShapes) {
  Status inner = backend().IsSupported(MakeOp("Gemm", {{2, 3}, {2, 2}}, {{2, 2}}));
  EXPECT_EQ(inner.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(inner.message(), HasSubstr("inner dimensions differ"));
  Status bias = backend().IsSupported(MakeOp("Gemm", {{2, 3}, {3, 2}, {3}}, {{2, 2}}));
  EXPECT_EQ(bias.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bias.message(), HasSubstr("C [3] does not broadcast to [M,N] = [2,2]"));
  Status flag =
      backend().IsSupported(MakeOp("Gemm", {{2, 3}, {3, 2}}, {{2, 2}}, {{"transA", int64_t{2}}}));
  EXPECT_EQ(flag.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(flag.message(), HasSubstr("'transA' must be 0 or 1"));
}

TEST_F(CpuRefMatrixTest, MatMulOfMatrices) {
  const auto op = MakeOp("MatMul", {{2, 3}, {3, 2}}, {{2, 2}});
  EXPECT_THAT(Run(op, {kA, kB}), ElementsAre(4, 5, 10, 11));
}

TEST_F(CpuRefMatrixTest, MatMulOfVectorsIsAScalar) {
  const auto op = MakeOp("MatMul", {{3}, {3}}, {{}});
  EXPECT_THAT(Run(op, {{1, 2, 3}, {4, 5, 6}}), ElementsAre(32));
}

TEST_F(CpuRefMatrixTest, MatMulOfVectorAndBatchDropsTheRowDim) {
  // [3] x [2,3,2] -> [2,2]: the vector times each matrix of the batch.
  const auto op = MakeOp("MatMul", {{3}, {2, 3, 2}}, {{2, 2}});
  EXPECT_THAT(Run(op, {{1, 2, 3}, {1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1}}), ElementsAre(4, 5, 6, 6));
}

TEST_F(CpuRefMatrixTest, MatMulOfBatchAndVectorDropsTheColumnDim) {
  const auto op = MakeOp("MatMul", {{2, 2, 3}, {3}}, {{2, 2}});
  EXPECT_THAT(Run(op, {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {1, 1, 1}}),
              ElementsAre(6, 15, 24, 33));
}

TEST_F(CpuRefMatrixTest, MatMulBroadcastsBatchDims) {
  // [2,1,1,2] x [3,2,1] -> [2,3,1,1]: out[i][j] = a_i . b_j.
  const auto op = MakeOp("MatMul", {{2, 1, 1, 2}, {3, 2, 1}}, {{2, 3, 1, 1}});
  EXPECT_THAT(Run(op, {{1, 2, 3, 4}, {1, 1, 1, 0, 0, 1}}), ElementsAre(3, 1, 2, 7, 3, 4));
}

TEST_F(CpuRefMatrixTest, MatMulBatchedMatchesAnIndependentLoop) {
  // [2,1,2,3] x [3,3,2] -> [2,3,2,2], checked against a loop written for exactly these shapes.
  std::vector<float> a(12), b(18);
  for (std::size_t i = 0; i < a.size(); ++i)
    a[i] = static_cast<float>(i) - 5.0f;
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<float>(i % 7) * 0.5f;
  std::vector<float> expected;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int m = 0; m < 2; ++m)
        for (int n = 0; n < 2; ++n) {
          float sum = 0;
          for (int k = 0; k < 3; ++k)
            sum += a[i * 6 + m * 3 + k] * b[j * 6 + k * 2 + n];
          expected.push_back(sum);
        }
  const auto op = MakeOp("MatMul", {{2, 1, 2, 3}, {3, 3, 2}}, {{2, 3, 2, 2}});
  EXPECT_THAT(Run(op, {a, b}), FloatsNear(expected));
}

// ONNX backend test data (onnx/backend/test/data/node/test_matmul_4d_1d, Apache-2.0).
TEST_F(CpuRefMatrixTest, MatMulMatchesOnnx4dBy1dCase) {
  const auto op = MakeOp("MatMul", {{1, 2, 4, 3}, {3}}, {{1, 2, 4}});
  const std::vector<float> a = {
      0.625231445f, -1.6020577f,  -1.10438335f,   0.0521650799f, -0.739562988f,  1.54301465f,
      -1.29285693f, 0.267050862f, -0.0392828174f, -1.16809344f,  0.523276687f,   -0.171546325f,
      0.771790564f, 0.82350415f,  2.1632359f,     1.33652794f,   -0.369181842f,  -0.239379182f,
      1.09965956f,  0.655263722f, 0.640131533f,   -1.616956f,    -0.0243261252f, -0.73803091f};
  const std::vector<float> b = {0.279924601f, -0.0981503874f, 0.9101789f};
  EXPECT_THAT(Run(op, {a, b}), FloatsNear({-0.672926188f, 1.49161005f, -0.423868001f, -0.534475744f,
                                           2.10414767f, 0.192484513f, 0.826141596f, -1.12197828f}));
}

TEST_F(CpuRefMatrixTest, MatMulRefusesMismatchedOperands) {
  Status inner = backend().IsSupported(MakeOp("MatMul", {{2, 3}, {4, 2}}, {{2, 2}}));
  EXPECT_EQ(inner.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(inner.message(), HasSubstr("inner dimensions differ: [2,3] and [4,2]"));
  Status batch = backend().IsSupported(MakeOp("MatMul", {{2, 2, 3}, {3, 3, 2}}, {{2, 2, 2}}));
  EXPECT_THAT(batch.message(), HasSubstr("batch dimensions"));
}

}  // namespace
}  // namespace backplane::cpu_ref_test
