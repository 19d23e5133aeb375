// CpuRef's encoder operators against references written here from the ONNX definitions, on
// seeded random shapes (BACKPLANE_TEST_SEED replays a failure): Gather on any axis with negative
// INT64 and INT32 indices, Slice with negative, clamped and stepped indices, Expand, Where and
// Equal broadcasting, Cast between FP32, INT64, INT32 and BOOL, ReduceMean and ReduceSum over
// random axes with and without keepdims, LayerNormalization over a random axis, Pow, Sqrt, Erf,
// Neg, Not, integer Add and Div, Shape, Unsqueeze, Squeeze, Range, ConstantOfShape, Reshape to a
// computed shape. And the run-time errors that name the node: a Gather index out of range, a
// Reshape to a computed shape of the wrong size, an integer division by zero, an output allocated
// with a shape the input values do not give.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backplane/sdk/op_rules.hpp"
#include "cpu_ref_test_util.hpp"
#include "test_util.hpp"

namespace backplane::cpu_ref_test {
namespace encoder_kernel_test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A tensor of any type, its elements kept as bytes.
struct Typed {
  TensorInfo info;
  std::vector<std::byte> bytes;

  template <typename T>
  static Typed Of(Shape shape, DataType type, const std::vector<T>& values) {
    Typed t{{type, std::move(shape)}, std::vector<std::byte>(values.size() * sizeof(T))};
    if (!values.empty())
      std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
    return t;
  }
  template <typename T>
  std::vector<T> As() const {
    std::vector<T> values(bytes.size() / sizeof(T));
    if (!values.empty())
      std::memcpy(values.data(), bytes.data(), bytes.size());
    return values;
  }
  ConstTensorView View() const { return {info, bytes.data()}; }
};

Typed F32(Shape shape, const std::vector<float>& v) {
  return Typed::Of(std::move(shape), DataType::kFloat32, v);
}
Typed I64(Shape shape, const std::vector<int64_t>& v) {
  return Typed::Of(std::move(shape), DataType::kInt64, v);
}
Typed I32(Shape shape, const std::vector<int32_t>& v) {
  return Typed::Of(std::move(shape), DataType::kInt32, v);
}
Typed Bool(Shape shape, const std::vector<uint8_t>& v) {
  return Typed::Of(std::move(shape), DataType::kBool, v);
}

// The description of `op_type` with inputs and an output of these infos; `constant` inputs get
// their data as the runtime describes an initializer.
OperatorDesc Describe(std::string op_type, const std::vector<Typed>& inputs, TensorInfo output,
                      AttributeMap attributes = {}, std::vector<bool> constant = {}) {
  OperatorDesc op;
  op.name = op_type + "_node";
  op.op_type = std::move(op_type);
  op.attributes = std::move(attributes);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    op.inputs.push_back(inputs[i].info);
    op.constant_inputs.push_back(i < constant.size() && constant[i] ? inputs[i].bytes.data()
                                                                    : nullptr);
  }
  op.outputs.push_back(std::move(output));
  return op;
}

class CpuRefEncoderTest : public CpuRefTest {
 protected:
  // Runs `op` on `inputs` with its output allocated as `output`.
  static Result<Typed> Execute(const OperatorDesc& op, const std::vector<Typed>& inputs,
                               const TensorInfo& output) {
    Typed out{output, std::vector<std::byte>(output.ByteSize())};
    std::vector<ConstTensorView> views;
    for (const Typed& input : inputs)
      views.push_back(input.View());
    const std::vector<TensorView> outputs = {{out.info, out.bytes.data()}};
    Status status = TryRun(op, views, outputs);
    if (!status.ok())
      return status;
    return out;
  }
  // The same with the description made from the tensors: the usual case.
  static Typed Run(std::string op_type, const std::vector<Typed>& inputs, TensorInfo output,
                   AttributeMap attributes = {}) {
    auto result = Execute(Describe(std::move(op_type), inputs, output, std::move(attributes)),
                          inputs, output);
    EXPECT_TRUE(result.ok()) << result.error().ToString();
    return result.ok() ? std::move(result).value() : Typed{};
  }
};

// ---- helpers of the references -------------------------------------------------------------

