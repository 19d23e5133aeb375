// QuantizeLinear and DequantizeLinear (ONNX 10-25, without blocked quantization), per tensor and
// per axis:
//   QuantizeLinear   y = saturate(round_half_to_even(x / scale) + zero_point)
//   DequantizeLinear y = (x - zero_point) * scale
// Scale and zero point are read from the views at every run, so they may be constants or values
// computed by the network; the host checked at import that a constant scale is finite and > 0.
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernel_support.hpp"

namespace backplane::cpu_ref {
namespace {

// ONNX's rounding, written out rather than left to the FPU's current mode (std::nearbyint obeys
// fesetround, which a host may have changed).
double RoundHalfToEven(double value) {
  const double floor = std::floor(value);
  const double fraction = value - floor;
  if (fraction > 0.5)
    return floor + 1;
  if (fraction < 0.5)
    return floor;
  return std::fmod(floor, 2.0) == 0 ? floor : floor + 1;
}

template <typename Q>
Q Saturate(double value) {
  // NaN has no quantized value; ONNX leaves it undefined, and a cast of NaN to an integer is
  // undefined behaviour in C++. Zero keeps the answer deterministic.
  if (std::isnan(value))
    return 0;
  const double low = std::numeric_limits<Q>::min();
  const double high = std::numeric_limits<Q>::max();
  return static_cast<Q>(value < low ? low : value > high ? high : value);
}

bool IsQuantizedType(DataType type) {
  return type == DataType::kUint8 || type == DataType::kInt8;
}

// The layout shared by both operators: element i of x uses scale and zero point number
// (i / inner) % channels, where channels is 1 per tensor.
struct Channels {
  int64_t channels = 1;
  int64_t inner = 1;
};

class QuantizationWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    bool quantize = true;
    int64_t axis = 1;  // as given (may be negative): resolved against each request's rank
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    const bool quantize = op.op_type == "QuantizeLinear";
    // Not CheckSignature: its FP32 rule does not fit an operator whose very job is other types,
    // checked one by one below.
    BACKPLANE_RETURN_IF_ERROR(CheckCountsAndAttributes(op));
    auto axis = IntAttribute(op, "axis", 1);
    if (!axis.ok())
      return axis.error();
    auto block_size = IntAttribute(op, "block_size", 0);
    if (!block_size.ok())
      return block_size.error();
    if (*block_size != 0)
      return NodeUnimplemented(op, "blocked quantization (block_size != 0) is not supported");

    const DataType x = op.inputs[0].type;
    const DataType y = op.outputs[0].type;
    const bool has_zero_point = HasInput(op, 2);
    const DataType zero_point = has_zero_point ? op.inputs[2].type : DataType::kUndefined;
    if (quantize) {
      if (x != DataType::kFloat32 || !IsQuantizedType(y) || (has_zero_point && zero_point != y))
        return NodeUnimplemented(
            op, "CpuRef quantizes FP32 to UINT8 or INT8 (the zero point's type); got " +
                    std::string(ToString(x)) + " to " + std::string(ToString(y)) +
                    (has_zero_point ? " with a zero point of " + std::string(ToString(zero_point))
                                    : ""));
    } else {
      const bool x_supported = IsQuantizedType(x) || x == DataType::kInt32;
      if (!x_supported || y != DataType::kFloat32 || (has_zero_point && zero_point != x))
        return NodeUnimplemented(
            op,
            "CpuRef dequantizes UINT8, INT8 or INT32 (with a zero point of that type) to "
            "FP32; got " +
                std::string(ToString(x)) + " to " + std::string(ToString(y)) +
                (has_zero_point ? " with a zero point of " + std::string(ToString(zero_point))
                                : ""));
    }
    if (op.inputs[1].type != DataType::kFloat32)
      return NodeUnimplemented(
          op, "the scale must be FP32, is " + std::string(ToString(op.inputs[1].type)));
    const Shape& scale = op.inputs[1].shape;
    if (scale.size() > 1)
      return NodeUnimplemented(op,
                               "the scale must be a scalar or 1-D, has shape " + ToString(scale));
    if (has_zero_point && op.inputs[2].shape != scale)
      return NodeInvalid(op, "the zero point " + ToString(op.inputs[2].shape) + " and the scale " +
                                 ToString(scale) + " must have the same shape");
    if (op.inputs[0].shape != op.outputs[0].shape)
      return NodeInvalid(op, "the output " + ToString(op.outputs[0].shape) +
                                 " must have the input's shape " + ToString(op.inputs[0].shape));
    if (IsPerAxis(scale)) {
      auto resolved = NormalizeAxis(op, *axis, static_cast<int64_t>(op.inputs[0].shape.size()));
      if (!resolved.ok())
        return resolved.error();
      if (DimsConflict(scale[0], op.inputs[0].shape[*resolved]))
        return NodeInvalid(op, "the per-axis scale " + ToString(scale) +
                                   " does not match dimension " + std::to_string(*resolved) +
                                   " of the input " + ToString(op.inputs[0].shape));
    }
    return Params{NodeLabel(op), quantize, *axis};
  }

  explicit QuantizationWorkload(Params params)
      : WorkloadBase(std::move(params.label), 2, 3, 1),
        quantize_(params.quantize),
        axis_(params.axis) {}

 private:
  // A 1-D scale of one element applies to the whole tensor, as ONNX's reference broadcasts it.
  static bool IsPerAxis(const Shape& scale) { return scale.size() == 1 && scale[0] != 1; }

