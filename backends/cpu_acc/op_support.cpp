#include "op_support.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>

namespace backplane::cpu_acc {

std::string NodeLabel(const OperatorDesc& op) {
  return op.op_type + " node '" + op.name + "'";
}

Status NodeUnimplemented(const OperatorDesc& op, const std::string& reason) {
  return Unimplemented("CpuAcc: " + NodeLabel(op) + ": " + reason);
}

Status NodeInvalid(const OperatorDesc& op, const std::string& reason) {
  return InvalidArgument("CpuAcc: " + NodeLabel(op) + ": " + reason);
}

bool HasInput(const OperatorDesc& op, std::size_t index) {
  return index < op.inputs.size() && op.inputs[index].type != DataType::kUndefined;
}

bool IsConstant(const OperatorDesc& op, std::size_t index) {
  return index < op.constant_inputs.size() && op.constant_inputs[index] != nullptr;
}

bool IsStatic(const Shape& shape) {
  return std::all_of(shape.begin(), shape.end(), [](int64_t dim) { return dim >= 0; });
}

int64_t IntAttr(const OperatorDesc& op, std::string_view key, int64_t fallback) {
  return op.Attribute<int64_t>(key).value_or(fallback);
}

float FloatAttr(const OperatorDesc& op, std::string_view key, float fallback) {
  return op.Attribute<float>(key).value_or(fallback);
}

std::string StringAttr(const OperatorDesc& op, std::string_view key, std::string fallback) {
  return op.Attribute<std::string>(key).value_or(std::move(fallback));
}

std::vector<int64_t> IntsAttr(const OperatorDesc& op, std::string_view key) {
  return op.Attribute<std::vector<int64_t>>(key).value_or(std::vector<int64_t>{});
}

std::optional<int64_t> NormalizedAxis(int64_t axis, int64_t rank, int64_t extra) {
  const int64_t limit = rank + extra;
  if (axis < -limit || axis >= limit)
    return std::nullopt;
  return axis < 0 ? axis + limit : axis;
}

Status NodeError(const OperatorDesc& op, const Status& status) {
  return {status.code(), "CpuAcc: " + NodeLabel(op) + ": " + std::string(status.message())};
}

Result<Window> ResolveWindow(const OperatorDesc& op, std::span<const int64_t> in,
                             std::span<const int64_t> kernel, op_rules::WindowOp kind) {
  auto attributes = op_rules::ReadWindowAttributes(op.attributes, in.size(), kind);
  if (!attributes.ok())
    return NodeError(op, attributes.error());
  auto dims = op_rules::ResolveWindow(attributes.value(), in, kernel);
  if (!dims.ok())
    return NodeError(op, dims.error());
  Window w;
  for (std::size_t d = 0; d < in.size(); ++d) {
    const op_rules::WindowDim& dim = dims.value()[d];
    if (in[d] < 0 || dim.out < 0)
      return NodeInvalid(op, "the window needs static spatial dims, X has " +
                                 ToString(Shape(in.begin(), in.end())));
    // oneDNN wants out == (in + begin + end' - extent) / stride + 1 (floor): a ceil_mode window
    // that reaches past the ONNX padding needs a larger end'. No overflow: (out - 1) * stride is
    // at most the padded input's span, or with ceil_mode below in + begin (op_rules drops a last
    // window that would start beyond).
    int64_t end = dim.pad_end;
    const int64_t needed = (dim.out - 1) * dim.stride + dim.extent - in[d] - dim.pad_begin;
    if (needed > end) {
      w.ceil_extended = true;
      end = needed;
    }
    w.kernel.push_back(dim.kernel);
    w.strides.push_back(dim.stride);
    w.dilations.push_back(dim.dilation);
    w.pad_begin.push_back(dim.pad_begin);
    w.pad_end.push_back(end);
    w.out.push_back(dim.out);
  }
  return w;
}

namespace {

struct Signature {
  std::size_t min_inputs = 1;
  std::size_t max_inputs = 1;
  std::size_t outputs = 1;
  std::initializer_list<std::string_view> attributes = {};
  std::size_t float_inputs = SIZE_MAX;  // inputs below this index must be FP32
};

Status CheckSignature(const OperatorDesc& op, const Signature& signature) {
  if (op.inputs.size() < signature.min_inputs || op.inputs.size() > signature.max_inputs) {
    return NodeInvalid(op, "has " + std::to_string(op.inputs.size()) + " input(s)");
  }
  if (op.outputs.size() != signature.outputs)
    return NodeInvalid(op, "has " + std::to_string(op.outputs.size()) + " output(s)");
  // Invalid, not merely unsupported: a shape whose element count overflows is no tensor at all,
  // and the next backend must not be offered it either. oneDNN's dims and the compiler's own
  // products (flops, per-map counts) rely on the bound.
  auto bounded = [&](const Shape& shape, const std::string& what) {
    Status status = CheckKnownElementCount(shape, what);
    return status.ok() ? status : NodeInvalid(op, status.message());
  };
  for (std::size_t i = 0; i < op.inputs.size(); ++i)
    BACKPLANE_RETURN_IF_ERROR(bounded(op.inputs[i].shape, "input " + std::to_string(i)));
  for (std::size_t i = 0; i < op.outputs.size(); ++i)
    BACKPLANE_RETURN_IF_ERROR(bounded(op.outputs[i].shape, "output " + std::to_string(i)));
  for (std::size_t i = 0; i < op.inputs.size() && i < signature.float_inputs; ++i) {
    const DataType type = op.inputs[i].type;
    if (type != DataType::kFloat32 && type != DataType::kUndefined) {
      return NodeUnimplemented(op, "CpuAcc runs FP32 only; input " + std::to_string(i) + " is " +
                                       std::string(ToString(type)));
    }
  }
  for (const auto& output : op.outputs) {
    if (output.type != DataType::kFloat32 && output.type != DataType::kUndefined)
      return NodeUnimplemented(
          op, "CpuAcc runs FP32 only; an output is " + std::string(ToString(output.type)));
  }
  for (const auto& [key, value] : op.attributes) {
    const auto& known = signature.attributes;
    if (std::find(known.begin(), known.end(), key) == known.end())
      return NodeUnimplemented(op, "unsupported attribute '" + key + "'");
  }
  // oneDNN has no empty or 13-D tensors; CpuRef takes those.
  for (std::size_t i = 0; i < op.inputs.size(); ++i) {
    if (i >= signature.float_inputs || !HasInput(op, i))
      continue;
    const Shape& shape = op.inputs[i].shape;
    if (shape.size() > kMaxRank)
      return NodeUnimplemented(op, "rank " + std::to_string(shape.size()) + " > 12");
    if (std::find(shape.begin(), shape.end(), 0) != shape.end())
      return NodeUnimplemented(op, "empty tensor " + ToString(shape) + " (oneDNN runs none)");
  }
  for (const auto& output : op.outputs) {
    if (std::find(output.shape.begin(), output.shape.end(), 0) != output.shape.end())
      return NodeUnimplemented(op, "empty output " + ToString(output.shape));
    if (output.shape.size() > kMaxRank)
      return NodeUnimplemented(op, "output rank > 12");
  }
  return Status::Ok();
}

// The window attributes of `op`, checked (op_rules.hpp), and the window checked against X's
// spatial dims and the kernel's as far as they are known (a dynamic dim is checked per request).
Result<op_rules::WindowAttributes> CheckWindow(const OperatorDesc& op, const Shape& x,
                                               op_rules::WindowOp kind,
                                               std::span<const int64_t> kernel = {}) {
  const std::span<const int64_t> spatial = std::span(x).subspan(2);
  auto attributes = op_rules::ReadWindowAttributes(op.attributes, spatial.size(), kind);
  if (!attributes.ok())
    return NodeError(op, attributes.error());
  if (kind == op_rules::WindowOp::kPool)
    kernel = attributes.value().kernel_shape;
  if (kernel.size() == spatial.size()) {
    auto dims = op_rules::ResolveWindow(attributes.value(), spatial, kernel);
    if (!dims.ok())
      return NodeError(op, dims.error());
  }
  return attributes;
}

Status CheckSpatial(const OperatorDesc& op, const Shape& x) {
  if (x.size() < 3)
    return NodeInvalid(op, "X must be N x C x D1 x ... (rank >= 3), is " + ToString(x));
  if (x.size() - 2 > kMaxSpatialRank) {
    return NodeUnimplemented(op, "oneDNN windows take 1 to 3 spatial dims, X is " + ToString(x));
  }
  return Status::Ok();
}

template <bool kMax>
Status CheckPool(const OperatorDesc& op) {
  if (kMax && op.outputs.size() == 2)
    return NodeUnimplemented(op, "the optional second output Indices is not supported");
  if constexpr (kMax) {
    BACKPLANE_RETURN_IF_ERROR(
        CheckSignature(op, {.attributes = {"auto_pad", "ceil_mode", "dilations", "kernel_shape",
                                           "pads", "storage_order", "strides"}}));
  } else {
    BACKPLANE_RETURN_IF_ERROR(
        CheckSignature(op, {.attributes = {"auto_pad", "ceil_mode", "count_include_pad",
                                           "dilations", "kernel_shape", "pads", "strides"}}));
  }
  const Shape& x = op.inputs[0].shape;
  BACKPLANE_RETURN_IF_ERROR(CheckSpatial(op, x));
  auto attributes = CheckWindow(op, x, op_rules::WindowOp::kPool);
  if (!attributes.ok())
    return attributes.error();
  if (!kMax && attributes.value().ceil_mode && IntAttr(op, "count_include_pad", 0) != 0) {
    // ONNX counts the explicit padding only; oneDNN would also count the positions a ceil_mode
    // window reaches beyond it. Fine when ceil_mode adds none.
    if (!IsStatic(x))
      return NodeUnimplemented(op, "ceil_mode=1 with count_include_pad=1 needs static shapes");
    auto window = ResolveWindow(op, std::span(x).subspan(2), attributes.value().kernel_shape,
                                op_rules::WindowOp::kPool);
    if (!window.ok())
      return window.error();
    if (window.value().ceil_extended) {
      return NodeUnimplemented(op,
                               "ceil_mode=1 with count_include_pad=1 where the last window "
                               "passes the padding: oneDNN would count the extra positions");
    }
  }
  return Status::Ok();
}

// Identity, Flatten and Reshape compile to a view of the input's bytes under the output's dims:
// an output with more elements than the input would read past it. Shape inference guarantees
// equal counts; a description from elsewhere is checked (counts are bounded by CheckSignature).
Status CheckSameCount(const OperatorDesc& op) {
  const Shape& in = op.inputs[0].shape;
  const Shape& out = op.outputs[0].shape;
  if (IsStatic(in) && IsStatic(out) && ElementCount(in) != ElementCount(out)) {
    return NodeInvalid(op, "output " + ToString(out) +
                               " does not have the element count of input " + ToString(in));
  }
  return Status::Ok();
}

}  // namespace

Status CheckConv(const OperatorDesc& op) {
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(
      op, {.min_inputs = 2,
           .max_inputs = 3,
           .attributes = {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}}));
  const Shape& x = op.inputs[0].shape;
  const Shape& w = op.inputs[1].shape;
  BACKPLANE_RETURN_IF_ERROR(CheckSpatial(op, x));
  auto window = CheckWindow(op, x, op_rules::WindowOp::kConv);
  if (!window.ok())
    return window.error();
  const int64_t group = IntAttr(op, "group", 1);
  if (group < 1)
    return NodeInvalid(op, "attribute 'group' must be >= 1");
  if (w.size() != x.size())
    return NodeInvalid(op, "W " + ToString(w) + " must have the rank of X " + ToString(x));
  if (!IsStatic(w))
    return NodeUnimplemented(op, "W must have a static shape, is " + ToString(w));
  if (w[0] % group != 0 || (x[1] >= 0 && (x[1] % group != 0 || x[1] / group != w[1])))
    return NodeInvalid(op, "X " + ToString(x) + " and W " + ToString(w) +
                               " do not match group=" + std::to_string(group));
  const auto& kernel_shape = window.value().kernel_shape;
  for (std::size_t d = 0; d < kernel_shape.size(); ++d) {
    if (kernel_shape[d] != w[d + 2])
      return NodeInvalid(op, "kernel_shape does not match W " + ToString(w));
  }
  if (HasInput(op, 2) && (op.inputs[2].shape != Shape{w[0]}))
    return NodeInvalid(op, "B must have shape [M], is " + ToString(op.inputs[2].shape));
  auto resolved = CheckWindow(op, x, op_rules::WindowOp::kConv, std::span(w).subspan(2));
  return resolved.ok() ? Status::Ok() : resolved.error();
}

