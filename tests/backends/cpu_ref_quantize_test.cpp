// CpuRef's QuantizeLinear and DequantizeLinear against a reference written here from ONNX's
// definition (y = saturate(rint(x / scale) + zero_point), y = (x - zero_point) * scale): seeded
// random shapes, per tensor and per every axis (negative too), UINT8 and INT8, zero points at the
// ends of their range, values that land on .5, values that saturate, empty tensors; the ties of
// round half to even one by one; a round trip within half a step; what IsSupported refuses.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_ref_test_util.hpp"
#include "test_util.hpp"

namespace backplane::cpu_ref_test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// One quantization layout: x's shape, and the scale per tensor (no axis) or per `axis`.
struct Layout {
  Shape shape;
  std::optional<int64_t> axis;  // as given to the node, possibly negative
  int64_t channels() const {
    if (!axis)
      return 1;
    return shape[*axis < 0 ? *axis + static_cast<int64_t>(shape.size()) : *axis];
  }
  Shape scale_shape() const { return axis ? Shape{channels()} : Shape{}; }
};

// The scale index of flat element `index`: its coordinate along the axis, found by unravelling
// the index (not by the kernel's inner/modulo arithmetic).
int64_t ChannelOf(const Layout& layout, int64_t index) {
  if (!layout.axis)
    return 0;
  const auto rank = static_cast<int64_t>(layout.shape.size());
  const int64_t axis = *layout.axis < 0 ? *layout.axis + rank : *layout.axis;
  std::vector<int64_t> coordinates(layout.shape.size());
  for (int64_t d = rank - 1; d >= 0; --d) {
    coordinates[d] = index % layout.shape[d];
    index /= layout.shape[d];
  }
  return coordinates[axis];
}

// ONNX's QuantizeLinear for one element: numpy's rint (ties to even, the FPU's default mode) of
// the FP32 quotient, then the zero point, then clipped to the type's range.
template <typename Q>
Q ReferenceQuantize(float x, float scale, Q zero_point) {
  EXPECT_EQ(std::fegetround(), FE_TONEAREST);
  const double rounded = std::nearbyint(static_cast<double>(x / scale)) + zero_point;
  const double low = std::numeric_limits<Q>::min();
  const double high = std::numeric_limits<Q>::max();
  return static_cast<Q>(std::fmin(std::fmax(rounded, low), high));
}

AttributeMap AxisAttribute(const Layout& layout) {
  AttributeMap attributes;
  if (layout.axis)
    attributes.emplace("axis", *layout.axis);
  return attributes;
}

// A QuantizeLinear or DequantizeLinear description with x of `x_type` and y of `y_type`.
OperatorDesc QuantizationOp(const std::string& op_type, const Layout& layout, DataType x_type,
                            DataType y_type, std::optional<DataType> zero_point_type) {
  OperatorDesc op;
  op.name = op_type == "QuantizeLinear" ? "quant" : "dequant";
  op.op_type = op_type;
  op.attributes = AxisAttribute(layout);
  op.inputs = {{x_type, layout.shape}, {DataType::kFloat32, layout.scale_shape()}};
  if (zero_point_type)
    op.inputs.push_back({*zero_point_type, layout.scale_shape()});
  op.constant_inputs.assign(op.inputs.size(), nullptr);
  op.outputs = {{y_type, layout.shape}};
  return op;
}

class CpuRefQuantizeTest : public CpuRefTest {
 public:
  // QuantizeLinear on CpuRef: y of type Q.
  template <typename Q>
  static std::vector<Q> Quantize(const Layout& layout, const std::vector<float>& x,
                                 const std::vector<float>& scales,
                                 const std::optional<std::vector<Q>>& zero_points) {
    const DataType type = std::is_signed_v<Q> ? DataType::kInt8 : DataType::kUint8;
    const OperatorDesc op = QuantizationOp("QuantizeLinear", layout, DataType::kFloat32, type,
                                           zero_points ? std::optional(type) : std::nullopt);
    std::vector<ConstTensorView> inputs = {{op.inputs[0], x.data()}, {op.inputs[1], scales.data()}};
    if (zero_points)
      inputs.push_back({op.inputs[2], zero_points->data()});
    std::vector<Q> y(x.size(), 99);
    const std::vector<TensorView> outputs = {{op.outputs[0], y.data()}};
    EXPECT_TRUE(backend().IsSupported(op).ok()) << backend().IsSupported(op).ToString();
    const Status status = TryRun(op, inputs, outputs);
    EXPECT_TRUE(status.ok()) << status.ToString();
    return y;
  }

