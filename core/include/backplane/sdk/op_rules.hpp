// ONNX's operator rules that shape inference and every backend must apply alike, written once:
//
//  - the sliding window of Conv, MaxPool and AveragePool: kernel_shape, strides, pads, dilations,
//    auto_pad and ceil_mode read and checked, then resolved per spatial dim into the output size
//    and the padding ONNX adds at each end;
//  - multidirectional (numpy) broadcasting, as Add and Mul (and MatMul's batch dims) use it;
//  - Pad's modes and the shape its pads give.
//
// Part of the backend SDK and header-only: a backend may use it and links nothing for it. Every
// function is pure and thread-safe. Dimensions follow core's conventions: a negative dimension is
// unknown (dynamic) and whatever depends on it comes out as kUnknownDim; a known result stays
// within kMaxElementCount, so that callers may multiply and add such results (core's rule on
// dimension arithmetic, backplane/core/tensor.hpp). Errors are kInvalidArgument with a message
// that names the attribute or the spatial dim and the reason, never the node: callers put their
// own label in front.
//
// Traps kept in mind here:
//  - Attributes come from the model and may hold anything up to INT64_MAX. Every sum and product
//    of them is bounded (BoundedAdd, BoundedMul), and ceiling divisions are written as
//    (a - 1) / b + 1, which a stride near INT64_MAX cannot overflow.
//  - With ceil_mode a last window that would start in the end padding is dropped (PyTorch's rule,
//    which ONNX's reference and shape inference follow since ONNX 1.16): ceil alone would count it.
//  - SAME_UPPER and SAME_LOWER give ceil(input / stride) positions whatever ceil_mode says, 0 for
//  an
//    empty input; the padding is what makes the last of them fit.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backplane/core/operator.hpp"
#include "backplane/core/status.hpp"
#include "backplane/core/tensor.hpp"

