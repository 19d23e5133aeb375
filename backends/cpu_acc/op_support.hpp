// What CpuAcc runs: the support check of each op, and the helpers its compiler shares with them.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backplane/sdk/backend.hpp"
#include "backplane/sdk/op_rules.hpp"

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

// A sliding window in oneDNN's terms: ONNX's (op_rules.hpp) for static spatial dims, with
// pad_end grown where a ceil_mode window reaches past the ONNX padding (oneDNN computes its output
// size with floor).
struct Window {
  std::vector<int64_t> kernel, strides, dilations;  // ONNX dilations (1: dense)
  std::vector<int64_t> pad_begin, pad_end;          // pad_end as oneDNN needs it for `out`
  std::vector<int64_t> out;
  bool ceil_extended = false;  // ceil_mode added positions beyond the ONNX padding
};

// `op`'s window over the spatial dims `in` with the spatial `kernel` (Conv: W's dims), refused in
// the node's name (kInvalidArgument) when the attributes or the geometry are wrong.
Result<Window> ResolveWindow(const OperatorDesc& op, std::span<const int64_t> in,
                             std::span<const int64_t> kernel, op_rules::WindowOp kind);

// `status` (its code kept) with the node named in front of its message.
Status NodeError(const OperatorDesc& op, const Status& status);

// Axis normalised into [0, rank + extra).
std::optional<int64_t> NormalizedAxis(int64_t axis, int64_t rank, int64_t extra = 0);

// The support checks, one per op: each is the `check` of the op's row in the op table
// (compiler.cpp), which CheckOp (IsSupported) and the lowering share. kUnimplemented (the layer
// goes to the next backend) for what oneDNN cannot do, or cannot do with CpuRef's results (named
// in the message), kInvalidArgument for descriptions ONNX forbids. They read the description only.
Status CheckConv(const OperatorDesc& op);
Status CheckMaxPool(const OperatorDesc& op);
Status CheckAveragePool(const OperatorDesc& op);
Status CheckGlobalPool(const OperatorDesc& op);
Status CheckBinary(const OperatorDesc& op);
Status CheckUnary(const OperatorDesc& op);
Status CheckSoftmax(const OperatorDesc& op);
Status CheckBatchNorm(const OperatorDesc& op);
Status CheckGemm(const OperatorDesc& op);
Status CheckMatMul(const OperatorDesc& op);
Status CheckIdentity(const OperatorDesc& op);
Status CheckFlatten(const OperatorDesc& op);
Status CheckReshape(const OperatorDesc& op);
Status CheckTranspose(const OperatorDesc& op);
Status CheckConcat(const OperatorDesc& op);
Status CheckLeakyRelu(const OperatorDesc& op);
Status CheckHardSigmoid(const OperatorDesc& op);
Status CheckClip(const OperatorDesc& op);
Status CheckDropout(const OperatorDesc& op);
Status CheckPad(const OperatorDesc& op);
Status CheckQuantizeLinear(const OperatorDesc& op);
Status CheckDequantizeLinear(const OperatorDesc& op);

// A QuantizeLinear's or DequantizeLinear's parameters as the checks above accepted them: one
// scale and zero point per tensor (axis < 0), or one per index of `axis` (normalised). `type` is
// the quantized side's (UINT8, INT8; INT32 for a DequantizeLinear of a bias).
struct QuantParams {
  DataType type = DataType::kUint8;
  int64_t axis = -1;
  std::vector<float> scales;
  std::vector<int32_t> zero_points;  // as many as scales; 0 where the input is omitted

  float scale(int64_t index) const { return scales[scales.size() == 1 ? 0 : index]; }
  int32_t zero_point(int64_t index) const {
    return zero_points[zero_points.size() == 1 ? 0 : index];
  }
  bool per_tensor() const { return scales.size() == 1; }
};
QuantParams ReadQuantParams(const OperatorDesc& op);

// Clip's bounds as CheckClip accepted them: an omitted bound is an infinity. ONNX applies min,
// then max, so min > max gives max everywhere: returned as min == max (oneDNN's clip applies max
// first and would give min).
std::pair<float, float> ClipBounds(const OperatorDesc& op);

// Pad's begin and end amounts per dim (pads input, checked by CheckPad) and its constant.
struct PadSpec {
  std::vector<int64_t> begin, end;
  float value = 0.0f;
};
PadSpec ReadPad(const OperatorDesc& op);

}  // namespace backplane::cpu_acc