std::vector<int64_t> Unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> at(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    at[d] = flat % shape[d];
    flat /= shape[d];
  }
  return at;
}
int64_t Ravel(const std::vector<int64_t>& at, const Shape& shape) {
  int64_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d)
    flat = flat * shape[d] + at[d];
  return flat;
}
// The coordinates of `at` (in `out`) in `in`, which broadcasts to `out` (numpy's rule).
std::vector<int64_t> BroadcastAt(const std::vector<int64_t>& at, const Shape& in,
                                 const Shape& out) {
  std::vector<int64_t> from(in.size());
  for (std::size_t d = 0; d < in.size(); ++d)
    from[d] = in[d] == 1 ? 0 : at[out.size() - in.size() + d];
  return from;
}

class Random {
 public:
  explicit Random(uint64_t seed) : engine_(seed) {}
  int64_t Int(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(engine_);
  }
  float Float(float lo = -3, float hi = 3) {
    return std::uniform_real_distribution<float>(lo, hi)(engine_);
  }
  Shape RandomShape(int64_t min_rank, int64_t max_rank, int64_t max_dim = 4) {
    Shape shape(static_cast<std::size_t>(Int(min_rank, max_rank)));
    for (auto& dim : shape)
      dim = Int(1, max_dim);
    return shape;
  }
  std::vector<float> Floats(const Shape& shape) {
    std::vector<float> values(static_cast<std::size_t>(ElementCount(shape)));
    for (auto& v : values)
      v = Float();
    return values;
  }
  // `shape` with some dims set to 1 or dropped from the front: a shape that broadcasts to it.
  Shape Broadcastable(const Shape& shape) {
    Shape out(shape.begin() + Int(0, static_cast<int64_t>(shape.size())), shape.end());
    for (auto& dim : out) {
      if (Int(0, 2) == 0)
        dim = 1;
    }
    return out;
  }

 private:
  std::mt19937_64 engine_;
};

#define BACKPLANE_SEEDED(seed)                                                        \
  const uint64_t seed = ::backplane::testing::TestSeed();                             \
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)"); \
  Random random(seed)

// ---- Gather ---------------------------------------------------------------------------------

TEST_F(CpuRefEncoderTest, GatherMatchesTheDefinitionOnRandomShapes) {
  BACKPLANE_SEEDED(seed);
  for (int trial = 0; trial < 60; ++trial) {
    const Shape data_shape = random.RandomShape(1, 4);
    const auto rank = static_cast<int64_t>(data_shape.size());
    const int64_t axis_given = random.Int(-rank, rank - 1);
    const int64_t axis = axis_given < 0 ? axis_given + rank : axis_given;
    const Shape indices_shape = random.RandomShape(0, 2, 3);
    std::vector<int64_t> indices(static_cast<std::size_t>(ElementCount(indices_shape)));
    for (auto& index : indices)
      index = random.Int(-data_shape[axis], data_shape[axis] - 1);
    const std::vector<float> data = random.Floats(data_shape);
    Shape out_shape(data_shape.begin(), data_shape.begin() + axis);
    out_shape.insert(out_shape.end(), indices_shape.begin(), indices_shape.end());
    out_shape.insert(out_shape.end(), data_shape.begin() + axis + 1, data_shape.end());
    // ONNX: out[i_0..i_{axis-1}, j..., k...] = data[i..., indices[j...], k...].
    std::vector<float> expected(static_cast<std::size_t>(ElementCount(out_shape)));
    for (std::size_t flat = 0; flat < expected.size(); ++flat) {
      const auto at = Unravel(static_cast<int64_t>(flat), out_shape);
      std::vector<int64_t> j(at.begin() + axis, at.begin() + axis + indices_shape.size());
      int64_t index = indices[indices_shape.empty() ? 0 : Ravel(j, indices_shape)];
      if (index < 0)
        index += data_shape[axis];
      std::vector<int64_t> from(at.begin(), at.begin() + axis);
      from.push_back(index);
      from.insert(from.end(), at.begin() + axis + indices_shape.size(), at.end());
      expected[flat] = data[Ravel(from, data_shape)];
    }
    const bool int32 = trial % 2 == 1;
    std::vector<int32_t> indices32(indices.begin(), indices.end());
    const Typed index_tensor = int32 ? I32(indices_shape, indices32) : I64(indices_shape, indices);
    const Typed out = Run("Gather", {F32(data_shape, data), index_tensor},
                          {DataType::kFloat32, out_shape}, {{"axis", axis_given}});
    EXPECT_EQ(out.As<float>(), expected)
        << "data " << ToString(data_shape) << " axis " << axis_given << " indices "
        << ToString(indices_shape) << (int32 ? " INT32" : " INT64");
  }
}