namespace backplane::op_rules {

// What an unknown result is: an unknown (negative) dimension went into it.
inline constexpr int64_t kUnknownDim = -1;

// ---- window geometry: Conv, MaxPool, AveragePool -----------------------------------------------

enum class AutoPad { kNotSet, kSameUpper, kSameLower, kValid };

inline std::optional<AutoPad> ParseAutoPad(std::string_view text) {
  if (text == "NOTSET")
    return AutoPad::kNotSet;
  if (text == "SAME_UPPER")
    return AutoPad::kSameUpper;
  if (text == "SAME_LOWER")
    return AutoPad::kSameLower;
  if (text == "VALID")
    return AutoPad::kValid;
  return std::nullopt;
}

inline std::string_view AutoPadName(AutoPad auto_pad) {
  switch (auto_pad) {
    case AutoPad::kNotSet:
      return "NOTSET";
    case AutoPad::kSameUpper:
      return "SAME_UPPER";
    case AutoPad::kSameLower:
      return "SAME_LOWER";
    case AutoPad::kValid:
      return "VALID";
  }
  return "?";
}

// Which operator the attributes belong to: Conv takes its kernel from W when kernel_shape is
// absent and has no ceil_mode; a pool must have kernel_shape and may have ceil_mode.
enum class WindowOp { kConv, kPool };

// A node's window attributes, checked, with ONNX's defaults filled in.
struct WindowAttributes {
  AutoPad auto_pad = AutoPad::kNotSet;
  std::vector<int64_t> kernel_shape;  // as given (each >= 1); empty when absent (Conv: W's dims)
  std::vector<int64_t> strides;       // one per spatial dim, >= 1
  std::vector<int64_t> dilations;     // one per spatial dim, >= 1
  std::vector<int64_t> pads;          // the begins, then the ends: 2 per spatial dim, >= 0
  bool ceil_mode = false;             // pools only
};

namespace detail {

inline Status AttributeType(std::string_view key, std::string_view type) {
  return InvalidArgument("attribute '" + std::string(key) + "' must be " + std::string(type));
}

// A list attribute of `length` values, each at least `minimum`; `fallback` when absent.
inline Status ReadInts(const AttributeMap& attributes, std::string_view key, std::size_t length,
                       int64_t minimum, std::size_t spatial_rank, std::vector<int64_t> fallback,
                       std::vector<int64_t>* out) {
  auto it = attributes.find(key);
  if (it == attributes.end()) {
    *out = std::move(fallback);
    return Status::Ok();
  }
  const auto* values = std::get_if<std::vector<int64_t>>(&it->second);
  if (values == nullptr)
    return AttributeType(key, "a list of ints");
  if (values->size() != length) {
    return InvalidArgument("attribute '" + std::string(key) + "' needs " + std::to_string(length) +
                           " values for " + std::to_string(spatial_rank) + " spatial dims, has " +
                           std::to_string(values->size()));
  }
  for (int64_t value : *values) {
    if (value < minimum) {
      return InvalidArgument("attribute '" + std::string(key) + "' has value " +
                             std::to_string(value) + " (minimum " + std::to_string(minimum) + ")");
    }
  }
  *out = *values;
  return Status::Ok();
}

}  // namespace detail

// Reads and checks the window attributes of a node with `spatial_rank` spatial dims (its input's
// rank minus 2). Attributes that are not the window's are left to the caller.
inline Result<WindowAttributes> ReadWindowAttributes(const AttributeMap& attributes,
                                                     std::size_t spatial_rank, WindowOp op) {
  WindowAttributes window;
  if (auto it = attributes.find(std::string_view("auto_pad")); it != attributes.end()) {
    const auto* text = std::get_if<std::string>(&it->second);
    if (text == nullptr)
      return detail::AttributeType("auto_pad", "a string");
    const auto auto_pad = ParseAutoPad(*text);
    if (!auto_pad) {
      return InvalidArgument("unknown auto_pad value '" + *text +
                             "' (ONNX has NOTSET, SAME_UPPER, SAME_LOWER and VALID)");
    }
    window.auto_pad = *auto_pad;
  }
  const std::size_t n = spatial_rank;
  BACKPLANE_RETURN_IF_ERROR(
      detail::ReadInts(attributes, "kernel_shape", n, 1, n, {}, &window.kernel_shape));
  BACKPLANE_RETURN_IF_ERROR(detail::ReadInts(attributes, "strides", n, 1, n,
                                             std::vector<int64_t>(n, 1), &window.strides));
  BACKPLANE_RETURN_IF_ERROR(detail::ReadInts(attributes, "dilations", n, 1, n,
                                             std::vector<int64_t>(n, 1), &window.dilations));
  BACKPLANE_RETURN_IF_ERROR(detail::ReadInts(attributes, "pads", 2 * n, 0, n,
                                             std::vector<int64_t>(2 * n, 0), &window.pads));
  if (op == WindowOp::kPool && window.kernel_shape.empty())
    return InvalidArgument("attribute 'kernel_shape' is required");
  // ONNX: pads "cannot be used simultaneously with auto_pad", even when they are all zero.
  if (window.auto_pad != AutoPad::kNotSet && attributes.contains(std::string_view("pads"))) {
    return InvalidArgument("attribute 'pads' cannot be used with auto_pad=" +
                           std::string(AutoPadName(window.auto_pad)));
  }
  if (op == WindowOp::kPool) {
    if (auto it = attributes.find(std::string_view("ceil_mode")); it != attributes.end()) {
      const auto* value = std::get_if<int64_t>(&it->second);
      if (value == nullptr)
        return detail::AttributeType("ceil_mode", "an int");
      if (*value != 0 && *value != 1) {
        return InvalidArgument("attribute 'ceil_mode' must be 0 or 1, is " +
                               std::to_string(*value));
      }
      window.ceil_mode = *value == 1;
    }
  }
  return window;
}

// One spatial dim of a window, resolved against an input dim.
struct WindowDim {
  int64_t kernel = kUnknownDim;
  int64_t stride = 1;
  int64_t dilation = 1;
  int64_t extent = kUnknownDim;  // (kernel - 1) * dilation + 1, what one window covers
  // The padding ONNX adds at each end (explicit, or SAME_*'s); kUnknownDim for SAME_* on an
  // unknown input or kernel. A ceil_mode window may reach past pad_end: those positions are
  // neither input nor padding (AveragePool's count_include_pad does not count them).
  int64_t pad_begin = 0;
  int64_t pad_end = 0;
  int64_t out = kUnknownDim;  // window positions; kUnknownDim when the input or kernel is unknown
};

// Resolves `attributes` (from ReadWindowAttributes) against the spatial dims of the input and
// of the kernel (a pool: kernel_shape; Conv: W's spatial dims, which may be unknown).
// kInvalidArgument when the window cannot slide over the padded input, or when a size overflows
// kMaxElementCount (its message says "overflows").
inline Result<std::vector<WindowDim>> ResolveWindow(const WindowAttributes& attributes,
                                                    std::span<const int64_t> input,
                                                    std::span<const int64_t> kernel) {
  const std::size_t rank = input.size();
  if (kernel.size() != rank || attributes.strides.size() != rank ||
      attributes.dilations.size() != rank || attributes.pads.size() != 2 * rank) {
    return InvalidArgument("the window has " + std::to_string(attributes.strides.size()) +
                           " spatial dims and a kernel of " + std::to_string(kernel.size()) +
                           ", the input " + std::to_string(rank));
  }
  // A window's taps are a product of dimensions like a tensor's elements, and bounded the same.
  if (!BoundedDimProduct(kernel)) {
    return InvalidArgument("the kernel window " + ToString(Shape(kernel.begin(), kernel.end())) +
                           " (the product of its dims) overflows the limit of 2^40 (" +
                           std::to_string(kMaxElementCount) + ")");
  }
  std::vector<WindowDim> dims(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    const std::string where = "spatial dim " + std::to_string(d) + ": ";
    const auto overflow = [&](std::string_view what) {
      return InvalidArgument(where + std::string(what) + " overflows the limit of 2^40 (" +
                             std::to_string(kMaxElementCount) + ")");
    };
    WindowDim& dim = dims[d];
    dim.kernel = kernel[d] < 0 ? kUnknownDim : kernel[d];
    dim.stride = attributes.strides[d];
    dim.dilation = attributes.dilations[d];
    if (dim.kernel == 0)
      return InvalidArgument(where + "the kernel size 0 is not positive");
    if (dim.kernel > 0) {
      const auto stretched = BoundedMul(dim.kernel - 1, dim.dilation);
      const auto extent = stretched ? BoundedAdd(*stretched, 1) : std::nullopt;
      if (!extent)
        return overflow("the window extent (kernel - 1) x dilation + 1");
      dim.extent = *extent;
    }
    const int64_t in = input[d] < 0 ? kUnknownDim : input[d];
    const bool known = in >= 0 && dim.extent > 0;
    switch (attributes.auto_pad) {
      case AutoPad::kNotSet:
        dim.pad_begin = attributes.pads[d];
        dim.pad_end = attributes.pads[d + rank];
        break;
      case AutoPad::kValid:
        break;
      case AutoPad::kSameUpper:
      case AutoPad::kSameLower: {
        if (!known) {
          dim.pad_begin = dim.pad_end = kUnknownDim;
          continue;  // out stays unknown
        }
        // ceil(in / stride) positions, the last one ending at the padded end. (out - 1) * stride
        // is below `in`, so nothing here overflows.
        dim.out = in == 0 ? 0 : (in - 1) / dim.stride + 1;
        const int64_t total = std::max<int64_t>(0, (dim.out - 1) * dim.stride + dim.extent - in);
        const int64_t small = total / 2;
        dim.pad_begin = attributes.auto_pad == AutoPad::kSameUpper ? small : total - small;
        dim.pad_end = total - dim.pad_begin;
        continue;
      }
    }
    const auto pads = BoundedAdd(dim.pad_begin, dim.pad_end);
    const auto padded = pads && in >= 0 ? BoundedAdd(in, *pads) : pads;
    if (!padded)
      return overflow("the padded input (input + pads)");
    if (!known)
      continue;
    const int64_t span = *padded - dim.extent;
    if (span < 0) {
      return InvalidArgument(where + "the window (extent " + std::to_string(dim.extent) +
                             ") is larger than the padded input (" + std::to_string(*padded) + ")");
    }
    if (!attributes.ceil_mode) {
      dim.out = span / dim.stride + 1;
      continue;
    }
    dim.out = (span == 0 ? 0 : (span - 1) / dim.stride + 1) + 1;
    if ((dim.out - 1) * dim.stride >= in + dim.pad_begin)
      --dim.out;  // the last window would start in the end padding
  }
  return dims;
}

// The output's spatial dims of a resolved window.
inline Shape WindowOutputDims(std::span<const WindowDim> window) {
  Shape out;
  out.reserve(window.size());
  for (const WindowDim& dim : window)
    out.push_back(dim.out);
  return out;
}

// ---- multidirectional broadcasting: Add, Mul, MatMul's batch dims -----------------------------

// The shape `a` and `b` broadcast to: aligned at their last dims, each pair of dims equal or one
// of them 1 (ONNX's Broadcasting.md, numpy's rule). An unknown dim is compatible with anything:
// it is 1 or the other dim at run time, so the result takes a known dim other than 1, else stays
// unknown. kInvalidArgument "shapes [2,3] and [2] do not broadcast" otherwise.
inline Result<Shape> Broadcast(const Shape& a, const Shape& b) {
  const std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da == 1) {
      out[i] = db;
    } else if (db == 1) {
      out[i] = da;
    } else if (da < 0) {
      out[i] = db;  // 1 or db at run time: either way db
    } else if (db < 0 || da == db) {
      out[i] = da;
    } else {
      return InvalidArgument("shapes " + ToString(a) + " and " + ToString(b) + " do not broadcast");
    }
  }
  return out;
}