  template <typename Q>
  static std::vector<float> Dequantize(const Layout& layout, const std::vector<Q>& x,
                                       const std::vector<float>& scales,
                                       const std::optional<std::vector<Q>>& zero_points) {
    const DataType type = std::is_signed_v<Q> ? DataType::kInt8 : DataType::kUint8;
    const OperatorDesc op = QuantizationOp("DequantizeLinear", layout, type, DataType::kFloat32,
                                           zero_points ? std::optional(type) : std::nullopt);
    std::vector<ConstTensorView> inputs = {{op.inputs[0], x.data()}, {op.inputs[1], scales.data()}};
    if (zero_points)
      inputs.push_back({op.inputs[2], zero_points->data()});
    std::vector<float> y(x.size(), -99.0f);
    const std::vector<TensorView> outputs = {{op.outputs[0], y.data()}};
    EXPECT_TRUE(backend().IsSupported(op).ok()) << backend().IsSupported(op).ToString();
    const Status status = TryRun(op, inputs, outputs);
    EXPECT_TRUE(status.ok()) << status.ToString();
    return y;
  }
};

// Random layouts, scales, zero points and inputs, drawn from one seed.
class RandomQuantization {
 public:
  explicit RandomQuantization(uint64_t seed) : random_(seed) {}

  int64_t Uniform(int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(random_);
  }
  bool Coin() { return Uniform(0, 1) == 1; }

  // Rank 0 to 4, dimensions 1 to 4, and now and then an empty one; per tensor or per a random
  // axis, given positive or negative.
  Layout NextLayout() {
    Layout layout;
    const int64_t rank = Uniform(0, 4);
    for (int64_t d = 0; d < rank; ++d)
      layout.shape.push_back(Uniform(0, 9) == 0 ? 0 : Uniform(1, 4));
    if (rank > 0 && Coin()) {
      const int64_t axis = Uniform(0, rank - 1);
      layout.axis = Coin() ? axis : axis - rank;
    }
    return layout;
  }

  // Half the time a power of two, so that x / scale is exact and the .5 ties below are ties.
  float NextScale() {
    if (Coin())
      return std::ldexp(1.0f, static_cast<int>(Uniform(-4, 3)));
    return std::uniform_real_distribution<float>(0.001f, 4.0f)(random_);
  }

  // Often the ends of the range.
  template <typename Q>
  Q NextZeroPoint() {
    const int64_t low = std::numeric_limits<Q>::min();
    const int64_t high = std::numeric_limits<Q>::max();
    switch (Uniform(0, 3)) {
      case 0:
        return static_cast<Q>(low);
      case 1:
        return static_cast<Q>(high);
      default:
        return static_cast<Q>(Uniform(low, high));
    }
  }

  // A multiple of half the scale (ties and exact integers), or anything, over a span wide
  // enough to saturate at both ends.
  float NextInput(float scale) {
    if (Coin())
      return static_cast<float>(Uniform(-700, 700)) * 0.5f * scale;
    return std::uniform_real_distribution<float>(-400.0f, 400.0f)(random_) * scale;
  }

 private:
  std::mt19937_64 random_;
};

template <typename Q>
void CheckRandomQuantize(uint64_t seed) {
  RandomQuantization random(seed);
  for (int trial = 0; trial < 300; ++trial) {
    const Layout layout = random.NextLayout();
    SCOPED_TRACE("trial " + std::to_string(trial) + ": x " + ToString(layout.shape) +
                 (layout.axis ? ", axis " + std::to_string(*layout.axis) : ", per tensor"));
    std::vector<float> scales(static_cast<std::size_t>(layout.channels()));
    std::vector<Q> zero_points(scales.size());
    for (std::size_t c = 0; c < scales.size(); ++c) {
      scales[c] = random.NextScale();
      zero_points[c] = random.NextZeroPoint<Q>();
    }
    const bool with_zero_point = random.Coin();
    std::vector<float> x(static_cast<std::size_t>(ElementCount(layout.shape)));
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = random.NextInput(scales[ChannelOf(layout, static_cast<int64_t>(i))]);

    const auto y = CpuRefQuantizeTest::Quantize<Q>(
        layout, x, scales, with_zero_point ? std::optional(zero_points) : std::nullopt);
    ASSERT_EQ(y.size(), x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const int64_t c = ChannelOf(layout, static_cast<int64_t>(i));
      const Q zero_point = with_zero_point ? zero_points[c] : Q{0};
      ASSERT_EQ(static_cast<int>(y[i]),
                static_cast<int>(ReferenceQuantize<Q>(x[i], scales[c], zero_point)))
          << "element " << i << ": x " << x[i] << ", scale " << scales[c] << ", zero point "
          << static_cast<int>(zero_point);
    }

    // Back again: (y - zero_point) * scale, and within half a step of x where x is in range.
    const auto back = CpuRefQuantizeTest::Dequantize<Q>(
        layout, y, scales, with_zero_point ? std::optional(zero_points) : std::nullopt);
    ASSERT_EQ(back.size(), x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const int64_t c = ChannelOf(layout, static_cast<int64_t>(i));
      const double zero_point = with_zero_point ? zero_points[c] : 0;
      const float expected =
          (static_cast<float>(y[i]) - static_cast<float>(zero_point)) * scales[c];
      ASSERT_EQ(back[i], expected) << "element " << i;
      const double low = (std::numeric_limits<Q>::min() - zero_point) * scales[c];
      const double high = (std::numeric_limits<Q>::max() - zero_point) * scales[c];
      if (x[i] >= low && x[i] <= high) {
        // Half a step, and the FP32 rounding of x / scale and of the product.
        ASSERT_LE(std::fabs(back[i] - x[i]), scales[c] / 2 + std::fabs(x[i]) * 1e-6)
            << "element " << i << ": x " << x[i] << " came back as " << back[i];
      }
    }
  }
}

