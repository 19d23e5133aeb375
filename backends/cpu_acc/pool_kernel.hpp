// CpuAcc's own 2-D max and average pooling over channel-innermost layouts.
//
// Why not oneDNN's: on AVX2 (oneDNN 2.6) its max pool and its average pool that excludes the
// padding run several times slower than its average pool that includes it, though all three are
// the same loads and arithmetic; on plain NCHW it has only its scalar reference, slower still (the
// timings are in docs/performance.md). This loop is what all three are: per output pixel, a max or
// a sum over the window's input pixels, each a run of contiguous channels the compiler vectorizes.
#pragma once

#include <cstdint>
#include <vector>

namespace backplane::cpu_acc {

// A pooling over a tensor laid out as [outer][height][width][lanes]: channels-last NHWC is
// outer = N, lanes = C; oneDNN's channel-blocked nChw8c is outer = N * C/8, lanes = 8 (the
// padding channels of the last block are zeros in and out).
// One output row's (or column's) window: its positions inside the input, [first, last) of the
// kernel's, and how many it has inside the ONNX padding (the divisor that counts padding).
struct PoolSpan {
  int64_t first = 0, last = 0, with_padding = 0;
};

struct PoolGeometry {
  enum class Kind { kMax, kAverageExcludingPadding, kAverageIncludingPadding };
  Kind kind = Kind::kMax;
  int64_t outer = 1, lanes = 1;
  int64_t in_h = 1, in_w = 1, out_h = 1, out_w = 1;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1;
  int64_t dilation_h = 1, dilation_w = 1;  // ONNX's: 1 is dense
  int64_t pad_top = 0, pad_left = 0;
  // kAverageIncludingPadding counts window positions up to here (the ONNX padding), not the
  // positions a ceil_mode window adds past it.
  int64_t pad_bottom = 0, pad_right = 0;
  // Per output row and column, from the above by Prepare(), once: the kernel then does no window
  // arithmetic per pixel (which cost as much as the pooling itself for 8-channel blocks).
  std::vector<PoolSpan> rows, cols;

  void Prepare();
};

using PoolFunction = void (*)(const PoolGeometry& geometry, const float* in, float* out);

// The pooling compiled for the widest vector unit this CPU has (AVX-512, AVX2, or the x86-64
// baseline), chosen once.
PoolFunction BestPoolFunction();

}  // namespace backplane::cpu_acc