Status CheckGlobalPool(const OperatorDesc& op) {
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {}));
  return CheckSpatial(op, op.inputs[0].shape);
}

// Add, Sub, Mul, Div with numpy broadcasting of either operand or both. oneDNN's binary
// primitive broadcasts its second operand only; where the first operand broadcasts the compiler
// spreads it to the output's shape first (LowerBinary), so every broadcast ONNX allows runs.
Status CheckBinary(const OperatorDesc& op) {
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.min_inputs = 2, .max_inputs = 2}));
  auto out = op_rules::Broadcast(op.inputs[0].shape, op.inputs[1].shape);
  if (!out.ok())
    return NodeError(op, out.error());
  return Status::Ok();
}

Status CheckUnary(const OperatorDesc& op) {
  return CheckSignature(op, {});
}

Status CheckSoftmax(const OperatorDesc& op) {
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.attributes = {"axis"}}));
  const auto rank = static_cast<int64_t>(op.inputs[0].shape.size());
  if (rank == 0 || !NormalizedAxis(IntAttr(op, "axis", -1), rank))
    return NodeInvalid(op, "axis out of range for rank " + std::to_string(rank));
  return Status::Ok();
}

Status CheckBatchNorm(const OperatorDesc& op) {
  if (IntAttr(op, "training_mode", 0) != 0)
    return NodeUnimplemented(op, "training_mode=1 is not supported (inference only)");
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(
      op,
      {.min_inputs = 5, .max_inputs = 5, .attributes = {"epsilon", "momentum", "training_mode"}}));
  const Shape& x = op.inputs[0].shape;
  if (x.size() < 2)
    return NodeInvalid(op, "X must have rank >= 2, is " + ToString(x));
  if (x.size() > 5)
    return NodeUnimplemented(op,
                             "oneDNN batch normalization takes rank 2 to 5, X is " + ToString(x));
  for (std::size_t i = 1; i < 5; ++i) {
    const Shape& shape = op.inputs[i].shape;
    if (shape.size() != 1 || (x[1] >= 0 && shape[0] != x[1]))
      return NodeInvalid(op, "input " + std::to_string(i) + " must have shape [C]");
  }
  return Status::Ok();
}