// The element of `in` that feeds element `flat` (row-major) of `out`, where `in` broadcasts to
// `out` (Broadcast gave `out` or a shape `in` broadcasts to; every dim known): `in`'s dims align
// with `out`'s last dims, and along a dim of 1 the same element repeats.
inline int64_t BroadcastOffset(int64_t flat, const Shape& out, const Shape& in) {
  int64_t offset = 0;
  int64_t stride = 1;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::size_t axis_in = in.size() - 1 - i;
    const std::size_t axis_out = out.size() - 1 - i;
    const int64_t coordinate = flat % out[axis_out];
    flat /= out[axis_out];
    if (in[axis_in] != 1)
      offset += coordinate * stride;
    stride *= in[axis_in];
  }
  return offset;
}

// ---- Slice -------------------------------------------------------------------------------------

// Slice along one axis of `dim` elements, from ONNX's definition: the first index and the bound,
// negative starts and ends count from the end, then both are clamped (to [0, dim] going forward;
// going back, start to [0, dim - 1] and end to [-1, dim - 1]), so that INT64_MAX and INT64_MIN
// mean "to the end".
inline std::pair<int64_t, int64_t> SliceBounds(int64_t start, int64_t end, int64_t step,
                                               int64_t dim) {
  if (start < 0)
    start += dim;  // cannot overflow: dim >= 0
  if (end < 0)
    end += dim;
  if (step > 0)
    return {std::clamp<int64_t>(start, 0, dim), std::clamp<int64_t>(end, 0, dim)};
  return {std::clamp<int64_t>(start, 0, dim - 1), std::clamp<int64_t>(end, -1, dim - 1)};
}
// The number of elements Slice takes along the axis.
inline int64_t SliceLength(int64_t start, int64_t end, int64_t step, int64_t dim) {
  if (dim == 0)
    return 0;
  const auto [from, to] = SliceBounds(start, end, step, dim);
  // Written so that no step, INT64_MIN included, overflows.
  if (step > 0)
    return to > from ? (to - from - 1) / step + 1 : 0;
  const int64_t back =
      step == std::numeric_limits<int64_t>::min() ? std::numeric_limits<int64_t>::max() : -step;
  return from > to ? (from - to - 1) / back + 1 : 0;
}
// ---- Pad ---------------------------------------------------------------------------------------

