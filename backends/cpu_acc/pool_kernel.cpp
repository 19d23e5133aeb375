#include "pool_kernel.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

// GCC warns that a 32-byte vector passed by value has another ABI without AVX; every function
// that does is inlined into its caller, so no such call exists.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace backplane::cpu_acc {
namespace {

// Everything below is inlined into each target's entry point, so that it is vectorized for that
// target (a call would run the baseline copy).
#define BACKPLANE_POOL_INLINE inline __attribute__((always_inline))

// An average's divisor: the window's positions inside the input, or inside the padding too.
BACKPLANE_POOL_INLINE int64_t Divisor(const PoolGeometry& g, const PoolSpan& rows,
                                      const PoolSpan& cols) {
  const int64_t count = g.kind == PoolGeometry::Kind::kAverageIncludingPadding
                            ? rows.with_padding * cols.with_padding
                            : (rows.last - rows.first) * (cols.last - cols.first);
  return std::max<int64_t>(count, 1);
}

// Eight lanes; GCC's and clang's vector extension, one AVX register where there is one, two SSE
// registers on the x86-64 baseline.
using Lanes8 = float __attribute__((vector_size(32)));

BACKPLANE_POOL_INLINE Lanes8 Load8(const float* from) {
  Lanes8 v;
  std::memcpy(&v, from, sizeof v);
  return v;
}

template <bool kMax, typename T>
BACKPLANE_POOL_INLINE T Accumulate(T acc, T x) {
  if constexpr (kMax)
    return acc > x ? acc : x;  // NaN-free max, as oneDNN's and ORT's kernels take it
  else
    return acc + x;
}

// kCount runs of 8 lanes at once, run i read at `corner + i * in_step` of every window pixel and
// written at `out + i * out_step`: the 8-lane chunks of one output pixel (in_step = out_step =
// 8), or the same chunk of kCount output pixels side by side in a row whose windows have the same
// span (in_step = stride * lanes, out_step = lanes; with few lanes a pixel, one pixel at a time
// left too little work per window position, and was slower). The sums or maxima stay in registers
// over the whole window (accumulating through `out` serialised the loop on store forwarding).
// `corner`: the window's first pixel inside the input. The positions inside form a rectangle (an
// axis' valid positions are an interval, a window's positions are monotonic), so the loop has no
// checks.
template <bool kMax, int kCount>
BACKPLANE_POOL_INLINE void PoolRuns(const PoolGeometry& g, const float* __restrict corner,
                                    float* __restrict out, const PoolSpan& rows,
                                    const PoolSpan& cols, int64_t in_step, int64_t out_step) {
  Lanes8 acc[kCount];
  for (int i = 0; i < kCount; ++i)
    acc[i] = Lanes8{} + (kMax ? -std::numeric_limits<float>::infinity() : 0.0f);
  const int64_t row_step = g.dilation_h * g.in_w * g.lanes, col_step = g.dilation_w * g.lanes;
  for (int64_t kh = rows.first; kh < rows.last; ++kh, corner += row_step) {
    const float* pixel = corner;
    for (int64_t kw = cols.first; kw < cols.last; ++kw, pixel += col_step) {
#pragma GCC unroll 4
      for (int i = 0; i < kCount; ++i)
        acc[i] = Accumulate<kMax>(acc[i], Load8(pixel + i * in_step));
    }
  }
  for (int i = 0; i < kCount; ++i) {
    if constexpr (!kMax)
      acc[i] /= static_cast<float>(Divisor(g, rows, cols));
    std::memcpy(out + i * out_step, &acc[i], sizeof acc[i]);
  }
}

// The same for lanes [0, width), width < 8: scalar.
template <bool kMax>
BACKPLANE_POOL_INLINE void PoolTail(const PoolGeometry& g, const float* corner, float* out,
                                    const PoolSpan& rows, const PoolSpan& cols, int64_t width) {
  for (int64_t c = 0; c < width; ++c) {
    float acc = kMax ? -std::numeric_limits<float>::infinity() : 0.0f;
    const float* row = corner + c;
    for (int64_t kh = rows.first; kh < rows.last; ++kh, row += g.dilation_h * g.in_w * g.lanes) {
      for (int64_t kw = cols.first; kw < cols.last; ++kw)
        acc = Accumulate<kMax>(acc, row[(kw - cols.first) * g.dilation_w * g.lanes]);
    }
    out[c] = kMax ? acc : acc / static_cast<float>(Divisor(g, rows, cols));
  }
}

BACKPLANE_POOL_INLINE bool SameSpan(const PoolSpan& a, const PoolSpan& b) {
  return a.first == b.first && a.last == b.last && a.with_padding == b.with_padding;
}

// Whether `pixels` windows side by side from `corner` (`in_step` apart), read as 8 lanes each,
// and their outputs from `out` (`out_step` apart), written as 8 lanes each, stay inside the
// buffers that end at `in_end` and `out_end`.
BACKPLANE_POOL_INLINE bool EightLanesFit(const PoolGeometry& g, const float* corner,
                                         const float* in_end, const float* out,
                                         const float* out_end, const PoolSpan& rows,
                                         const PoolSpan& cols, int64_t pixels, int64_t in_step,
                                         int64_t out_step) {
  if (rows.last <= rows.first || cols.last <= cols.first)
    return false;
  const float* last_read = corner + (rows.last - 1 - rows.first) * g.dilation_h * g.in_w * g.lanes +
                           (cols.last - 1 - cols.first) * g.dilation_w * g.lanes +
                           (pixels - 1) * in_step;
  return in_end - last_read >= 8 && out_end - (out + (pixels - 1) * out_step) >= 8;
}

template <bool kMax>
BACKPLANE_POOL_INLINE void Pool(const PoolGeometry& g, const float* in, float* out) {
  const int64_t lanes = g.lanes;
  const float* in_end = in + g.outer * g.in_h * g.in_w * lanes;
  const float* out_end = out + g.outer * g.out_h * g.out_w * lanes;
  for (int64_t o = 0; o < g.outer; ++o) {
    const float* plane = in + o * g.in_h * g.in_w * lanes;
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      const PoolSpan& rows = g.rows[oh];
      const int64_t ih = oh * g.stride_h - g.pad_top + rows.first * g.dilation_h;
      for (int64_t ow = 0; ow < g.out_w; ++ow, out += lanes) {
        const PoolSpan& cols = g.cols[ow];
        const int64_t iw = ow * g.stride_w - g.pad_left + cols.first * g.dilation_w;
        const float* corner = plane + (ih * g.in_w + iw) * lanes;
        // 4 pixels of a row at once when their windows have the same span, in 8-lane runs.
        // Fewer than 8 lanes (LeNet's 6 channels, channels-last) run as 8 all the same: the
        // lanes past a pixel's are the next pixel's, read for nothing and written before that
        // pixel is computed, which overwrites them (so the writes go in order); not near the
        // buffers' ends.
        constexpr int kPixels = 4;
        const int64_t in_step = g.stride_w * lanes;
        if (ow + kPixels <= g.out_w && SameSpan(cols, g.cols[ow + kPixels - 1]) &&
            SameSpan(cols, g.cols[ow + 1]) && SameSpan(cols, g.cols[ow + 2]) &&
            ((lanes < 32 && lanes % 8 == 0) ||
             (lanes < 8 && EightLanesFit(g, corner, in_end, out, out_end, rows, cols, kPixels,
                                         in_step, lanes)))) {
          for (int64_t c = 0; c < lanes; c += 8)
            PoolRuns<kMax, kPixels>(g, corner + c, out + c, rows, cols, in_step, lanes);
          ow += kPixels - 1;
          out += (kPixels - 1) * lanes;
          continue;
        }
        int64_t c = 0;
        for (; c + 32 <= lanes; c += 32)
          PoolRuns<kMax, 4>(g, corner + c, out + c, rows, cols, 8, 8);
        for (; c + 8 <= lanes; c += 8)
          PoolRuns<kMax, 1>(g, corner + c, out + c, rows, cols, 8, 8);
        if (c < lanes &&
            EightLanesFit(g, corner + c, in_end, out + c, out_end, rows, cols, 1, 8, 8))
          PoolRuns<kMax, 1>(g, corner + c, out + c, rows, cols, 8, 8);  // as above
        else
          PoolTail<kMax>(g, corner + c, out + c, rows, cols, lanes - c);
      }
    }
  }
}

