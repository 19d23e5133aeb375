#include "op_support.hpp"

#include <algorithm>
#include <initializer_list>

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

std::optional<Shape> Broadcast(const Shape& a, const Shape& b) {
  const std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::optional<std::string> ResolveWindow(const OperatorDesc& op, std::span<const int64_t> in,
                                         std::span<const int64_t> kernel, bool ceil_mode,
                                         Window* w) {
  const std::size_t rank = in.size();
  const std::string auto_pad = StringAttr(op, "auto_pad", "NOTSET");
  const auto strides = IntsAttr(op, "strides");
  const auto dilations = IntsAttr(op, "dilations");
  const auto pads = IntsAttr(op, "pads");
  *w = Window{};
  for (std::size_t d = 0; d < rank; ++d) {
    const int64_t k = kernel[d];
    const int64_t stride = strides.empty() ? 1 : strides[d];
    const int64_t dilation = dilations.empty() ? 1 : dilations[d];
    // Attributes may hold anything up to INT64_MAX: sums and products of them are bounded (core's
    // rule on dimension arithmetic), and ceiling divisions avoid a + stride - 1.
    auto where = [d] { return " in spatial dim " + std::to_string(d); };
    if (k < 1)
      return "the kernel size " + std::to_string(k) + " is not positive" + where();
    const auto stretched = BoundedMul(k - 1, dilation);
    const auto bounded_extent = stretched ? BoundedAdd(*stretched, 1) : std::nullopt;
    if (!bounded_extent)
      return "the window extent (kernel - 1) x dilation + 1 overflows the limit of 2^40" + where();
    const int64_t extent = *bounded_extent;
    int64_t begin = 0, end = 0;
    if (auto_pad == "NOTSET") {
      if (!pads.empty()) {
        begin = pads[d];
        end = pads[d + rank];
      }
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const int64_t windows = in[d] == 0 ? 0 : (in[d] - 1) / stride + 1;
      const int64_t total = std::max<int64_t>(0, (windows - 1) * stride + extent - in[d]);
      begin = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      end = total - begin;
    }
    const auto padded_begin = BoundedAdd(in[d], begin);
    const auto padded = padded_begin ? BoundedAdd(*padded_begin, end) : std::nullopt;
    if (!padded)
      return "the padded input (input + pads) overflows the limit of 2^40" + where();
    const int64_t span = *padded - extent;
    if (span < 0) {
      return "the window (extent " + std::to_string(extent) +
             ") is larger than the padded input (" + std::to_string(*padded) + ")" + where();
    }
    // `needed` below cannot overflow even for a stride near INT64_MAX: (out - 1) * stride is at
    // most span, or with ceil_mode below in + begin after the step that drops the last window.
    int64_t out = (ceil_mode ? (span == 0 ? 0 : (span - 1) / stride + 1) : span / stride) + 1;
    if (ceil_mode && (out - 1) * stride >= in[d] + begin)
      --out;  // the last window would start in the end padding
    // oneDNN wants out == (in + begin + end' - extent) / stride + 1 (floor): a ceil_mode window
    // that reaches past the ONNX padding needs a larger end'.
    const int64_t needed = (out - 1) * stride + extent - in[d] - begin;
    if (needed > end) {
      w->ceil_extended = true;
      end = needed;
    }
    w->kernel.push_back(k);
    w->strides.push_back(stride);
    w->dilations.push_back(dilation);
    w->pad_begin.push_back(begin);
    w->pad_end.push_back(end);
    w->out.push_back(out);
  }
  return std::nullopt;
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

Status CheckWindowAttributes(const OperatorDesc& op, std::size_t spatial_rank, bool is_pool) {
  const std::string auto_pad = StringAttr(op, "auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" &&
      auto_pad != "VALID") {
    return NodeUnimplemented(op, "unsupported auto_pad value '" + auto_pad + "'");
  }
  const std::pair<const char*, std::size_t> lists[] = {{"kernel_shape", spatial_rank},
                                                       {"strides", spatial_rank},
                                                       {"dilations", spatial_rank},
                                                       {"pads", 2 * spatial_rank}};
  for (const auto& [name, length] : lists) {
    auto it = op.attributes.find(std::string_view(name));
    if (it == op.attributes.end())
      continue;
    const auto* values = std::get_if<std::vector<int64_t>>(&it->second);
    if (values == nullptr || values->size() != length)
      return NodeInvalid(
          op, "attribute '" + std::string(name) + "' needs " + std::to_string(length) + " ints");
    const int64_t minimum = std::string_view(name) == "pads" ? 0 : 1;
    for (int64_t v : *values) {
      if (v < minimum)
        return NodeInvalid(op,
                           "attribute '" + std::string(name) + "' has value " + std::to_string(v));
    }
  }
  if (auto_pad != "NOTSET") {
    const auto pads = IntsAttr(op, "pads");
    if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; }))
      return NodeInvalid(op, "attribute 'pads' cannot be used with auto_pad=" + auto_pad);
  }
  if (is_pool && IntsAttr(op, "kernel_shape").empty())
    return NodeInvalid(op, "attribute 'kernel_shape' is required");
  // A window's taps are a product of dimensions like a tensor's elements, and bounded the same.
  if (!BoundedDimProduct(IntsAttr(op, "kernel_shape"))) {
    return NodeInvalid(op, "the kernel window " + ToString(IntsAttr(op, "kernel_shape")) +
                               " (the product of kernel_shape) overflows the limit of 2^40");
  }
  return Status::Ok();
}

