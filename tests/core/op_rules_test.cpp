// The SDK's ONNX operator rules (backplane/sdk/op_rules.hpp): window geometry against a
// brute-force count of window positions, the cases where the three copies it replaced disagreed
// (each settled by the ONNX spec), and broadcasting as ONNX's Broadcasting.md gives it.
#include "backplane/sdk/op_rules.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <random>
#include <string>

namespace backplane::op_rules {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Ints = std::vector<int64_t>;

WindowAttributes Read(const AttributeMap& attributes, std::size_t rank,
                      WindowOp op = WindowOp::kPool) {
  auto window = ReadWindowAttributes(attributes, rank, op);
  EXPECT_TRUE(window.ok()) << window.error().ToString();
  return window.ok() ? window.value() : WindowAttributes{};
}

Status ReadError(const AttributeMap& attributes, std::size_t rank, WindowOp op = WindowOp::kPool) {
  auto window = ReadWindowAttributes(attributes, rank, op);
  return window.ok() ? Status::Ok() : window.error();
}

// One spatial dim resolved; the test fails on an error.
WindowDim Resolve1(const AttributeMap& attributes, int64_t in) {
  const WindowAttributes window = Read(attributes, 1);
  auto dims = ResolveWindow(window, Ints{in}, window.kernel_shape);
  EXPECT_TRUE(dims.ok()) << dims.error().ToString();
  return dims.ok() ? dims.value()[0] : WindowDim{};
}

// ---- window attributes -----------------------------------------------------------------------

TEST(OpRulesTest, WindowDefaultsAreOnesAndZeros) {
  const WindowAttributes window = Read({{"kernel_shape", Ints{3, 2}}}, 2);
  EXPECT_EQ(window.auto_pad, AutoPad::kNotSet);
  EXPECT_THAT(window.kernel_shape, ElementsAre(3, 2));
  EXPECT_THAT(window.strides, ElementsAre(1, 1));
  EXPECT_THAT(window.dilations, ElementsAre(1, 1));
  EXPECT_THAT(window.pads, ElementsAre(0, 0, 0, 0));
  EXPECT_FALSE(window.ceil_mode);
  // Conv may leave kernel_shape out (W's dims are the kernel); a pool may not.
  EXPECT_TRUE(Read({}, 2, WindowOp::kConv).kernel_shape.empty());
  Status missing = ReadError({}, 2);
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.message(), "attribute 'kernel_shape' is required");
}

TEST(OpRulesTest, WindowAttributesAreChecked) {
  struct Case {
    AttributeMap attributes;
    std::string message;
  };
  const Case cases[] = {
      {{{"kernel_shape", Ints{2, 2}}, {"pads", Ints{1}}},
       "attribute 'pads' needs 4 values for 2 spatial dims, has 1"},
      {{{"kernel_shape", Ints{-2, 2}}}, "attribute 'kernel_shape' has value -2 (minimum 1)"},
      {{{"kernel_shape", Ints{2, 2}}, {"strides", Ints{1, 0}}},
       "attribute 'strides' has value 0 (minimum 1)"},
      {{{"kernel_shape", Ints{2, 2}}, {"dilations", Ints{0, 1}}},
       "attribute 'dilations' has value 0 (minimum 1)"},
      {{{"kernel_shape", Ints{2, 2}}, {"pads", Ints{0, 0, -1, 0}}},
       "attribute 'pads' has value -1 (minimum 0)"},
      {{{"kernel_shape", Ints{2, 2}}, {"strides", int64_t{2}}},
       "attribute 'strides' must be a list of ints"},
      {{{"kernel_shape", Ints{2, 2}}, {"auto_pad", int64_t{1}}},
       "attribute 'auto_pad' must be a string"},
      {{{"kernel_shape", Ints{2, 2}}, {"pads", Ints{1, 1, 0, 0}}, {"auto_pad", "SAME_UPPER"}},
       "attribute 'pads' cannot be used with auto_pad=SAME_UPPER"},
  };
  for (const Case& c : cases) {
    Status status = ReadError(c.attributes, 2);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(status.message(), c.message);
  }
}

