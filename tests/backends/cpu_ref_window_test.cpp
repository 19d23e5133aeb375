// CpuRef: Conv, MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool.
#include <atomic>
#include <thread>

#include "cpu_ref_test_util.hpp"

namespace backplane::cpu_ref_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Ints = std::vector<int64_t>;

using CpuRefWindowTest = CpuRefTest;

// 1 2 3 / 4 5 6 / 7 8 9
const std::vector<float> kThreeByThree = {1, 2, 3, 4, 5, 6, 7, 8, 9};
const std::vector<float> kOnes4 = {1, 1, 1, 1};

TEST_F(CpuRefWindowTest, ConvSlidesWithoutPadding) {
  const auto op = MakeOp("Conv", {{1, 1, 3, 3}, {1, 1, 2, 2}}, {{1, 1, 2, 2}});
  EXPECT_THAT(Run(op, {kThreeByThree, kOnes4}), ElementsAre(12, 16, 24, 28));
}

TEST_F(CpuRefWindowTest, ConvAddsBiasPerBatchItem) {
  const auto op = MakeOp("Conv", {{2, 1, 2, 2}, {1, 1, 2, 2}, {1}}, {{2, 1, 1, 1}});
  EXPECT_THAT(Run(op, {Iota(8, 1), kOnes4, {0.5f}}), ElementsAre(10.5f, 26.5f));
}

TEST_F(CpuRefWindowTest, ConvWithAsymmetricPads) {
  // pads [top=0, left=1, bottom=1, right=0]: windows reach one column left and one row down.
  const auto op =
      MakeOp("Conv", {{1, 1, 3, 3}, {1, 1, 2, 2}}, {{1, 1, 3, 3}}, {{"pads", Ints{0, 1, 1, 0}}});
  EXPECT_THAT(Run(op, {kThreeByThree, kOnes4}), ElementsAre(5, 12, 16, 11, 24, 28, 7, 15, 17));
}

TEST_F(CpuRefWindowTest, ConvWithStridesAndPads) {
  // 3x3 kernel of ones, stride 2, pads 1: sums of 3x3 neighbourhoods at (0,0), (0,2), (2,0), (2,2).
  const auto op =
      MakeOp("Conv", {{1, 1, 3, 3}, {1, 1, 3, 3}}, {{1, 1, 2, 2}},
             {{"pads", Ints{1, 1, 1, 1}}, {"strides", Ints{2, 2}}, {"kernel_shape", Ints{3, 3}}});
  EXPECT_THAT(Run(op, {kThreeByThree, std::vector<float>(9, 1)}),
              ElementsAre(1 + 2 + 4 + 5, 2 + 3 + 5 + 6, 4 + 5 + 7 + 8, 5 + 6 + 8 + 9));
}

TEST_F(CpuRefWindowTest, ConvWithDilations) {
  // x[i][j] = 4i + j; a 2x2 kernel dilated by 2 sums x[r][c], x[r][c+2], x[r+2][c], x[r+2][c+2]
  // = 4 * (4r + c) + 20.
  const auto op =
      MakeOp("Conv", {{1, 1, 4, 4}, {1, 1, 2, 2}}, {{1, 1, 2, 2}}, {{"dilations", Ints{2, 2}}});
  EXPECT_THAT(Run(op, {Iota(16), kOnes4}), ElementsAre(20, 24, 36, 40));
}

TEST_F(CpuRefWindowTest, ConvSameUpperPadsAtTheEndAndSameLowerAtTheBeginning) {
  // 1-D, x = 1 2 3 4, w = 1 10, one padding element in total.
  const std::vector<float> x = {1, 2, 3, 4}, w = {1, 10};
  const auto upper = MakeOp("Conv", {{1, 1, 4}, {1, 1, 2}}, {{1, 1, 4}},
                            {{"auto_pad", std::string("SAME_UPPER")}});
  EXPECT_THAT(Run(upper, {x, w}), ElementsAre(21, 32, 43, 4));
  const auto lower = MakeOp("Conv", {{1, 1, 4}, {1, 1, 2}}, {{1, 1, 4}},
                            {{"auto_pad", std::string("SAME_LOWER")}});
  EXPECT_THAT(Run(lower, {x, w}), ElementsAre(10, 21, 32, 43));
  const auto valid =
      MakeOp("Conv", {{1, 1, 4}, {1, 1, 2}}, {{1, 1, 3}}, {{"auto_pad", std::string("VALID")}});
  EXPECT_THAT(Run(valid, {x, w}), ElementsAre(21, 32, 43));
}

