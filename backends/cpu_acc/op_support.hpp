// What CpuAcc runs, and the ONNX attribute arithmetic its compiler shares with IsSupported.
//
// CheckOp answers IsSupported: kUnimplemented (the layer goes to the next backend) for what
// oneDNN cannot do, or cannot do with CpuRef's results (named in the message), kInvalidArgument
// for descriptions ONNX forbids. It reads the description only.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/sdk/backend.hpp"

namespace backplane::cpu_acc {

inline constexpr std::string_view kId = "CpuAcc";
// oneDNN's convolution and pooling take 1 to 3 spatial dims; its tensors up to 12 dims.
inline constexpr std::size_t kMaxSpatialRank = 3;
inline constexpr std::size_t kMaxRank = 12;

// "Conv node 'conv1'", the start of every message about one node.
std::string NodeLabel(const OperatorDesc& op);
Status NodeUnimplemented(const OperatorDesc& op, const std::string& reason);
Status NodeInvalid(const OperatorDesc& op, const std::string& reason);

bool HasInput(const OperatorDesc& op, std::size_t index);
bool IsConstant(const OperatorDesc& op, std::size_t index);
bool IsStatic(const Shape& shape);

int64_t IntAttr(const OperatorDesc& op, std::string_view key, int64_t fallback);
float FloatAttr(const OperatorDesc& op, std::string_view key, float fallback);
std::string StringAttr(const OperatorDesc& op, std::string_view key, std::string fallback);
std::vector<int64_t> IntsAttr(const OperatorDesc& op, std::string_view key);

// A sliding window resolved for static spatial dims, in oneDNN's terms.
struct Window {
  std::vector<int64_t> kernel, strides, dilations;  // ONNX dilations (1: dense)
  std::vector<int64_t> pad_begin, pad_end;          // pad_end as oneDNN needs it for `out`
  std::vector<int64_t> out;
  bool ceil_extended = false;  // ceil_mode added positions beyond the ONNX padding
};

// ONNX's convPoolShapeInference (see backends/cpu_ref/window_kernels.cpp); `kernel` is the
// spatial kernel (Conv: W's dims). An error string when the window does not fit.
std::optional<std::string> ResolveWindow(const OperatorDesc& op, std::span<const int64_t> in,
                                         std::span<const int64_t> kernel, bool ceil_mode,
                                         Window* window);

// Axis normalised into [0, rank + extra).
std::optional<int64_t> NormalizedAxis(int64_t axis, int64_t rank, int64_t extra = 0);

// Numpy broadcasting of static shapes.
std::optional<Shape> Broadcast(const Shape& a, const Shape& b);

// IsSupported.
Status CheckOp(const OperatorDesc& op);

}  // namespace backplane::cpu_acc