// The copies disagreed: shape inference refused any pads beside auto_pad, both backends only
// pads that were not all zero. ONNX's Conv and pool specs: pads "cannot be used simultaneously
// with auto_pad attribute" — the attribute, whatever its values.
TEST(OpRulesTest, PadsBesideAutoPadAreRefusedEvenWhenZero) {
  for (const char* mode : {"SAME_UPPER", "SAME_LOWER", "VALID"}) {
    Status status =
        ReadError({{"kernel_shape", Ints{2}}, {"pads", Ints{0, 0}}, {"auto_pad", mode}}, 1);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << mode;
    EXPECT_EQ(status.message(),
              "attribute 'pads' cannot be used with auto_pad=" + std::string(mode));
  }
  EXPECT_TRUE(
      ReadError({{"kernel_shape", Ints{2}}, {"pads", Ints{0, 0}}, {"auto_pad", "NOTSET"}}, 1).ok());
}

// The copies disagreed: shape inference called an unknown auto_pad invalid, both backends
// unsupported (kUnimplemented). ONNX defines exactly four values ("auto_pad must be either
// NOTSET, SAME_UPPER, SAME_LOWER or VALID"): any other is a malformed model, for every backend.
TEST(OpRulesTest, AnAutoPadOutsideOnnxsFourIsInvalid) {
  Status status = ReadError({{"kernel_shape", Ints{2}}, {"auto_pad", "SAME"}}, 1);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "unknown auto_pad value 'SAME' (ONNX has NOTSET, SAME_UPPER, SAME_LOWER and VALID)");
}

// The copies disagreed: CpuRef took 0 or 1 only, shape inference and CpuAcc any int. ceil_mode
// is a flag in ONNX ("Whether to use ceil or floor"); a 2 is taken as neither.
TEST(OpRulesTest, CeilModeIsAFlagOfPoolsOnly) {
  EXPECT_TRUE(Read({{"kernel_shape", Ints{2}}, {"ceil_mode", int64_t{1}}}, 1).ceil_mode);
  Status status = ReadError({{"kernel_shape", Ints{2}}, {"ceil_mode", int64_t{2}}}, 1);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "attribute 'ceil_mode' must be 0 or 1, is 2");
  // Conv has no ceil_mode: it is left to the caller's check of unknown attributes.
  EXPECT_FALSE(Read({{"ceil_mode", int64_t{1}}}, 1, WindowOp::kConv).ceil_mode);
}

// ---- window geometry -------------------------------------------------------------------------

// ONNX backend test data (onnx/backend/test/data/node, Apache-2.0), output sizes only.
TEST(OpRulesTest, WindowOutputsOfOnnxTestCases) {
  // test_maxpool_2d_ceil: 4x4, kernel 3, stride 2, ceil_mode -> 2x2.
  EXPECT_EQ(
      Resolve1({{"kernel_shape", Ints{3}}, {"strides", Ints{2}}, {"ceil_mode", int64_t{1}}}, 4).out,
      2);
  // test_maxpool_2d_ceil_output_size_reduce_by_one: 2x2, kernel 1, stride 2, ceil_mode -> 1x1
  // (ceil gives 2, whose window would start in the end padding).
  EXPECT_EQ(
      Resolve1({{"kernel_shape", Ints{1}}, {"strides", Ints{2}}, {"ceil_mode", int64_t{1}}}, 2).out,
      1);
  // test_maxpool_2d_same_upper / same_lower: 5x5, kernel 3 -> 5x5, pads 1 and 1.
  const WindowDim upper = Resolve1({{"kernel_shape", Ints{3}}, {"auto_pad", "SAME_UPPER"}}, 5);
  EXPECT_EQ(upper.out, 5);
  EXPECT_EQ(upper.pad_begin, 1);
  EXPECT_EQ(upper.pad_end, 1);
  // test_averagepool_2d_same_upper: 32x32, kernel 2 -> 32x32, the odd pad at the end (UPPER)
  // or at the beginning (LOWER).
  const WindowDim odd_upper = Resolve1({{"kernel_shape", Ints{2}}, {"auto_pad", "SAME_UPPER"}}, 32);
  EXPECT_EQ(odd_upper.out, 32);
  EXPECT_EQ(odd_upper.pad_begin, 0);
  EXPECT_EQ(odd_upper.pad_end, 1);
  const WindowDim odd_lower = Resolve1({{"kernel_shape", Ints{2}}, {"auto_pad", "SAME_LOWER"}}, 32);
  EXPECT_EQ(odd_lower.pad_begin, 1);
  EXPECT_EQ(odd_lower.pad_end, 0);
  // test_maxpool_2d_dilations: 4x4, kernel 2, dilation 2 -> 2x2.
  EXPECT_EQ(Resolve1({{"kernel_shape", Ints{2}}, {"dilations", Ints{2}}}, 4).out, 2);
  // test_conv_with_strides_padding: 7x5, kernel 3, stride 2, pads 1 -> 4x3.
  EXPECT_EQ(
      Resolve1({{"kernel_shape", Ints{3}}, {"strides", Ints{2}}, {"pads", Ints{1, 1}}}, 7).out, 4);
  EXPECT_EQ(
      Resolve1({{"kernel_shape", Ints{3}}, {"strides", Ints{2}}, {"pads", Ints{1, 1}}}, 5).out, 3);
}