TEST_F(CpuRefQuantizeTest, RandomUint8MatchesOnnxDefinition) {
  const uint64_t seed = ::backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  CheckRandomQuantize<uint8_t>(seed);
}

TEST_F(CpuRefQuantizeTest, RandomInt8MatchesOnnxDefinition) {
  const uint64_t seed = ::backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  CheckRandomQuantize<int8_t>(seed);
}

TEST_F(CpuRefQuantizeTest, TiesRoundHalfToEven) {
  const Layout layout{{10}, std::nullopt};
  const std::vector<float> x = {0.5f,  1.5f, 2.5f,        -0.5f, -1.5f,
                                -2.5f, 3.5f, 0.49999997f, 1.0f,  -3.5f};
  EXPECT_EQ(Quantize<int8_t>(layout, x, {1.0f}, std::vector<int8_t>{0}),
            (std::vector<int8_t>{0, 2, 2, 0, -2, -2, 4, 0, 1, -4}));
  // With a scale: 1.25 / 0.5 = 2.5 → 2; 0.75 / 0.5 = 1.5 → 2; plus the zero point 10.
  EXPECT_EQ(
      Quantize<uint8_t>({{2}, std::nullopt}, {1.25f, 0.75f}, {0.5f}, std::vector<uint8_t>{10}),
      (std::vector<uint8_t>{12, 12}));
}

TEST_F(CpuRefQuantizeTest, SaturatesAtTheEndsOfTheRange) {
  const Layout layout{{4}, std::nullopt};
  const std::vector<float> x = {-1000.0f, -1.0f, 1.0f, 1000.0f};
  EXPECT_EQ(Quantize<uint8_t>(layout, x, {1.0f}, std::vector<uint8_t>{0}),
            (std::vector<uint8_t>{0, 0, 1, 255}));
  EXPECT_EQ(Quantize<uint8_t>(layout, x, {1.0f}, std::vector<uint8_t>{255}),
            (std::vector<uint8_t>{0, 254, 255, 255}));
  EXPECT_EQ(Quantize<int8_t>(layout, x, {1.0f}, std::vector<int8_t>{-128}),
            (std::vector<int8_t>{-128, -128, -127, 127}));
  EXPECT_EQ(Quantize<int8_t>(layout, x, {1.0f}, std::vector<int8_t>{127}),
            (std::vector<int8_t>{-128, 126, 127, 127}));
  // No zero point: UINT8 0.
  EXPECT_EQ(Quantize<uint8_t>(layout, x, {1.0f}, std::nullopt),
            (std::vector<uint8_t>{0, 0, 1, 255}));
  const float infinity = std::numeric_limits<float>::infinity();
  EXPECT_EQ(
      Quantize<int8_t>({{2}, std::nullopt}, {-infinity, infinity}, {1.0f}, std::vector<int8_t>{0}),
      (std::vector<int8_t>{-128, 127}));
}

TEST_F(CpuRefQuantizeTest, PerAxisUsesTheScaleOfEachIndexAlongTheAxis) {
  // x[2,3], axis 1: columns scaled by 1, 2, 4 with zero points -1, 0, 1.
  const Layout layout{{2, 3}, 1};
  const std::vector<float> x = {4, 4, 4, -8, -8, -8};
  EXPECT_EQ(Quantize<int8_t>(layout, x, {1, 2, 4}, std::vector<int8_t>{-1, 0, 1}),
            (std::vector<int8_t>{3, 2, 2, -9, -4, -1}));
  // axis -2 is axis 0: rows scaled by 1 and 2.
  EXPECT_EQ(
      Dequantize<uint8_t>({{2, 3}, -2}, {1, 2, 3, 1, 2, 3}, {1, 2}, std::vector<uint8_t>{0, 2}),
      (std::vector<float>{1, 2, 3, -2, 0, 2}));
}