  // CheckSignature's counts, shape bounds and attribute names, without its FP32 rule.
  static Status CheckCountsAndAttributes(const OperatorDesc& op) {
    if (op.inputs.size() < 2 || op.inputs.size() > 3)
      return NodeInvalid(op, "needs 2 to 3 input(s), has " + std::to_string(op.inputs.size()));
    if (op.outputs.size() != 1)
      return NodeInvalid(op, "needs 1 output(s), has " + std::to_string(op.outputs.size()));
    BACKPLANE_RETURN_IF_ERROR(CheckShapeBounds(op));
    for (const auto& [key, value] : op.attributes) {
      if (key != "axis" && key != "saturate" && key != "block_size")
        return NodeUnimplemented(op, "unsupported attribute '" + key + "'");
    }
    return Status::Ok();
  }

  Result<Channels> Layout(const Shape& x, const Shape& scale) const {
    if (scale.size() > 1)
      return Invalid("the scale has shape " + ToString(scale) + ", expected a scalar or 1-D");
    if (!IsPerAxis(scale))
      return Channels{};  // one element: a scalar or [1]
    const auto rank = static_cast<int64_t>(x.size());
    if (axis_ < -rank || axis_ >= rank)
      return Invalid("axis " + std::to_string(axis_) + " is out of range for rank " +
                     std::to_string(rank));
    const auto axis = static_cast<std::size_t>(axis_ < 0 ? axis_ + rank : axis_);
    if (x[axis] != scale[0])
      return Invalid("the per-axis scale " + ToString(scale) + " does not match dimension " +
                     std::to_string(axis) + " of the input " + ToString(x));
    Channels layout{scale[0], 1};
    for (std::size_t d = axis + 1; d < x.size(); ++d)
      layout.inner *= x[d];
    return layout;
  }

  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const ConstTensorView& x = inputs[0];
    const ConstTensorView& scale = inputs[1];
    const ConstTensorView* zero_point =
        inputs.size() > 2 && inputs[2].info.type != DataType::kUndefined ? &inputs[2] : nullptr;
    if (zero_point != nullptr && zero_point->info.shape != scale.info.shape)
      return Invalid("the zero point " + ToString(zero_point->info.shape) + " and the scale " +
                     ToString(scale.info.shape) + " must have the same shape");
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], x.info.shape));
    auto layout = Layout(x.info.shape, scale.info.shape);
    if (!layout.ok())
      return layout.error();
    if (quantize_) {
      if (outputs[0].info.type == DataType::kUint8)
        return Quantize<uint8_t>(x, scale, zero_point, outputs[0], *layout);
      return Quantize<int8_t>(x, scale, zero_point, outputs[0], *layout);
    }
    switch (x.info.type) {
      case DataType::kUint8:
        return Dequantize<uint8_t>(x, scale, zero_point, outputs[0], *layout);
      case DataType::kInt8:
        return Dequantize<int8_t>(x, scale, zero_point, outputs[0], *layout);
      default:
        return Dequantize<int32_t>(x, scale, zero_point, outputs[0], *layout);
    }
  }

  // Zero point number `channel`, or 0 when the input is omitted.
  template <typename Q>
  static double ZeroPoint(const ConstTensorView* zero_point, int64_t channel) {
    return zero_point == nullptr ? 0.0 : zero_point->Elements<Q>()[channel];
  }

  template <typename Q>
  static Status Quantize(const ConstTensorView& x, const ConstTensorView& scale,
                         const ConstTensorView* zero_point, const TensorView& y,
                         const Channels& layout) {
    const auto in = x.Elements<float>();
    const auto scales = scale.Elements<float>();
    const auto out = y.Elements<Q>();
    for (std::size_t i = 0; i < out.size(); ++i) {
      const int64_t channel = (static_cast<int64_t>(i) / layout.inner) % layout.channels;
      // The division in FP32, as ONNX's reference computes it: a quotient that lands on .5 in
      // float must round as that tie.
      const float quotient = in[i] / scales[channel];
      out[i] = Saturate<Q>(RoundHalfToEven(quotient) + ZeroPoint<Q>(zero_point, channel));
    }
    return Status::Ok();
  }

  template <typename Q>
  static Status Dequantize(const ConstTensorView& x, const ConstTensorView& scale,
                           const ConstTensorView* zero_point, const TensorView& y,
                           const Channels& layout) {
    const auto in = x.Elements<Q>();
    const auto scales = scale.Elements<float>();
    const auto out = y.Elements<float>();
    for (std::size_t i = 0; i < out.size(); ++i) {
      const int64_t channel = (static_cast<int64_t>(i) / layout.inner) % layout.channels;
      // In FP32, as ONNX's reference computes it (exact for 8-bit values; INT32 rounds as there).
      const float difference =
          static_cast<float>(in[i]) - static_cast<float>(ZeroPoint<Q>(zero_point, channel));
      out[i] = difference * scales[channel];
    }
    return Status::Ok();
  }

  const bool quantize_;
  const int64_t axis_;
};

constexpr KernelEntry kQuantizeKernels[] = {
    {"QuantizeLinear", CheckKernel<QuantizationWorkload>, CreateKernel<QuantizationWorkload>},
    {"DequantizeLinear", CheckKernel<QuantizationWorkload>, CreateKernel<QuantizationWorkload>},
};

}  // namespace

std::span<const KernelEntry> QuantizeKernels() {
  return kQuantizeKernels;
}

}  // namespace backplane::cpu_ref