// The copies disagreed: shape inference gave SAME_* on an empty dim 0 positions, both backends
// refused it (the generic formula finds no window that fits). ONNX's spec for SAME_*:
// output_spatial_shape[i] = ceil(input_spatial_shape[i] / strides_spatial_shape[i]) = 0.
TEST(OpRulesTest, SamePaddingOfAnEmptyDimHasNoPositions) {
  for (const char* mode : {"SAME_UPPER", "SAME_LOWER"}) {
    const WindowDim dim =
        Resolve1({{"kernel_shape", Ints{3}}, {"strides", Ints{2}}, {"auto_pad", mode}}, 0);
    EXPECT_EQ(dim.out, 0) << mode;
  }
}

TEST(OpRulesTest, UnknownDimsGiveUnknownOutputs) {
  const WindowAttributes pool = Read({{"kernel_shape", Ints{3, 3}}, {"pads", Ints{1, 1, 1, 1}}}, 2);
  auto dims = ResolveWindow(pool, Ints{-1, 5}, pool.kernel_shape);
  ASSERT_TRUE(dims.ok()) << dims.error().ToString();
  EXPECT_THAT(WindowOutputDims(dims.value()), ElementsAre(kUnknownDim, 5));
  // Conv with a W of unknown spatial dims.
  const WindowAttributes conv = Read({{"auto_pad", "SAME_LOWER"}}, 1, WindowOp::kConv);
  auto same = ResolveWindow(conv, Ints{5}, Ints{-1});
  ASSERT_TRUE(same.ok()) << same.error().ToString();
  EXPECT_EQ(same.value()[0].out, kUnknownDim);
  EXPECT_EQ(same.value()[0].pad_begin, kUnknownDim);
}

TEST(OpRulesTest, AWindowLargerThanThePaddedInputIsRefused) {
  const WindowAttributes window =
      Read({{"kernel_shape", Ints{2, 5}}, {"pads", Ints{0, 1, 0, 0}}}, 2);
  auto dims = ResolveWindow(window, Ints{4, 3}, window.kernel_shape);
  ASSERT_FALSE(dims.ok());
  EXPECT_EQ(dims.error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dims.error().message(),
            "spatial dim 1: the window (extent 5) is larger than the padded input (4)");
  const WindowAttributes conv = Read({}, 1, WindowOp::kConv);
  auto zero = ResolveWindow(conv, Ints{4}, Ints{0});
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().message(), "spatial dim 0: the kernel size 0 is not positive");
}