TEST_F(CpuRefEncoderTest, GatherOfInt64DataKeepsItsType) {
  const Typed out =
      Run("Gather", {I64({4}, {10, 20, 30, 40}), I64({2}, {-1, 0})}, {DataType::kInt64, {2}});
  EXPECT_EQ(out.As<int64_t>(), (std::vector<int64_t>{40, 10}));
}

TEST_F(CpuRefEncoderTest, AGatherIndexOutOfRangeAtRunTimeIsAnErrorNamingTheNode) {
  const Typed table = F32({3, 2}, {1, 2, 3, 4, 5, 6});
  for (int64_t bad : {int64_t{3}, int64_t{-4}, std::numeric_limits<int64_t>::max()}) {
    const Typed ids = I64({2}, {0, bad});
    auto result = Execute(Describe("Gather", {table, ids}, {DataType::kFloat32, {2, 2}}),
                          {table, ids}, {DataType::kFloat32, {2, 2}});
    ASSERT_FALSE(result.ok()) << bad;
    EXPECT_EQ(result.error().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(result.error().message(),
                AllOf(HasSubstr("Gather node 'Gather_node'"),
                      HasSubstr("index " + std::to_string(bad)), HasSubstr("out of range")));
  }
}

// ---- Slice ----------------------------------------------------------------------------------

// ONNX's Slice along one axis, written as the spec's loop: the indices taken, in order.
std::vector<int64_t> SliceIndices(int64_t start, int64_t end, int64_t step, int64_t dim) {
  auto adjust = [dim](int64_t v) { return v < 0 ? v + dim : v; };
  start = adjust(start);
  end = adjust(end);
  std::vector<int64_t> taken;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    for (int64_t i = start; i < end; i += step)
      taken.push_back(i);
  } else if (dim > 0) {
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
    for (int64_t i = start; i > end; i += step)
      taken.push_back(i);
  }
  return taken;
}

TEST_F(CpuRefEncoderTest, SliceMatchesTheDefinitionWithNegativeClampedAndSteppedIndices) {
  BACKPLANE_SEEDED(seed);
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  for (int trial = 0; trial < 60; ++trial) {
    const Shape shape = random.RandomShape(1, 4, 6);
    const auto rank = static_cast<int64_t>(shape.size());
    std::vector<int64_t> starts, ends, axes, steps;
    std::vector<std::vector<int64_t>> taken(shape.size());
    for (int64_t d = 0; d < rank; ++d) {
      std::vector<int64_t> all(static_cast<std::size_t>(shape[d]));
      std::iota(all.begin(), all.end(), 0);
      taken[d] = all;
    }
    for (int64_t d = 0; d < rank; ++d) {
      if (random.Int(0, 2) == 0)
        continue;
      auto pick = [&] {
        switch (random.Int(0, 3)) {
          case 0:
            return kHuge;
          case 1:
            return -kHuge - 1;
          default:
            return random.Int(-shape[d] - 2, shape[d] + 2);
        }
      };
      int64_t step = random.Int(1, 3) * (random.Int(0, 1) == 0 ? 1 : -1);
      starts.push_back(pick());
      ends.push_back(pick());
      axes.push_back(random.Int(0, 1) == 0 ? d : d - rank);
      steps.push_back(step);
      taken[d] = SliceIndices(starts.back(), ends.back(), step, shape[d]);
    }
    Shape out_shape;
    for (const auto& t : taken)
      out_shape.push_back(static_cast<int64_t>(t.size()));
    const std::vector<float> data = random.Floats(shape);
    std::vector<float> expected(static_cast<std::size_t>(ElementCount(out_shape)));
    for (std::size_t flat = 0; flat < expected.size(); ++flat) {
      auto at = Unravel(static_cast<int64_t>(flat), out_shape);
      for (std::size_t d = 0; d < at.size(); ++d)
        at[d] = taken[d][at[d]];
      expected[flat] = data[Ravel(at, shape)];
    }
    const auto n = static_cast<int64_t>(starts.size());
    const Typed out =
        Run("Slice",
            {F32(shape, data), I64({n}, starts), I64({n}, ends), I64({n}, axes), I64({n}, steps)},
            {DataType::kFloat32, out_shape});
    EXPECT_EQ(out.As<float>(), expected)
        << ToString(shape) << " starts " << ToString(starts) << " ends " << ToString(ends)
        << " axes " << ToString(axes) << " steps " << ToString(steps);
  }
}