enum class PadMode { kConstant, kReflect, kEdge, kWrap };

// ONNX's mode names (wrap since opset 19); nullopt for anything else.
inline std::optional<PadMode> ParsePadMode(std::string_view text) {
  if (text == "constant")
    return PadMode::kConstant;
  if (text == "reflect")
    return PadMode::kReflect;
  if (text == "edge")
    return PadMode::kEdge;
  if (text == "wrap")
    return PadMode::kWrap;
  return std::nullopt;
}

// The shape of `input` padded by `pads`: ONNX's layout, the begins of every axis, then the ends;
// a negative pad crops. An unknown dim stays unknown. kInvalidArgument when `pads` does not hold
// 2 x rank values, when a pad exceeds kMaxElementCount either way (pads come from the model: the
// bound keeps the sums below from overflowing), or when a dim would be cropped below 0.
inline Result<Shape> PaddedShape(const Shape& input, std::span<const int64_t> pads) {
  const std::size_t rank = input.size();
  if (pads.size() != 2 * rank) {
    return InvalidArgument("pads has " + std::to_string(pads.size()) + " values, expected " +
                           std::to_string(2 * rank) + " (begin and end of each of " +
                           std::to_string(rank) + " axes)");
  }
  for (int64_t pad : pads) {
    if (pad > kMaxElementCount || pad < -kMaxElementCount) {
      return InvalidArgument("pad " + std::to_string(pad) + " is beyond the limit of 2^40 (" +
                             std::to_string(kMaxElementCount) + ")");
    }
  }
  Shape out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    if (input[i] < 0) {
      out[i] = kUnknownDim;
      continue;
    }
    out[i] = input[i] + pads[i] + pads[rank + i];
    if (out[i] < 0) {
      return InvalidArgument("axis " + std::to_string(i) + ": pads " + std::to_string(pads[i]) +
                             " and " + std::to_string(pads[rank + i]) + " crop a dim of " +
                             std::to_string(input[i]) + " below 0");
    }
  }
  return out;
}

}  // namespace backplane::op_rules