Status CheckGemm(const OperatorDesc& op) {
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(
      op, {.min_inputs = 2, .max_inputs = 3, .attributes = {"alpha", "beta", "transA", "transB"}}));
  const Shape& a = op.inputs[0].shape;
  const Shape& b = op.inputs[1].shape;
  if (a.size() != 2 || b.size() != 2)
    return NodeInvalid(op, "A and B must be 2-D");
  const bool ta = IntAttr(op, "transA", 0) != 0, tb = IntAttr(op, "transB", 0) != 0;
  const int64_t k = ta ? a[0] : a[1], kb = tb ? b[1] : b[0];
  if (k >= 0 && kb >= 0 && k != kb)
    return NodeInvalid(op, "inner dimensions differ");
  if (HasInput(op, 2) && op.inputs[2].shape.size() > 2)
    return NodeInvalid(op, "C must have rank <= 2");
  const float alpha = FloatAttr(op, "alpha", 1.0f);
  if (alpha == 0.0f)
    return NodeUnimplemented(op, "alpha=0 (a Gemm that ignores A and B)");
  return Status::Ok();
}

Status CheckMatMul(const OperatorDesc& op) {
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.min_inputs = 2, .max_inputs = 2}));
  const Shape& a = op.inputs[0].shape;
  const Shape& b = op.inputs[1].shape;
  if (a.empty() || b.empty())
    return NodeInvalid(op, "operands must have rank >= 1");
  if (!IsStatic(a) || !IsStatic(b))
    return Status::Ok();
  const int64_t k = a.back();
  const int64_t kb = b.size() == 1 ? b[0] : b[b.size() - 2];
  if (k != kb)
    return NodeInvalid(op, "inner dimensions differ: " + ToString(a) + " and " + ToString(b));
  const Shape a_batch(a.begin(), a.end() - std::min<std::size_t>(a.size(), 2));
  const Shape b_batch(b.begin(), b.end() - std::min<std::size_t>(b.size(), 2));
  if (!op_rules::Broadcast(a_batch, b_batch).ok())
    return NodeInvalid(op, "batch dimensions do not broadcast");
  return Status::Ok();
}