TEST_F(CpuRefQuantizeTest, DequantizesInt32WithoutZeroPoint) {
  // INT32 is how quantized biases arrive (ONNX Runtime's QDQ models).
  const Layout layout{{3}, std::nullopt};
  const OperatorDesc op =
      QuantizationOp("DequantizeLinear", layout, DataType::kInt32, DataType::kFloat32, {});
  const std::vector<int32_t> x = {-100000, 0, 3};
  const std::vector<float> scale = {0.25f};
  std::vector<float> y(3);
  const Status status = TryRun(op, {{op.inputs[0], x.data()}, {op.inputs[1], scale.data()}},
                               {{op.outputs[0], y.data()}});
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(y, (std::vector<float>{-25000, 0, 0.75f}));
}

TEST_F(CpuRefQuantizeTest, EmptyTensorsRun) {
  EXPECT_TRUE(Quantize<uint8_t>({{0, 3}, 1}, {}, {1, 2, 3}, std::vector<uint8_t>{0, 0, 0}).empty());
  EXPECT_TRUE(Dequantize<int8_t>({{2, 0}, 1}, {}, {}, std::vector<int8_t>{}).empty());
}

TEST_F(CpuRefQuantizeTest, IsSupportedRefusesWhatItCannotRun) {
  const Layout layout{{2, 3}, 1};
  // A zero point of another type than the output.
  const OperatorDesc mixed = QuantizationOp("QuantizeLinear", layout, DataType::kFloat32,
                                            DataType::kUint8, DataType::kInt8);
  EXPECT_EQ(backend().IsSupported(mixed).code(), StatusCode::kUnimplemented);
  EXPECT_THAT(backend().IsSupported(mixed).message(),
              AllOf(HasSubstr("'quant'"), HasSubstr("with a zero point of INT8")));
  // Dequantizing a float.
  const OperatorDesc from_float = QuantizationOp("DequantizeLinear", layout, DataType::kFloat32,
                                                 DataType::kFloat32, std::nullopt);
  EXPECT_EQ(backend().IsSupported(from_float).code(), StatusCode::kUnimplemented);
  // Per-axis length against the axis.
  OperatorDesc wrong_length = QuantizationOp("QuantizeLinear", layout, DataType::kFloat32,
                                             DataType::kUint8, DataType::kUint8);
  wrong_length.inputs[1].shape = {2};
  wrong_length.inputs[2].shape = {2};
  EXPECT_EQ(backend().IsSupported(wrong_length).code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(backend().IsSupported(wrong_length).message(),
              HasSubstr("does not match dimension 1"));
  // Blocked quantization and unknown attributes are never ignored.
  OperatorDesc blocked =
      QuantizationOp("QuantizeLinear", layout, DataType::kFloat32, DataType::kUint8, std::nullopt);
  blocked.attributes.emplace("block_size", int64_t{2});
  EXPECT_EQ(backend().IsSupported(blocked).code(), StatusCode::kUnimplemented);
  OperatorDesc unknown =
      QuantizationOp("QuantizeLinear", layout, DataType::kFloat32, DataType::kUint8, std::nullopt);
  unknown.attributes.emplace("precision", int64_t{2});
  EXPECT_THAT(backend().IsSupported(unknown).message(),
              HasSubstr("unsupported attribute 'precision'"));
}

TEST_F(CpuRefQuantizeTest, ExecuteRefusesAPerAxisScaleOfAnotherLength) {
  // Shapes are checked again on the request's views: a dynamic axis resolved to another length.
  const OperatorDesc op = QuantizationOp("QuantizeLinear", {{2, -1}, 1}, DataType::kFloat32,
                                         DataType::kUint8, std::nullopt);
  const std::vector<float> x(8, 1.0f);
  const std::vector<float> scale = {1, 1, 1};
  std::vector<uint8_t> y(8, 7);
  const Status status = TryRun(
      op, {{{DataType::kFloat32, {2, 4}}, x.data()}, {{DataType::kFloat32, {3}}, scale.data()}},
      {{{DataType::kUint8, {2, 4}}, y.data()}});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("does not match dimension 1"));
  EXPECT_EQ(y, std::vector<uint8_t>(8, 7));  // nothing written
}

}  // namespace
}  // namespace backplane::cpu_ref_test