// ONNX backend test data (onnx/backend/test/data/node/test_conv_with_autopad_same, Apache-2.0):
// SAME_LOWER, 3x3 kernel of ones, stride 2, 5x5 input 0..24.
TEST_F(CpuRefWindowTest, ConvMatchesOnnxAutopadSameCase) {
  const auto op = MakeOp("Conv", {{1, 1, 5, 5}, {1, 1, 3, 3}}, {{1, 1, 3, 3}},
                         {{"auto_pad", std::string("SAME_LOWER")},
                          {"kernel_shape", Ints{3, 3}},
                          {"strides", Ints{2, 2}}});
  EXPECT_THAT(Run(op, {Iota(25), std::vector<float>(9, 1)}),
              ElementsAre(12, 27, 24, 63, 108, 81, 72, 117, 84));
}

TEST_F(CpuRefWindowTest, ConvWithTwoGroups) {
  // Maps 0,1 read channels 0,1 (x = 1,2); maps 2,3 read channels 2,3 (x = 3,4).
  const auto op =
      MakeOp("Conv", {{1, 4, 1, 1}, {4, 2, 1, 1}}, {{1, 4, 1, 1}}, {{"group", int64_t{2}}});
  EXPECT_THAT(Run(op, {{1, 2, 3, 4}, {1, 10, 2, 20, 100, 1000, 3, 30}}),
              ElementsAre(21, 42, 4300, 129));
}

TEST_F(CpuRefWindowTest, ConvDepthwise) {
  // group = C = 2: channel 0 convolved with [1,1], channel 1 with [1,-1].
  const auto op =
      MakeOp("Conv", {{1, 2, 1, 3}, {2, 1, 1, 2}, {2}}, {{1, 2, 1, 2}}, {{"group", int64_t{2}}});
  EXPECT_THAT(Run(op, {{1, 2, 3, 10, 20, 30}, {1, 1, 1, -1}, {0, 100}}), ElementsAre(3, 5, 90, 90));
}

TEST_F(CpuRefWindowTest, ConvInThreeSpatialDims) {
  const auto op = MakeOp("Conv", {{1, 1, 2, 2, 2}, {1, 1, 2, 2, 2}}, {{1, 1, 1, 1, 1}});
  EXPECT_THAT(Run(op, {Iota(8, 1), std::vector<float>(8, 1)}), ElementsAre(36));
}

TEST_F(CpuRefWindowTest, ConvWithDynamicShapesFollowsEachRequest) {
  const auto op = MakeOp("Conv", {{-1, 1, -1, -1}, {1, 1, 2, 2}}, {{-1, 1, -1, -1}});
  ASSERT_TRUE(backend().IsSupported(op).ok());
  EXPECT_THAT(Run(op, {{{1, 1, 3, 3}, kThreeByThree}, {{1, 1, 2, 2}, kOnes4}}, {1, 1, 2, 2}),
              ElementsAre(12, 16, 24, 28));
  EXPECT_THAT(Run(op, {{{1, 1, 2, 3}, Iota(6, 1)}, {{1, 1, 2, 2}, kOnes4}}, {1, 1, 1, 2}),
              ElementsAre(12, 16));
}