Status CheckMaxPool(const OperatorDesc& op) {
  return CheckPool<true>(op);
}

Status CheckAveragePool(const OperatorDesc& op) {
  return CheckPool<false>(op);
}

Status CheckIdentity(const OperatorDesc& op) {
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {}));
  return CheckSameCount(op);
}

Status CheckFlatten(const OperatorDesc& op) {
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.attributes = {"axis"}}));
  if (!NormalizedAxis(IntAttr(op, "axis", 1), static_cast<int64_t>(op.inputs[0].shape.size()), 1))
    return NodeInvalid(op, "axis out of range");
  return CheckSameCount(op);
}

Status CheckReshape(const OperatorDesc& op) {
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(
      op, {.min_inputs = 2, .max_inputs = 2, .attributes = {"allowzero"}, .float_inputs = 1}));
  if (op.inputs[1].type != DataType::kInt64 || !IsConstant(op, 1))
    return NodeUnimplemented(op, "the shape input must be a constant INT64 tensor");
  return CheckSameCount(op);
}

Status CheckTranspose(const OperatorDesc& op) {
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.attributes = {"perm"}}));
  auto perm = IntsAttr(op, "perm");
  if (op.attributes.contains("perm")) {
    std::sort(perm.begin(), perm.end());
    for (std::size_t i = 0; i < perm.size(); ++i) {
      if (perm[i] != static_cast<int64_t>(i) || perm.size() != op.inputs[0].shape.size())
        return NodeInvalid(op, "perm is not a permutation of the input dims");
    }
  }
  return Status::Ok();
}