TEST_F(CpuRefEncoderTest, SliceRefusesAnOutputTheValuesDoNotGive) {
  const std::vector<Typed> inputs = {F32({4}, {1, 2, 3, 4}), I64({1}, {1}), I64({1}, {3})};
  auto result = Execute(Describe("Slice", inputs, {DataType::kFloat32, {3}}), inputs,
                        {DataType::kFloat32, {3}});
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.error().message(),
              AllOf(HasSubstr("Slice node 'Slice_node'"), HasSubstr("the inputs give [2]")));
}

// ---- broadcasting: Expand, Where, Equal, Pow, integer arithmetic --------------------------------

TEST_F(CpuRefEncoderTest, ExpandWhereAndEqualBroadcastAsNumpy) {
  BACKPLANE_SEEDED(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const Shape out_shape = random.RandomShape(1, 4);
    const Shape a_shape = random.Broadcastable(out_shape);
    const Shape b_shape = random.Broadcastable(out_shape);
    const Shape c_shape = random.Broadcastable(out_shape);
    std::vector<int64_t> a(static_cast<std::size_t>(ElementCount(a_shape)));
    std::vector<int64_t> b(static_cast<std::size_t>(ElementCount(b_shape)));
    for (auto& v : a)
      v = random.Int(0, 2);
    for (auto& v : b)
      v = random.Int(0, 2);
    const std::vector<float> x = random.Floats(b_shape);
    const std::vector<float> y = random.Floats(c_shape);
    // The shapes may not reach out_shape's rank together: the broadcast of the three is it only
    // where some input has the dim; the references compute over the actual broadcast.
    auto broadcast = [](std::vector<Shape> shapes) {
      Shape out;
      for (const Shape& s : shapes) {
        auto b = op_rules::Broadcast(out, s);
        out = b.value();
      }
      return out;
    };
    const Shape eq_shape = broadcast({a_shape, b_shape});
    std::vector<uint8_t> equal(static_cast<std::size_t>(ElementCount(eq_shape)));
    for (std::size_t i = 0; i < equal.size(); ++i) {
      const auto at = Unravel(static_cast<int64_t>(i), eq_shape);
      equal[i] = a[Ravel(BroadcastAt(at, a_shape, eq_shape), a_shape)] ==
                 b[Ravel(BroadcastAt(at, b_shape, eq_shape), b_shape)];
    }
    EXPECT_EQ(
        Run("Equal", {I64(a_shape, a), I64(b_shape, b)}, {DataType::kBool, eq_shape}).As<uint8_t>(),
        equal);

    const Shape where_shape = broadcast({eq_shape, b_shape, c_shape});
    std::vector<float> chosen(static_cast<std::size_t>(ElementCount(where_shape)));
    for (std::size_t i = 0; i < chosen.size(); ++i) {
      const auto at = Unravel(static_cast<int64_t>(i), where_shape);
      chosen[i] = equal[Ravel(BroadcastAt(at, eq_shape, where_shape), eq_shape)]
                      ? x[Ravel(BroadcastAt(at, b_shape, where_shape), b_shape)]
                      : y[Ravel(BroadcastAt(at, c_shape, where_shape), c_shape)];
    }
    EXPECT_EQ(Run("Where", {Bool(eq_shape, equal), F32(b_shape, x), F32(c_shape, y)},
                  {DataType::kFloat32, where_shape})
                  .As<float>(),
              chosen);

    std::vector<float> expanded(static_cast<std::size_t>(ElementCount(out_shape)));
    for (std::size_t i = 0; i < expanded.size(); ++i) {
      const auto at = Unravel(static_cast<int64_t>(i), out_shape);
      expanded[i] = x[Ravel(BroadcastAt(at, b_shape, out_shape), b_shape)];
    }
    const auto rank = static_cast<int64_t>(out_shape.size());
    EXPECT_EQ(
        Run("Expand", {F32(b_shape, x), I64({rank}, out_shape)}, {DataType::kFloat32, out_shape})
            .As<float>(),
        expanded)
        << ToString(b_shape) << " to " << ToString(out_shape);
  }
}