Status CheckSpatial(const OperatorDesc& op, const Shape& x) {
  if (x.size() < 3)
    return NodeInvalid(op, "X must be N x C x D1 x ... (rank >= 3), is " + ToString(x));
  if (x.size() - 2 > kMaxSpatialRank) {
    return NodeUnimplemented(op, "oneDNN windows take 1 to 3 spatial dims, X is " + ToString(x));
  }
  return Status::Ok();
}

Status CheckConv(const OperatorDesc& op) {
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(
      op, {.min_inputs = 2,
           .max_inputs = 3,
           .attributes = {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}}));
  const Shape& x = op.inputs[0].shape;
  const Shape& w = op.inputs[1].shape;
  BACKPLANE_RETURN_IF_ERROR(CheckSpatial(op, x));
  BACKPLANE_RETURN_IF_ERROR(CheckWindowAttributes(op, x.size() - 2, false));
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
  const auto kernel_shape = IntsAttr(op, "kernel_shape");
  for (std::size_t d = 0; d < kernel_shape.size(); ++d) {
    if (kernel_shape[d] != w[d + 2])
      return NodeInvalid(op, "kernel_shape does not match W " + ToString(w));
  }
  if (HasInput(op, 2) && (op.inputs[2].shape != Shape{w[0]}))
    return NodeInvalid(op, "B must have shape [M], is " + ToString(op.inputs[2].shape));
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
  BACKPLANE_RETURN_IF_ERROR(CheckWindowAttributes(op, x.size() - 2, true));
  const bool ceil_mode = IntAttr(op, "ceil_mode", 0) != 0;
  if (!kMax && ceil_mode && IntAttr(op, "count_include_pad", 0) != 0) {
    // ONNX counts the explicit padding only; oneDNN would also count the positions a ceil_mode
    // window reaches beyond it. Fine when ceil_mode adds none.
    if (!IsStatic(x))
      return NodeUnimplemented(op, "ceil_mode=1 with count_include_pad=1 needs static shapes");
    Window window;
    const auto kernel = IntsAttr(op, "kernel_shape");
    if (auto error = ResolveWindow(op, std::span(x).subspan(2), kernel, true, &window))
      return NodeInvalid(op, *error);
    if (window.ceil_extended) {
      return NodeUnimplemented(op,
                               "ceil_mode=1 with count_include_pad=1 where the last window "
                               "passes the padding: oneDNN would count the extra positions");
    }
  }
  return Status::Ok();
}

Status CheckGlobalPool(const OperatorDesc& op) {
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {}));
  return CheckSpatial(op, op.inputs[0].shape);
}

Status CheckBinary(const OperatorDesc& op) {
  BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.min_inputs = 2, .max_inputs = 2}));
  const Shape& a = op.inputs[0].shape;
  const Shape& b = op.inputs[1].shape;
  if (!IsStatic(a) || !IsStatic(b))
    return Status::Ok();  // checked per shape when a request fixes them
  auto out = Broadcast(a, b);
  if (!out)
    return NodeInvalid(op, "shapes " + ToString(a) + " and " + ToString(b) + " do not broadcast");
  if (ElementCount(a) != ElementCount(*out) && ElementCount(b) != ElementCount(*out)) {
    return NodeUnimplemented(op, "both operands " + ToString(a) + " and " + ToString(b) +
                                     " broadcast (oneDNN broadcasts the second only)");
  }
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
  if (!Broadcast(a_batch, b_batch))
    return NodeInvalid(op, "batch dimensions do not broadcast");
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

Status CheckLayout(const OperatorDesc& op) {
  if (op.op_type == "Identity") {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {}));
    return CheckSameCount(op);
  }
  if (op.op_type == "Flatten") {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.attributes = {"axis"}}));
    if (!NormalizedAxis(IntAttr(op, "axis", 1), static_cast<int64_t>(op.inputs[0].shape.size()), 1))
      return NodeInvalid(op, "axis out of range");
    return CheckSameCount(op);
  }
  if (op.op_type == "Reshape") {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(
        op, {.min_inputs = 2, .max_inputs = 2, .attributes = {"allowzero"}, .float_inputs = 1}));
    if (op.inputs[1].type != DataType::kInt64 || !IsConstant(op, 1))
      return NodeUnimplemented(op, "the shape input must be a constant INT64 tensor");
    return CheckSameCount(op);
  }
  if (op.op_type == "Transpose") {
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
  // Concat
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

}  // namespace

Status CheckOp(const OperatorDesc& op) {
  const std::string& type = op.op_type;
  if (type == "Conv")
    return CheckConv(op);
  if (type == "MaxPool")
    return CheckPool<true>(op);
  if (type == "AveragePool")
    return CheckPool<false>(op);
  if (type == "GlobalAveragePool" || type == "GlobalMaxPool")
    return CheckGlobalPool(op);
  if (type == "Add" || type == "Mul")
    return CheckBinary(op);
  if (type == "Relu" || type == "Sigmoid" || type == "Tanh")
    return CheckUnary(op);
  if (type == "Softmax")
    return CheckSoftmax(op);
  if (type == "BatchNormalization")
    return CheckBatchNorm(op);
  if (type == "Gemm")
    return CheckGemm(op);
  if (type == "MatMul")
    return CheckMatMul(op);
  if (type == "Identity" || type == "Flatten" || type == "Reshape" || type == "Transpose" ||
      type == "Concat")
    return CheckLayout(op);
  if (type == "Constant")
    return NodeUnimplemented(op, "Constant is not a backend op: the host folds it");
  return Unimplemented("CpuAcc does not implement op " + type + " (node '" + op.name + "')");
}

}  // namespace backplane::cpu_acc
