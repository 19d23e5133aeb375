// CpuAcc's pooling kernel (backends/cpu_acc/pool_kernel.hpp) on its own, against a direct
// reading of ONNX's pooling: seeded random geometries, every lane count from 1 to 20 (the paths
// for 8-lane runs, 32-lane runs, and fewer than 8 lanes read and written as 8), with buffers of
// exactly the tensor's size, so that a read or write past either end fails under AddressSanitizer.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "pool_kernel.hpp"
#include "test_util.hpp"

namespace backplane::cpu_acc {
namespace {

int64_t Draw(std::mt19937& rng, int64_t low, int64_t high) {
  return std::uniform_int_distribution<int64_t>(low, high)(rng);
}

// One axis: the ONNX output size for `kernel` positions `dilation` apart, with `ceil` mode's extra
// window only when it starts inside the input or its leading padding (as ONNX requires).
int64_t OutputSize(int64_t size, int64_t kernel, int64_t stride, int64_t dilation,
                   int64_t pad_begin, int64_t pad_end, bool ceil) {
  const int64_t span = size + pad_begin + pad_end - ((kernel - 1) * dilation + 1);
  int64_t out = (ceil ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceil && (out - 1) * stride >= size + pad_begin)
    --out;
  return out;
}

// Per output element, straight from the definition: the window's positions inside the input,
// their max or mean; the divisor that includes padding counts positions inside the ONNX pads.
std::vector<float> Reference(const PoolGeometry& g, const std::vector<float>& in) {
  std::vector<float> out(static_cast<std::size_t>(g.outer * g.out_h * g.out_w * g.lanes));
  const bool max = g.kind == PoolGeometry::Kind::kMax;
  std::size_t at = 0;
  for (int64_t o = 0; o < g.outer; ++o) {
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        for (int64_t c = 0; c < g.lanes; ++c) {
          double acc = max ? -std::numeric_limits<double>::infinity() : 0.0;
          int64_t inside = 0, padded = 0;
          for (int64_t kh = 0; kh < g.kernel_h; ++kh) {
            const int64_t ih = oh * g.stride_h - g.pad_top + kh * g.dilation_h;
            for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
              const int64_t iw = ow * g.stride_w - g.pad_left + kw * g.dilation_w;
              if (ih >= -g.pad_top && ih < g.in_h + g.pad_bottom && iw >= -g.pad_left &&
                  iw < g.in_w + g.pad_right) {
                ++padded;
              }
              if (ih < 0 || ih >= g.in_h || iw < 0 || iw >= g.in_w)
                continue;
              const float x =
                  in[static_cast<std::size_t>(((o * g.in_h + ih) * g.in_w + iw) * g.lanes + c)];
              acc = max ? std::max<double>(acc, x) : acc + x;
              ++inside;
            }
          }
          if (!max) {
            const int64_t divisor =
                g.kind == PoolGeometry::Kind::kAverageIncludingPadding ? padded : inside;
            acc /= static_cast<double>(std::max<int64_t>(divisor, 1));
          }
          out[at++] = static_cast<float>(acc);
        }
      }
    }
  }
  return out;
}

TEST(CpuAccPoolKernelTest, RandomGeometriesOfEveryLaneCountMatchTheDefinition) {
  const uint64_t seed = backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED reruns it)");
  std::mt19937 rng(seed);
  const PoolFunction pool = BestPoolFunction();
  for (int iteration = 0; iteration < 600; ++iteration) {
    PoolGeometry g;
    g.kind = static_cast<PoolGeometry::Kind>(Draw(rng, 0, 2));
    g.lanes = 1 + iteration % 20;
    g.outer = Draw(rng, 1, 3);
    g.in_h = Draw(rng, 1, 12);
    g.in_w = Draw(rng, 1, 12);
    g.kernel_h = Draw(rng, 1, std::min<int64_t>(4, g.in_h));
    g.kernel_w = Draw(rng, 1, std::min<int64_t>(4, g.in_w));
    g.stride_h = Draw(rng, 1, 3);
    g.stride_w = Draw(rng, 1, 3);
    g.dilation_h = (g.kernel_h - 1) * 2 < g.in_h ? Draw(rng, 1, 2) : 1;
    g.dilation_w = (g.kernel_w - 1) * 2 < g.in_w ? Draw(rng, 1, 2) : 1;
    g.pad_top = Draw(rng, 0, g.kernel_h - 1);
    g.pad_bottom = Draw(rng, 0, g.kernel_h - 1);
    g.pad_left = Draw(rng, 0, g.kernel_w - 1);
    g.pad_right = Draw(rng, 0, g.kernel_w - 1);
    const bool ceil = Draw(rng, 0, 3) == 0;
    g.out_h =
        OutputSize(g.in_h, g.kernel_h, g.stride_h, g.dilation_h, g.pad_top, g.pad_bottom, ceil);
    g.out_w =
        OutputSize(g.in_w, g.kernel_w, g.stride_w, g.dilation_w, g.pad_left, g.pad_right, ceil);
    g.Prepare();
    const std::string what =
        "iteration " + std::to_string(iteration) + ": lanes " + std::to_string(g.lanes) +
        ", outer " + std::to_string(g.outer) + ", in " + std::to_string(g.in_h) + "x" +
        std::to_string(g.in_w) + ", kernel " + std::to_string(g.kernel_h) + "x" +
        std::to_string(g.kernel_w) + ", stride " + std::to_string(g.stride_h) + "x" +
        std::to_string(g.stride_w) + ", dilation " + std::to_string(g.dilation_h) + "x" +
        std::to_string(g.dilation_w) + ", pads " + std::to_string(g.pad_top) + "," +
        std::to_string(g.pad_left) + "," + std::to_string(g.pad_bottom) + "," +
        std::to_string(g.pad_right) + (ceil ? ", ceil" : "") + ", kind " +
        std::to_string(static_cast<int>(g.kind));
    SCOPED_TRACE(what);

    // Exactly sized: AddressSanitizer sees a lane read or written past either end.
    std::vector<float> in(static_cast<std::size_t>(g.outer * g.in_h * g.in_w * g.lanes));
    std::uniform_real_distribution<float> value(-4.0f, 4.0f);
    for (float& x : in)
      x = value(rng);
    std::vector<float> out(static_cast<std::size_t>(g.outer * g.out_h * g.out_w * g.lanes), NAN);
    pool(g, in.data(), out.data());

    const std::vector<float> want = Reference(g, in);
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (std::isinf(want[i])) {  // a max over a window entirely in the padding
        ASSERT_EQ(out[i], want[i]) << "element " << i;
        continue;
      }
      ASSERT_NEAR(out[i], want[i], 1e-5f * (1.0f + std::abs(want[i]))) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace backplane::cpu_acc