TEST_F(CpuRefEncoderTest, IntegerArithmeticTruncatesAndRefusesADivisionByZero) {
  EXPECT_EQ(
      Run("Div", {I64({4}, {7, -7, 8, -9}), I64({}, {2})}, {DataType::kInt64, {4}}).As<int64_t>(),
      (std::vector<int64_t>{3, -3, 4, -4}));
  EXPECT_EQ(Run("Mul", {I32({2}, {3, -4}), I32({2, 1}, {2, 5})}, {DataType::kInt32, {2, 2}})
                .As<int32_t>(),
            (std::vector<int32_t>{6, -8, 15, -20}));
  EXPECT_EQ(Run("Sub", {I64({2}, {1, 2}), I64({2}, {5, 5})}, {DataType::kInt64, {2}}).As<int64_t>(),
            (std::vector<int64_t>{-4, -3}));
  const std::vector<Typed> inputs = {I64({2}, {1, 2}), I64({2}, {1, 0})};
  auto result =
      Execute(Describe("Div", inputs, {DataType::kInt64, {2}}), inputs, {DataType::kInt64, {2}});
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.error().message(),
              AllOf(HasSubstr("Div node 'Div_node'"), HasSubstr("division by zero")));
}

// ---- element-wise functions and Cast ----------------------------------------------------------

TEST_F(CpuRefEncoderTest, ElementwiseFunctionsMatchTheirDefinitions) {
  BACKPLANE_SEEDED(seed);
  const Shape shape = random.RandomShape(1, 3, 5);
  std::vector<float> x = random.Floats(shape);
  x[0] = 0.0f;
  std::vector<float> positive = x;
  for (auto& v : positive)
    v = std::fabs(v);
  const TensorInfo out{DataType::kFloat32, shape};
  auto map = [](const std::vector<float>& in, auto f) {
    std::vector<float> out;
    for (float v : in)
      out.push_back(static_cast<float>(f(static_cast<double>(v))));
    return out;
  };
  EXPECT_THAT(Run("Erf", {F32(shape, x)}, out).As<float>(),
              FloatsNear(map(x, [](double v) { return std::erf(v); })));
  EXPECT_THAT(Run("Sqrt", {F32(shape, positive)}, out).As<float>(),
              FloatsNear(map(positive, [](double v) { return std::sqrt(v); })));
  EXPECT_THAT(Run("Neg", {F32(shape, x)}, out).As<float>(),
              FloatsNear(map(x, [](double v) { return -v; })));
  EXPECT_THAT(Run("Tanh", {F32(shape, x)}, out).As<float>(),
              FloatsNear(map(x, [](double v) { return std::tanh(v); })));
  EXPECT_THAT(Run("Pow", {F32(shape, positive), F32({}, {1.5f})}, out).As<float>(),
              FloatsNear(map(positive, [](double v) { return std::pow(v, 1.5); })));
  EXPECT_TRUE(
      std::isnan(Run("Sqrt", {F32({1}, {-1.0f})}, {DataType::kFloat32, {1}}).As<float>().at(0)));
  EXPECT_EQ(Run("Neg", {I64({3}, {1, -2, 0})}, {DataType::kInt64, {3}}).As<int64_t>(),
            (std::vector<int64_t>{-1, 2, 0}));
  EXPECT_EQ(Run("Not", {Bool({3}, {1, 0, 1})}, {DataType::kBool, {3}}).As<uint8_t>(),
            (std::vector<uint8_t>{0, 1, 0}));
}