TEST(OpRulesTest, SizesThatOverflowAreRefused) {
  const int64_t huge = int64_t{1} << 62;
  const int64_t k = int64_t{1} << 21;
  struct Case {
    AttributeMap attributes;
    Ints input;
    std::string what;
  };
  const Case cases[] = {
      {{{"kernel_shape", Ints{5}}, {"dilations", Ints{huge}}}, {8}, "the window extent"},
      {{{"kernel_shape", Ints{1}}, {"pads", Ints{huge, huge}}}, {8}, "the padded input"},
      // An unknown input cannot make huge pads fit.
      {{{"kernel_shape", Ints{1}}, {"pads", Ints{huge, huge}}}, {-1}, "the padded input"},
      // Each kernel dim fits, the 2^63 taps do not.
      {{{"kernel_shape", Ints{k, k, k}}}, {1, 1, 1}, "the kernel window"},
  };
  for (const Case& c : cases) {
    const WindowAttributes window = Read(c.attributes, c.input.size());
    auto dims = ResolveWindow(window, c.input, window.kernel_shape);
    ASSERT_FALSE(dims.ok()) << c.what;
    EXPECT_EQ(dims.error().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(dims.error().message(), HasSubstr(c.what + " "));
    EXPECT_THAT(dims.error().message(), HasSubstr("overflows the limit of 2^40"));
  }
  // A stride near INT64_MAX leaves one position and overflows nothing.
  EXPECT_EQ(Resolve1({{"kernel_shape", Ints{2}},
                      {"strides", Ints{INT64_MAX}},
                      {"pads", Ints{1, 1}},
                      {"ceil_mode", int64_t{1}}},
                     9)
                .out,
            1);
}

// Window positions counted by sliding one window along the padded input, a stride at a time.
// The input is [0, in), the padding [-begin, 0) and [in, in + end). nullopt: not even the first
// window fits.
std::optional<int64_t> CountPositions(int64_t in, int64_t kernel, int64_t stride, int64_t dilation,
                                      int64_t begin, int64_t end, bool ceil_mode) {
  const int64_t extent = (kernel - 1) * dilation + 1;
  if (-begin + extent > in + end)
    return std::nullopt;
  int64_t count = 0;
  int64_t last_start = 0;
  for (int64_t start = -begin;; start += stride) {
    // floor: every window that lies in the padded input. ceil: windows as long as the one
    // before left the padded input's end uncovered.
    const bool fits = start + extent <= in + end;
    const bool previous_left_the_end = count == 0 || last_start + extent < in + end;
    if (ceil_mode ? !previous_left_the_end : !fits)
      break;
    ++count;
    last_start = start;
  }
  // ceil_mode then drops the last window, once, when it starts in the end padding (ONNX PR 5741,
  // as onnxruntime and PyTorch do). Only the last: with pads wider than the kernel a window before
  // it may start in the end padding too, and is kept.
  if (ceil_mode && last_start >= in)
    --count;
  return count;
}

TEST(OpRulesTest, WindowOutputsMatchABruteForceCount) {
  std::random_device device;
  unsigned seed = device();
  if (const char* fixed = std::getenv("BACKPLANE_OP_RULES_SEED"))
    seed = static_cast<unsigned>(std::strtoul(fixed, nullptr, 10));
  SCOPED_TRACE("seed " + std::to_string(seed) +
               " (rerun with BACKPLANE_OP_RULES_SEED=" + std::to_string(seed) + ")");
  std::mt19937 random(seed);
  auto uniform = [&](int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(random);
  };
  const AutoPad modes[] = {AutoPad::kNotSet, AutoPad::kValid, AutoPad::kSameUpper,
                           AutoPad::kSameLower};
  for (int round = 0; round < 20000; ++round) {
    WindowAttributes window;
    window.auto_pad = modes[uniform(0, 3)];
    const int64_t in = uniform(0, 16), kernel = uniform(1, 5);
    window.strides = {uniform(1, 4)};
    window.dilations = {uniform(1, 3)};
    window.pads = {0, 0};
    if (window.auto_pad == AutoPad::kNotSet)
      window.pads = {uniform(0, 4), uniform(0, 4)};
    window.ceil_mode = uniform(0, 1) == 1;
    const int64_t stride = window.strides[0], dilation = window.dilations[0];
    const std::string trace = "round " + std::to_string(round) + ": in " + std::to_string(in) +
                              " kernel " + std::to_string(kernel) + " stride " +
                              std::to_string(stride) + " dilation " + std::to_string(dilation) +
                              " pads " + ToString(window.pads) + " auto_pad " +
                              std::string(AutoPadName(window.auto_pad)) + " ceil_mode " +
                              std::to_string(window.ceil_mode);
    auto resolved = ResolveWindow(window, Ints{in}, Ints{kernel});
    if (window.auto_pad == AutoPad::kSameUpper || window.auto_pad == AutoPad::kSameLower) {
      ASSERT_TRUE(resolved.ok()) << trace << ": " << resolved.error().ToString();
      const WindowDim& dim = resolved.value()[0];
      // One window per stride step that starts on an input element...
      int64_t steps = 0;
      for (int64_t start = 0; start < in; start += stride)
        ++steps;
      ASSERT_EQ(dim.out, steps) << trace;
      // ...each inside the padded input, and the padding no larger than the last one needs,
      // split in half with the odd element at the end (UPPER) or the beginning (LOWER).
      const int64_t extent = (kernel - 1) * dilation + 1;
      const int64_t total = dim.pad_begin + dim.pad_end;
      if (steps > 0) {
        ASSERT_LE((steps - 1) * stride + extent, in + total) << trace;
        ASSERT_TRUE(total == 0 || (steps - 1) * stride + extent == in + total) << trace;
      }
      const int64_t small = window.auto_pad == AutoPad::kSameUpper ? dim.pad_begin : dim.pad_end;
      ASSERT_EQ(small, total / 2) << trace;
      continue;
    }
    const auto expected = CountPositions(in, kernel, stride, dilation, window.pads[0],
                                         window.pads[1], window.ceil_mode);
    if (!expected) {
      ASSERT_FALSE(resolved.ok()) << trace << ": gave " << resolved.value()[0].out;
      ASSERT_THAT(resolved.error().message(), HasSubstr("is larger than the padded input"));
      continue;
    }
    ASSERT_TRUE(resolved.ok()) << trace << ": " << resolved.error().ToString();
    ASSERT_EQ(resolved.value()[0].out, *expected) << trace;
    ASSERT_EQ(resolved.value()[0].pad_begin, window.pads[0]) << trace;
    ASSERT_EQ(resolved.value()[0].pad_end, window.pads[1]) << trace;
  }
}

// ---- broadcasting ----------------------------------------------------------------------------

Shape Broadcasts(const Shape& a, const Shape& b) {
  auto out = Broadcast(a, b);
  EXPECT_TRUE(out.ok()) << out.error().ToString();
  return out.ok() ? out.value() : Shape{};
}

// ONNX's Broadcasting.md, "Multidirectional Broadcasting", its examples in order.
TEST(OpRulesTest, BroadcastsAsOnnxsExamples) {
  EXPECT_EQ(Broadcasts({2, 3, 4, 5}, {}), (Shape{2, 3, 4, 5}));
  EXPECT_EQ(Broadcasts({2, 3, 4, 5}, {5}), (Shape{2, 3, 4, 5}));
  EXPECT_EQ(Broadcasts({4, 5}, {2, 3, 4, 5}), (Shape{2, 3, 4, 5}));
  EXPECT_EQ(Broadcasts({1, 4, 5}, {2, 3, 1, 1}), (Shape{2, 3, 4, 5}));
  EXPECT_EQ(Broadcasts({3, 4, 5}, {2, 1, 1, 1}), (Shape{2, 3, 4, 5}));
  // Both directions at once, and an empty dim against 1.
  EXPECT_EQ(Broadcasts({3, 1}, {1, 4}), (Shape{3, 4}));
  EXPECT_EQ(Broadcasts({0, 1}, {1, 4}), (Shape{0, 4}));
}

TEST(OpRulesTest, ShapesThatDoNotBroadcastAreNamed) {
  for (const auto& [a, b] : {std::pair<Shape, Shape>{{2, 3}, {2}}, {{3, 4}, {2, 4}}, {{0}, {2}}}) {
    auto out = Broadcast(a, b);
    ASSERT_FALSE(out.ok()) << ToString(a) << " " << ToString(b);
    EXPECT_EQ(out.error().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(out.error().message(),
              "shapes " + ToString(a) + " and " + ToString(b) + " do not broadcast");
  }
}

// CpuAcc's copy knew static shapes only (an unknown dim against 4 "did not broadcast"); shape
// inference and CpuRef agreed on this, which is what an unknown dim can be at run time.
TEST(OpRulesTest, UnknownDimsBroadcastToWhatTheyCanBe) {
  EXPECT_EQ(Broadcasts({-1, 3}, {4, 1}), (Shape{4, 3}));
  EXPECT_EQ(Broadcasts({4, 1}, {-1, 3}), (Shape{4, 3}));
  EXPECT_EQ(Broadcasts({-1}, {1}), (Shape{-1}));
  EXPECT_EQ(Broadcasts({-1}, {-1}), (Shape{-1}));
  EXPECT_FALSE(Broadcast({-1, 3}, {4, 2}).ok());
}

TEST(OpRulesTest, BroadcastOffsetRepeatsAlongDimsOfOne) {
  const Shape out = {2, 3};
  std::vector<int64_t> row, column, scalar, same;
  for (int64_t flat = 0; flat < 6; ++flat) {
    row.push_back(BroadcastOffset(flat, out, {3}));
    column.push_back(BroadcastOffset(flat, out, {2, 1}));
    scalar.push_back(BroadcastOffset(flat, out, {}));
    same.push_back(BroadcastOffset(flat, out, {2, 3}));
  }
  EXPECT_THAT(row, ElementsAre(0, 1, 2, 0, 1, 2));
  EXPECT_THAT(column, ElementsAre(0, 0, 0, 1, 1, 1));
  EXPECT_THAT(scalar, ElementsAre(0, 0, 0, 0, 0, 0));
  EXPECT_THAT(same, ElementsAre(0, 1, 2, 3, 4, 5));
}

}  // namespace
}  // namespace backplane::op_rules