Status CheckConcat(const OperatorDesc& op) {
  BACKPLANE_RETURN_IF_ERROR(
      CheckSignature(op, {.min_inputs = 1, .max_inputs = SIZE_MAX, .attributes = {"axis"}}));
  if (!op.attributes.contains("axis"))
    return NodeInvalid(op, "attribute 'axis' is required");
  const auto rank = static_cast<int64_t>(op.inputs[0].shape.size());
  if (rank == 0 || !NormalizedAxis(IntAttr(op, "axis", 0), rank))
    return NodeInvalid(op, "axis out of range");
  for (const auto& input : op.inputs) {
    if (input.shape.size() != op.inputs[0].shape.size())
      return NodeInvalid(op, "inputs have different ranks");
  }
  return Status::Ok();
}

Status CheckLeakyRelu(const OperatorDesc& op) {
  return CheckSignature(op, {.attributes = {"alpha"}});
}

Status CheckHardSigmoid(const OperatorDesc& op) {
  return CheckSignature(op, {.attributes = {"alpha", "beta"}});
}

Status CheckClip(const OperatorDesc& op) {
  // Clip-6's attribute form would otherwise be refused as "unsupported attribute": say what it is.
  for (std::string_view key : {"min", "max"}) {
    if (op.attributes.contains(key)) {
      return NodeUnimplemented(op, "attribute '" + std::string(key) +
                                       "' is Clip-6's; from opset 11 the bounds are inputs");
    }
  }
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.min_inputs = 1, .max_inputs = 3}));
  for (std::size_t index : {1, 2}) {
    if (!HasInput(op, index))
      continue;
    const std::string what =
        (index == 1 ? "min" : "max") + std::string(" (input ") + std::to_string(index) + ")";
    if (!IsConstant(op, index)) {
      return NodeUnimplemented(
          op, what + " must be a constant: CpuAcc builds the clip into the primitive at load");
    }
    const Shape& shape = op.inputs[index].shape;
    if (!std::all_of(shape.begin(), shape.end(), [](int64_t dim) { return dim == 1; }))
      return NodeInvalid(op, what + " must be a scalar, has shape " + ToString(shape));
  }
  return Status::Ok();
}