TEST_F(CpuRefEncoderTest, CastConvertsAsOnnxDoes) {
  const Typed floats = F32({6}, {1.9f, -1.9f, 0.0f, -0.0f, 0x1p34f, NAN});
  auto cast = [&](const Typed& in, DataType to) {
    return Run("Cast", {in}, {to, in.info.shape}, {{"to", static_cast<int64_t>(to)}});
  };
  // Toward zero; out of range saturates and NaN is 0 (ONNX leaves both undefined).
  EXPECT_EQ(cast(floats, DataType::kInt64).As<int64_t>(),
            (std::vector<int64_t>{1, -1, 0, 0, int64_t{1} << 34, 0}));
  EXPECT_EQ(cast(floats, DataType::kInt32).As<int32_t>(),
            (std::vector<int32_t>{1, -1, 0, 0, std::numeric_limits<int32_t>::max(), 0}));
  EXPECT_EQ(cast(floats, DataType::kBool).As<uint8_t>(), (std::vector<uint8_t>{1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(cast(Bool({3}, {1, 0, 1}), DataType::kFloat32).As<float>(),
            (std::vector<float>{1, 0, 1}));
  EXPECT_EQ(cast(I64({2}, {-5, 1LL << 40}), DataType::kFloat32).As<float>(),
            (std::vector<float>{-5.0f, 1099511627776.0f}));
  EXPECT_EQ(cast(I64({2}, {0, 7}), DataType::kBool).As<uint8_t>(), (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(cast(I32({2}, {-3, 4}), DataType::kInt64).As<int64_t>(), (std::vector<int64_t>{-3, 4}));
}

// ---- reductions and LayerNormalization --------------------------------------------------------

TEST_F(CpuRefEncoderTest, ReductionsMatchTheDefinitionOverRandomAxes) {
  BACKPLANE_SEEDED(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const Shape shape = random.RandomShape(1, 4);
    const auto rank = static_cast<int64_t>(shape.size());
    std::vector<int64_t> axes;
    std::vector<bool> reduced(shape.size(), false);
    for (int64_t d = 0; d < rank; ++d) {
      if (random.Int(0, 1) == 0) {
        axes.push_back(random.Int(0, 1) == 0 ? d : d - rank);
        reduced[d] = true;
      }
    }
    if (axes.empty())
      reduced.assign(shape.size(), true);  // no axes: every axis
    const bool keepdims = random.Int(0, 1) == 1;
    const bool mean = trial % 2 == 0;
    Shape kept = shape;
    Shape out_shape;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (reduced[d])
        kept[d] = 1;
      if (!reduced[d] || keepdims)
        out_shape.push_back(kept[d]);
    }
    const std::vector<float> x = random.Floats(shape);
    std::vector<double> sums(static_cast<std::size_t>(ElementCount(kept)), 0.0);
    std::vector<int64_t> counts(sums.size(), 0);
    for (std::size_t flat = 0; flat < x.size(); ++flat) {
      auto at = Unravel(static_cast<int64_t>(flat), shape);
      for (std::size_t d = 0; d < at.size(); ++d) {
        if (reduced[d])
          at[d] = 0;
      }
      sums[Ravel(at, kept)] += x[flat];
      ++counts[Ravel(at, kept)];
    }
    std::vector<float> expected;
    for (std::size_t i = 0; i < sums.size(); ++i)
      expected.push_back(static_cast<float>(mean ? sums[i] / counts[i] : sums[i]));
    AttributeMap attributes = {{"keepdims", int64_t{keepdims}}};
    const TensorInfo out{DataType::kFloat32, out_shape};
    Typed result;
    if (mean) {
      if (!axes.empty())
        attributes.emplace("axes", axes);
      result = Run("ReduceMean", {F32(shape, x)}, out, attributes);
    } else if (axes.empty()) {
      result = Run("ReduceSum", {F32(shape, x)}, out, attributes);
    } else {
      // ReduceSum-13: the axes are an input, here one the runtime computes.
      result = Run("ReduceSum", {F32(shape, x), I64({static_cast<int64_t>(axes.size())}, axes)},
                   out, attributes);
    }
    EXPECT_THAT(result.As<float>(), FloatsNear(expected))
        << (mean ? "ReduceMean " : "ReduceSum ") << ToString(shape) << " axes " << ToString(axes)
        << " keepdims " << keepdims;
  }
}

TEST_F(CpuRefEncoderTest, LayerNormalizationMatchesTheDefinitionOverARandomAxis) {
  BACKPLANE_SEEDED(seed);
  for (int trial = 0; trial < 30; ++trial) {
    const Shape shape = random.RandomShape(1, 4, 5);
    const auto rank = static_cast<int64_t>(shape.size());
    const int64_t axis_given = random.Int(-rank, rank - 1);
    const int64_t axis = axis_given < 0 ? axis_given + rank : axis_given;
    const Shape normalized(shape.begin() + axis, shape.end());
    const Shape scale_shape = random.Broadcastable(normalized);
    const Shape bias_shape = random.Broadcastable(normalized);
    const std::vector<float> x = random.Floats(shape);
    const std::vector<float> scale = random.Floats(scale_shape);
    const std::vector<float> bias = random.Floats(bias_shape);
    const float epsilon = trial % 2 == 0 ? 1e-5f : 1e-12f;
    const int64_t size = ElementCount(normalized);
    std::vector<float> expected(x.size());
    for (int64_t row = 0; row < ElementCount(shape) / size; ++row) {
      double mean = 0;
      for (int64_t i = 0; i < size; ++i)
        mean += x[row * size + i];
      mean /= size;
      double variance = 0;
      for (int64_t i = 0; i < size; ++i)
        variance += std::pow(x[row * size + i] - mean, 2);
      variance /= size;
      for (int64_t i = 0; i < size; ++i) {
        const auto at = Unravel(i, normalized);
        expected[row * size + i] = static_cast<float>(
            (x[row * size + i] - mean) / std::sqrt(variance + epsilon) *
                scale[Ravel(BroadcastAt(at, scale_shape, normalized), scale_shape)] +
            bias[Ravel(BroadcastAt(at, bias_shape, normalized), bias_shape)]);
      }
    }
    const Typed out =
        Run("LayerNormalization", {F32(shape, x), F32(scale_shape, scale), F32(bias_shape, bias)},
            {DataType::kFloat32, shape}, {{"axis", axis_given}, {"epsilon", epsilon}});
    EXPECT_THAT(out.As<float>(), FloatsNear(expected, 1e-4f))
        << ToString(shape) << " axis " << axis_given << " scale " << ToString(scale_shape);
  }
}

TEST_F(CpuRefEncoderTest, LayerNormalizationRefusesItsTrainingOutputsAndStashTypes) {
  const std::vector<Typed> inputs = {F32({2, 2}, {1, 2, 3, 4}), F32({2}, {1, 1})};
  OperatorDesc op = Describe("LayerNormalization", inputs, {DataType::kFloat32, {2, 2}},
                             {{"stash_type", int64_t{0}}});
  Status status = backend().IsSupported(op);
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("stash_type 0"));
  op = Describe("LayerNormalization", inputs, {DataType::kFloat32, {2, 2}});
  op.outputs.push_back({DataType::kFloat32, {2, 1}});
  EXPECT_EQ(backend().IsSupported(op).code(), StatusCode::kInvalidArgument);
}

// ---- shapes as values: Shape, Unsqueeze, Squeeze, Range, ConstantOfShape, Reshape --------------

TEST_F(CpuRefEncoderTest, ShapeOperatorsComputeTheirValues) {
  const Typed x = F32({2, 3, 4}, std::vector<float>(24, 1.0f));
  EXPECT_EQ(Run("Shape", {x}, {DataType::kInt64, {3}}).As<int64_t>(),
            (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(
      Run("Shape", {x}, {DataType::kInt64, {1}}, {{"start", int64_t{-2}}, {"end", int64_t{-1}}})
          .As<int64_t>(),
      (std::vector<int64_t>{3}));
  const Typed mask = I64({2, 3}, {1, 1, 0, 1, 0, 0});
  EXPECT_EQ(
      Run("Unsqueeze", {mask, I64({2}, {1, -2})}, {DataType::kInt64, {2, 1, 1, 3}}).As<int64_t>(),
      mask.As<int64_t>());
  EXPECT_EQ(Run("Squeeze", {I64({1, 2, 1}, {5, 6}), I64({1}, {-1})}, {DataType::kInt64, {1, 2}})
                .As<int64_t>(),
            (std::vector<int64_t>{5, 6}));
  // From near the minimum in steps of 2^62: i * delta alone leaves int64.
  constexpr int64_t kLow = std::numeric_limits<int64_t>::min() + 1;
  EXPECT_EQ(Run("Range", {I64({}, {kLow}), I64({}, {-kLow}), I64({}, {int64_t{1} << 62})},
                {DataType::kInt64, {4}})
                .As<int64_t>(),
            (std::vector<int64_t>{kLow, -4611686018427387903, 1, 4611686018427387905}));
  EXPECT_EQ(Run("Range", {I64({}, {10}), I64({}, {1}), I64({}, {-3})}, {DataType::kInt64, {3}})
                .As<int64_t>(),
            (std::vector<int64_t>{10, 7, 4}));
  EXPECT_THAT(
      Run("Range", {F32({}, {0.5f}), F32({}, {2.0f}), F32({}, {0.5f})}, {DataType::kFloat32, {3}})
          .As<float>(),
      FloatsNear({0.5f, 1.0f, 1.5f}));
  EXPECT_EQ(Run("ConstantOfShape", {I64({2}, {2, 2})}, {DataType::kInt64, {2, 2}},
                {{"value", int64_t{1}}, {"dtype", int64_t{7}}})
                .As<int64_t>(),
            (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(Run("ConstantOfShape", {I64({1}, {2})}, {DataType::kFloat32, {2}}).As<float>(),
            (std::vector<float>{0, 0}));
  const Typed ids = I64({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(Run("Reshape", {ids, I64({2}, {3, -1})}, {DataType::kInt64, {3, 2}}).As<int64_t>(),
            ids.As<int64_t>());
  EXPECT_EQ(Run("Transpose", {ids}, {DataType::kInt64, {3, 2}}).As<int64_t>(),
            (std::vector<int64_t>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(Run("Concat", {I64({1}, {7}), I64({2}, {8, 9})}, {DataType::kInt64, {3}},
                {{"axis", int64_t{0}}})
                .As<int64_t>(),
            (std::vector<int64_t>{7, 8, 9}));
}

TEST_F(CpuRefEncoderTest, AReshapeToAComputedShapeOfTheWrongSizeIsAnErrorNamingTheNode) {
  const std::vector<Typed> inputs = {F32({2, 3}, {1, 2, 3, 4, 5, 6}), I64({2}, {4, 2})};
  auto result = Execute(Describe("Reshape", inputs, {DataType::kFloat32, {4, 2}}), inputs,
                        {DataType::kFloat32, {4, 2}});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(result.error().message(),
              AllOf(HasSubstr("Reshape node 'Reshape_node'"), HasSubstr("has 8 elements")));
}

TEST_F(CpuRefEncoderTest, IsSupportedRefusesTypesAnOperatorDoesNotTake) {
  struct Case {
    OperatorDesc op;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {Describe("Gather", {F32({3}, {1, 2, 3}), F32({1}, {0})}, {DataType::kFloat32, {1}}),
       "input 1 is FP32"},
      {Describe("Not", {F32({1}, {0})}, {DataType::kFloat32, {1}}), "input 0 is FP32"},
      {Describe("Erf", {I64({1}, {0})}, {DataType::kInt64, {1}}), "FP32 only"},
      {Describe("Cast", {F32({1}, {0})}, {DataType::kUint8, {1}}, {{"to", int64_t{2}}}),
       "'to' = 2"},
      {Describe("Where", {I64({1}, {0}), F32({1}, {0}), F32({1}, {0})}, {DataType::kFloat32, {1}}),
       "input 0 is INT64"},
  };
  for (const Case& c : cases) {
    Status status = backend().IsSupported(c.op);
    EXPECT_EQ(status.code(), StatusCode::kUnimplemented) << c.op.op_type;
    EXPECT_THAT(status.message(), AllOf(HasSubstr(c.op.op_type + " node"), HasSubstr(c.reason)));
  }
}

}  // namespace
}  // namespace encoder_kernel_test
}  // namespace backplane::cpu_ref_test