BACKPLANE_POOL_INLINE void PoolAny(const PoolGeometry& g, const float* in, float* out) {
  if (g.kind == PoolGeometry::Kind::kMax)
    Pool<true>(g, in, out);
  else
    Pool<false>(g, in, out);
}

// The same code compiled three times; the inlined loops vectorize for each target.
__attribute__((target("avx512f"))) void PoolAvx512(const PoolGeometry& g, const float* in,
                                                   float* out) {
  PoolAny(g, in, out);
}
__attribute__((target("avx2"))) void PoolAvx2(const PoolGeometry& g, const float* in, float* out) {
  PoolAny(g, in, out);
}
void PoolBaseline(const PoolGeometry& g, const float* in, float* out) {
  PoolAny(g, in, out);
}

#undef BACKPLANE_POOL_INLINE

// The window of output position `out` on one axis: its first and one-past-last kernel positions
// inside [0, size), and how many are inside [-pad_begin, size + pad_end).
PoolSpan WindowSpan(int64_t out, int64_t stride, int64_t pad_begin, int64_t pad_end, int64_t kernel,
                    int64_t dilation, int64_t size) {
  PoolSpan span{kernel, 0, 0};
  for (int64_t k = 0; k < kernel; ++k) {
    const int64_t at = out * stride - pad_begin + k * dilation;
    if (at >= -pad_begin && at < size + pad_end)
      ++span.with_padding;
    if (at >= 0 && at < size) {
      span.first = std::min(span.first, k);
      span.last = k + 1;
    }
  }
  if (span.last == 0)  // a window entirely in the padding: empty
    span.first = 0;
  return span;
}

}  // namespace

void PoolGeometry::Prepare() {
  rows.clear();
  cols.clear();
  for (int64_t oh = 0; oh < out_h; ++oh)
    rows.push_back(WindowSpan(oh, stride_h, pad_top, pad_bottom, kernel_h, dilation_h, in_h));
  for (int64_t ow = 0; ow < out_w; ++ow)
    cols.push_back(WindowSpan(ow, stride_w, pad_left, pad_right, kernel_w, dilation_w, in_w));
}

PoolFunction BestPoolFunction() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f"))
    return PoolAvx512;
  if (__builtin_cpu_supports("avx2"))
    return PoolAvx2;
  return PoolBaseline;
}

}  // namespace backplane::cpu_acc