TEST_F(CpuRefWindowTest, ConvRefusesInconsistentWeights) {
  Status channels =
      backend().IsSupported(MakeOp("Conv", {{1, 4, 3, 3}, {2, 3, 1, 1}}, {{1, 2, 3, 3}}));
  EXPECT_EQ(channels.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(channels.message(), HasSubstr("needs C/group = 4 input channels"));
  Status groups = backend().IsSupported(
      MakeOp("Conv", {{1, 4, 3, 3}, {3, 2, 1, 1}}, {{1, 3, 3, 3}}, {{"group", int64_t{2}}}));
  EXPECT_THAT(groups.message(), HasSubstr("feature maps do not split into group=2"));
  Status kernel = backend().IsSupported(
      MakeOp("Conv", {{1, 1, 3, 3}, {1, 1, 2, 2}}, {{1, 1, 2, 2}}, {{"kernel_shape", Ints{3, 3}}}));
  EXPECT_THAT(kernel.message(), HasSubstr("kernel_shape does not match W"));
}

TEST_F(CpuRefWindowTest, MaxPoolTakesTheMaximumOfEachWindow) {
  const auto op = MakeOp("MaxPool", {{1, 1, 4, 4}}, {{1, 1, 2, 2}},
                         {{"kernel_shape", Ints{2, 2}}, {"strides", Ints{2, 2}}});
  EXPECT_THAT(Run(op, {Iota(16)}), ElementsAre(5, 7, 13, 15));
}

TEST_F(CpuRefWindowTest, MaxPoolCeilModeAddsAPartialWindow) {
  // ONNX test_maxpool_2d_ceil: 3x3 kernel, stride 2 on 1..16: windows at rows/cols 0 and 2.
  const auto op =
      MakeOp("MaxPool", {{1, 1, 4, 4}}, {{1, 1, 2, 2}},
             {{"kernel_shape", Ints{3, 3}}, {"strides", Ints{2, 2}}, {"ceil_mode", int64_t{1}}});
  EXPECT_THAT(Run(op, {Iota(16, 1)}), ElementsAre(11, 12, 15, 16));
}

TEST_F(CpuRefWindowTest, MaxPoolCeilModeDropsAWindowStartingPastTheInput) {
  // ONNX test_maxpool_2d_ceil_output_size_reduce_by_one: 1x1 kernel, stride 2 on 2x2.
  const auto op =
      MakeOp("MaxPool", {{1, 1, 2, 2}}, {{1, 1, 1, 1}},
             {{"kernel_shape", Ints{1, 1}}, {"strides", Ints{2, 2}}, {"ceil_mode", int64_t{1}}});
  EXPECT_THAT(Run(op, {{1, 2, 3, 4}}), ElementsAre(1));
}

// ONNX backend test data (onnx/backend/test/data/node/test_maxpool_2d_dilations, Apache-2.0).
TEST_F(CpuRefWindowTest, MaxPoolMatchesOnnxDilationsCase) {
  const auto op = MakeOp("MaxPool", {{1, 1, 4, 4}}, {{1, 1, 2, 2}},
                         {{"kernel_shape", Ints{2, 2}},
                          {"strides", Ints{1, 1}},
                          {"dilations", Ints{2, 2}},
                          {"storage_order", int64_t{0}}});
  EXPECT_THAT(Run(op, {Iota(16, 1)}), ElementsAre(11, 12, 15, 16));
}

TEST_F(CpuRefWindowTest, MaxPoolIgnoresPaddingAndSamePadsTheRightEnd) {
  // Negative inputs: a padded position never wins the maximum.
  const std::vector<float> x = {-1, -5, -2, -3};
  const auto upper = MakeOp("MaxPool", {{1, 1, 4}}, {{1, 1, 4}},
                            {{"kernel_shape", Ints{2}}, {"auto_pad", std::string("SAME_UPPER")}});
  EXPECT_THAT(Run(upper, {x}), ElementsAre(-1, -2, -2, -3));
  const auto lower = MakeOp("MaxPool", {{1, 1, 4}}, {{1, 1, 4}},
                            {{"kernel_shape", Ints{2}}, {"auto_pad", std::string("SAME_LOWER")}});
  EXPECT_THAT(Run(lower, {x}), ElementsAre(-1, -1, -2, -2));
  const auto padded = MakeOp("MaxPool", {{1, 1, 4}}, {{1, 1, 5}},
                             {{"kernel_shape", Ints{2}}, {"pads", Ints{1, 1}}});
  EXPECT_THAT(Run(padded, {x}), ElementsAre(-1, -1, -2, -2, -3));
}

TEST_F(CpuRefWindowTest, AveragePoolCountIncludePadDecidesTheDivisor) {
  // 2x2 input 1 2 / 3 4, 2x2 kernel, pads 1: every window holds 1, 2 or 4 real elements.
  AttributeMap attributes = {{"kernel_shape", Ints{2, 2}}, {"pads", Ints{1, 1, 1, 1}}};
  const auto exclude = MakeOp("AveragePool", {{1, 1, 2, 2}}, {{1, 1, 3, 3}}, attributes);
  EXPECT_THAT(Run(exclude, {{1, 2, 3, 4}}), ElementsAre(1, 1.5f, 2, 2, 2.5f, 3, 3, 3.5f, 4));
  attributes["count_include_pad"] = int64_t{1};
  const auto include = MakeOp("AveragePool", {{1, 1, 2, 2}}, {{1, 1, 3, 3}}, attributes);
  EXPECT_THAT(Run(include, {{1, 2, 3, 4}}),
              ElementsAre(0.25f, 0.75f, 0.5f, 1, 2.5f, 1.5f, 0.75f, 1.75f, 1));
}

TEST_F(CpuRefWindowTest, AveragePoolCeilModeCountsPadsButNotBeyond) {
  // 1-D x = 1..5, kernel 3, stride 2, pads [0,1], ceil_mode: windows start at 0, 2, 4; the last
  // covers x[4], one end pad and one position beyond the padding.
  AttributeMap attributes = {{"kernel_shape", Ints{3}},
                             {"strides", Ints{2}},
                             {"pads", Ints{0, 1}},
                             {"ceil_mode", int64_t{1}}};
  const auto exclude = MakeOp("AveragePool", {{1, 1, 5}}, {{1, 1, 3}}, attributes);
  EXPECT_THAT(Run(exclude, {{1, 2, 3, 4, 5}}), ElementsAre(2, 4, 5));
  attributes["count_include_pad"] = int64_t{1};
  const auto include = MakeOp("AveragePool", {{1, 1, 5}}, {{1, 1, 3}}, attributes);
  EXPECT_THAT(Run(include, {{1, 2, 3, 4, 5}}), ElementsAre(2, 4, 2.5f));
}

// ONNX backend test data (onnx/backend/test/data/node/
// test_averagepool_2d_ceil_last_window_starts_on_pad, Apache-2.0): the second window would start
// on the end padding and is dropped.
TEST_F(CpuRefWindowTest, AveragePoolMatchesOnnxLastWindowStartsOnPadCase) {
  const auto op = MakeOp("AveragePool", {{1, 3, 2, 2}}, {{1, 3, 1, 1}},
                         {{"ceil_mode", int64_t{1}},
                          {"count_include_pad", int64_t{1}},
                          {"kernel_shape", Ints{3, 3}},
                          {"pads", Ints{1, 1, 1, 1}},
                          {"strides", Ints{3, 3}}});
  const std::vector<float> x = {0.85799998f,  0.0785999969f, 0.269199997f, 0.153699994f,
                                0.881600022f, 0.435299993f,  0.577199996f, 0.662299991f,
                                0.906700015f, 0.948300004f,  0.597000003f, 0.763000011f};
  // The case's expected output is rounded to 4 decimals (by hand: 1.3595 / 9 = 0.151056), so
  // compare at ONNX's own tolerance.
  EXPECT_THAT(Run(op, {x}), FloatsNear({0.151099995f, 0.284099996f, 0.357199997f}, 1e-3f));
}

TEST_F(CpuRefWindowTest, AveragePoolWithDilationsAndSamePadding) {
  const auto dilated = MakeOp("AveragePool", {{1, 1, 4}}, {{1, 1, 2}},
                              {{"kernel_shape", Ints{2}}, {"dilations", Ints{2}}});
  EXPECT_THAT(Run(dilated, {{1, 2, 3, 4}}), ElementsAre(2, 3));
  const auto upper = MakeOp("AveragePool", {{1, 1, 4}}, {{1, 1, 4}},
                            {{"kernel_shape", Ints{2}}, {"auto_pad", std::string("SAME_UPPER")}});
  EXPECT_THAT(Run(upper, {{1, 2, 3, 4}}), ElementsAre(1.5f, 2.5f, 3.5f, 4));
  const auto lower = MakeOp("AveragePool", {{1, 1, 4}}, {{1, 1, 4}},
                            {{"kernel_shape", Ints{2}}, {"auto_pad", std::string("SAME_LOWER")}});
  EXPECT_THAT(Run(lower, {{1, 2, 3, 4}}), ElementsAre(1, 1.5f, 2.5f, 3.5f));
}

TEST_F(CpuRefWindowTest, GlobalPoolsReduceEverySpatialDim) {
  const std::vector<float> x = {1, 2, 3, 4, -1, -2, -3, -4};
  const auto average = MakeOp("GlobalAveragePool", {{1, 2, 2, 2}}, {{1, 2, 1, 1}});
  EXPECT_THAT(Run(average, {x}), ElementsAre(2.5f, -2.5f));
  const auto max = MakeOp("GlobalMaxPool", {{1, 2, 2, 2}}, {{1, 2, 1, 1}});
  EXPECT_THAT(Run(max, {x}), ElementsAre(4, -1));
  const auto one_d = MakeOp("GlobalMaxPool", {{2, 1, 4}}, {{2, 1, 1}});
  EXPECT_THAT(Run(one_d, {x}), ElementsAre(4, -1));
}

TEST_F(CpuRefWindowTest, PoolRefusesBadAttributes) {
  Status missing = backend().IsSupported(MakeOp("MaxPool", {{1, 1, 4, 4}}, {{1, 1, 2, 2}}));
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.message(), HasSubstr("'kernel_shape' is required"));
  Status length = backend().IsSupported(MakeOp("AveragePool", {{1, 1, 4, 4}}, {{1, 1, 2, 2}},
                                               {{"kernel_shape", Ints{2, 2}}, {"pads", Ints{1}}}));
  EXPECT_THAT(length.message(), HasSubstr("'pads' needs 4 values for 2 spatial dims, has 1"));
  Status both = backend().IsSupported(MakeOp("AveragePool", {{1, 1, 4, 4}}, {{1, 1, 4, 4}},
                                             {{"kernel_shape", Ints{2, 2}},
                                              {"pads", Ints{1, 1, 0, 0}},
                                              {"auto_pad", std::string("SAME_UPPER")}}));
  EXPECT_THAT(both.message(), HasSubstr("cannot be used with auto_pad=SAME_UPPER"));
}

TEST_F(CpuRefWindowTest, OneWorkloadRunsManyRequestsAtOnce) {
  const auto op = MakeOp("Conv", {{1, 1, 3, 3}, {1, 1, 2, 2}}, {{1, 1, 2, 2}});
  auto workload = backend().CreateWorkload(op);
  ASSERT_TRUE(workload.ok());
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        std::vector<float> x = kThreeByThree;
        for (float& v : x)
          v += static_cast<float>(t);
        float y[4] = {};
        const ConstTensorView inputs[2] = {{op.inputs[0], x.data()}, {op.inputs[1], kOnes4.data()}};
        const TensorView output{op.outputs[0], y};
        const float shift = 4.0f * static_cast<float>(t);
        if (!workload.value()->Execute(inputs, {&output, 1}).ok() || y[0] != 12 + shift ||
            y[3] != 28 + shift) {
          ++wrong;
        }
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace backplane::cpu_ref_test