std::pair<float, float> ClipBounds(const OperatorDesc& op) {
  auto bound = [&](std::size_t index, float fallback) {
    return HasInput(op, index) ? *static_cast<const float*>(op.constant_inputs[index]) : fallback;
  };
  const float max = bound(2, std::numeric_limits<float>::infinity());
  const float min = std::min(bound(1, -std::numeric_limits<float>::infinity()), max);
  return {min, max};
}

Status CheckDropout(const OperatorDesc& op) {
  // Training and the mask first, so that a training graph hears why rather than "2 outputs".
  if (HasInput(op, 2)) {
    const TensorInfo& training = op.inputs[2];
    if (training.type != DataType::kBool || !IsConstant(op, 2) ||
        ElementCount(training.shape) != 1) {
      return NodeUnimplemented(op,
                               "training_mode (input 2) must be absent or a constant BOOL "
                               "scalar: CpuAcc runs inference only");
    }
    if (*static_cast<const uint8_t*>(op.constant_inputs[2]) != 0)
      return NodeUnimplemented(op, "training_mode is true: CpuAcc runs inference only");
  }
  if (op.outputs.size() > 1) {
    return NodeUnimplemented(op,
                             "the mask output (output 1) is a BOOL tensor, which CpuAcc does not "
                             "produce (nor does CpuRef)");
  }
  // The ratio (input 1) and seed only matter when training: accepted and unused.
  return CheckSignature(
      op, {.min_inputs = 1, .max_inputs = 3, .attributes = {"seed"}, .float_inputs = 2});
}

Status CheckPad(const OperatorDesc& op) {
  const std::string mode = StringAttr(op, "mode", "constant");
  const auto parsed = op_rules::ParsePadMode(mode);
  if (!parsed)
    return NodeInvalid(op, "unknown mode '" + mode + "' (ONNX has constant, reflect, edge, wrap)");
  if (*parsed != op_rules::PadMode::kConstant)
    return NodeUnimplemented(op, "mode '" + mode + "' is not supported (only 'constant')");
  if (HasInput(op, 3))
    return NodeUnimplemented(op, "the axes input (input 3) is not supported");
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(
      op, {.min_inputs = 2, .max_inputs = 4, .attributes = {"mode"}, .float_inputs = 1}));
  const TensorInfo& pads = op.inputs[1];
  if (pads.type != DataType::kInt64 || pads.shape.size() != 1 || !IsConstant(op, 1))
    return NodeUnimplemented(op, "pads (input 1) must be a constant 1-D INT64 tensor");
  const auto* data = static_cast<const int64_t*>(op.constant_inputs[1]);
  const std::span<const int64_t> values(data, static_cast<std::size_t>(pads.shape[0]));
  auto shape = op_rules::PaddedShape(op.inputs[0].shape, values);
  if (!shape.ok())
    return NodeError(op, shape.error());
  if (std::any_of(values.begin(), values.end(), [](int64_t pad) { return pad < 0; })) {
    return NodeUnimplemented(op,
                             "negative pads (cropping) are not supported: CpuAcc writes the "
                             "input into a larger buffer");
  }
  if (HasInput(op, 2)) {
    const TensorInfo& value = op.inputs[2];
    if (value.type != DataType::kFloat32 || ElementCount(value.shape) != 1 || !IsConstant(op, 2))
      return NodeUnimplemented(op, "constant_value (input 2) must be a constant FP32 scalar");
  }
  return Status::Ok();
}

PadSpec ReadPad(const OperatorDesc& op) {
  const auto* data = static_cast<const int64_t*>(op.constant_inputs[1]);
  const std::size_t rank = op.inputs[0].shape.size();
  PadSpec spec;
  spec.begin.assign(data, data + rank);
  spec.end.assign(data + rank, data + 2 * rank);
  if (HasInput(op, 2))
    spec.value = *static_cast<const float*>(op.constant_inputs[2]);
  return spec;
}

}  // namespace backplane::cpu_acc

namespace backplane::cpu_acc {
namespace {

int32_t ZeroPointAt(const OperatorDesc& op, DataType type, std::size_t index) {
  if (!HasInput(op, 2))
    return 0;
  const void* data = op.constant_inputs[2];
  switch (type) {
    case DataType::kUint8:
      return static_cast<const uint8_t*>(data)[index];
    case DataType::kInt8:
      return static_cast<const int8_t*>(data)[index];
    default:
      return static_cast<const int32_t*>(data)[index];
  }
}

// What QuantizeLinear and DequantizeLinear share: constant scales (positive, finite) and zero
// points of the quantized type, one or one per index of `axis`.
Status CheckQuantParams(const OperatorDesc& op, DataType quantized) {
  if (op.inputs.size() < 2 || op.inputs.size() > 3)
    return NodeInvalid(op, "has " + std::to_string(op.inputs.size()) + " input(s)");
  if (op.outputs.size() != 1)
    return NodeInvalid(op, "has " + std::to_string(op.outputs.size()) + " output(s)");
  for (const auto& [key, value] : op.attributes) {
    if (key != "axis")
      return NodeUnimplemented(op, "unsupported attribute '" + key + "'");
  }
  const Shape& x = op.inputs[0].shape;
  if (x.size() > kMaxRank || std::find(x.begin(), x.end(), 0) != x.end())
    return NodeUnimplemented(op, "CpuAcc quantizes non-empty tensors of rank <= 12");
  if (op.inputs[1].type != DataType::kFloat32 || !IsConstant(op, 1))
    return NodeUnimplemented(op, "the scale must be a FP32 constant");
  const int64_t count = ElementCount(op.inputs[1].shape);
  if (op.inputs[1].shape.size() > 1 || count < 1)
    return NodeInvalid(op, "the scale must be a scalar or 1-D");
  if (HasInput(op, 2)) {
    if (!IsConstant(op, 2) || op.inputs[2].type != quantized ||
        ElementCount(op.inputs[2].shape) != count)
      return NodeUnimplemented(op, "the zero point must be a constant like the scale, of type " +
                                       std::string(ToString(quantized)));
  }
  if (count > 1 || op.inputs[1].shape.size() == 1) {
    const auto axis = NormalizedAxis(IntAttr(op, "axis", 1), static_cast<int64_t>(x.size()));
    if (!axis || (count > 1 && x[*axis] >= 0 && x[*axis] != count))
      return NodeInvalid(op, "per-axis scales of length " + std::to_string(count) +
                                 " do not match X " + ToString(x));
  }
  const auto* scales = static_cast<const float*>(op.constant_inputs[1]);
  for (int64_t k = 0; k < count; ++k) {
    if (!(scales[k] > 0.0f) || !std::isfinite(scales[k]))
      return NodeInvalid(op, "scale " + std::to_string(scales[k]) + " is not positive and finite");
  }
  return Status::Ok();
}

}  // namespace

QuantParams ReadQuantParams(const OperatorDesc& op) {
  QuantParams params;
  params.type = op.op_type == "QuantizeLinear"
                    ? (HasInput(op, 2) ? op.inputs[2].type : DataType::kUint8)
                    : op.inputs[0].type;
  const auto* scales = static_cast<const float*>(op.constant_inputs[1]);
  const auto count = static_cast<std::size_t>(ElementCount(op.inputs[1].shape));
  params.scales.assign(scales, scales + count);
  for (std::size_t k = 0; k < count; ++k)
    params.zero_points.push_back(ZeroPointAt(op, params.type, k));
  if (count > 1) {
    params.axis =
        *NormalizedAxis(IntAttr(op, "axis", 1), static_cast<int64_t>(op.inputs[0].shape.size()));
  }
  return params;
}

// Per tensor only: oneDNN's reorder takes one zero point per tensor (CpuRef runs per-axis ones).
Status CheckQuantizeLinear(const OperatorDesc& op) {
  if (op.inputs.empty() || op.inputs[0].type != DataType::kFloat32)
    return NodeUnimplemented(op, "X must be FP32");
  const DataType quantized = HasInput(op, 2) ? op.inputs[2].type : DataType::kUint8;
  if (quantized != DataType::kUint8 && quantized != DataType::kInt8)
    return NodeUnimplemented(
        op, "CpuAcc quantizes to UINT8 or INT8 only, not " + std::string(ToString(quantized)));
  BACKPLANE_RETURN_IF_ERROR(CheckQuantParams(op, quantized));
  if (ElementCount(op.inputs[1].shape) != 1)
    return NodeUnimplemented(op, "per-axis QuantizeLinear (CpuAcc quantizes per tensor)");
  return Status::Ok();
}

// Activations (UINT8/INT8, per tensor) and constants: INT8 weights with zero point 0 (what the
// int8 convolutions and matrix products take), INT32 biases. A constant CpuAcc could only run in
// float is refused, so that the layer, and the weights' consumer's int8 pattern, is CpuRef's.
Status CheckDequantizeLinear(const OperatorDesc& op) {
  if (op.inputs.empty())
    return NodeInvalid(op, "has no input");
  const DataType type = op.inputs[0].type;
  if (type != DataType::kUint8 && type != DataType::kInt8 && type != DataType::kInt32)
    return NodeUnimplemented(
        op, "CpuAcc dequantizes UINT8, INT8 or INT32, not " + std::string(ToString(type)));
  BACKPLANE_RETURN_IF_ERROR(CheckQuantParams(op, type));
  if (op.outputs[0].type != DataType::kFloat32)
    return NodeInvalid(op, "Y must be FP32");
  const QuantParams params = ReadQuantParams(op);
  if (IsConstant(op, 0)) {
    if (type == DataType::kUint8) {
      return NodeUnimplemented(op,
                               "UINT8 constant (weights): oneDNN's int8 kernels take INT8 "
                               "weights");
    }
    for (std::size_t k = 0; k < params.zero_points.size(); ++k) {
      if (params.zero_points[k] != 0) {
        return NodeUnimplemented(
            op, "constant with zero point " + std::to_string(params.zero_points[k]) + " at " +
                    std::to_string(k) +
                    ": oneDNN's int8 kernels take weights (and biases) with zero point 0");
      }
    }
    return Status::Ok();
  }
  if (type == DataType::kInt32)
    return NodeUnimplemented(op, "INT32 X that is not a constant (a bias is one)");
  if (!params.per_tensor())
    return NodeUnimplemented(op, "per-axis DequantizeLinear of an activation (CpuAcc: per tensor)");
  return Status::Ok();
}

}  // namespace backplane::cpu_acc
