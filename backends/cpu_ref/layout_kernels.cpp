// Identity, Flatten, Reshape (byte copies under a new shape), Transpose, Concat and Pad
// (constant mode).
#include <algorithm>
#include <cstring>

#include "kernel_support.hpp"

namespace backplane::cpu_ref {
namespace {

void CopyBytes(void* to, const void* from, std::size_t bytes) {
  if (bytes > 0)  // the views of empty tensors may hold null
    std::memcpy(to, from, bytes);
}

std::size_t FloatBytes(const Shape& shape) {
  return static_cast<std::size_t>(ElementCount(shape)) * sizeof(float);
}

// Inputs [0, count) all of one type of kAnyType (Concat's, Identity's data).
Status CheckOneType(const OperatorDesc& op, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, i, kAnyType));
    if (op.inputs[i].type != op.inputs[0].type) {
      return NodeInvalid(op, "input " + std::to_string(i) + " is " +
                                 std::string(ToString(op.inputs[i].type)) + ", input 0 is " +
                                 std::string(ToString(op.inputs[0].type)));
    }
  }
  return Status::Ok();
}

// ---- Identity -------------------------------------------------------------------------------

class IdentityWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.typed = true}));
    BACKPLANE_RETURN_IF_ERROR(CheckOneType(op, 1));
    return Params{NodeLabel(op)};
  }

  explicit IdentityWorkload(Params params) : WorkloadBase(std::move(params.label), 1, 1, 1) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], inputs[0].info.shape));
    CopyBytes(outputs[0].data, inputs[0].data, inputs[0].info.ByteSize());
    return Status::Ok();
  }
};

// ---- Flatten --------------------------------------------------------------------------------

Shape FlattenShape(const Shape& in, int64_t axis) {
  Shape out{1, 1};
  for (std::size_t i = 0; i < in.size(); ++i)
    out[static_cast<int64_t>(i) < axis ? 0 : 1] *= in[i];
  return out;
}

class FlattenWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    int64_t axis;  // as given; may be negative
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.attributes = {"axis"}}));
    auto axis = IntAttribute(op, "axis", 1);
    if (!axis.ok())
      return axis.error();
    // Flatten's axis ranges over [-r, r]: axis = r flattens everything into the first dim.
    BACKPLANE_RETURN_IF_ERROR(StatusOf(
        NormalizeAxis(op, axis.value(), static_cast<int64_t>(op.inputs[0].shape.size()), 1)));
    return Params{NodeLabel(op), axis.value()};
  }

  explicit FlattenWorkload(Params params)
      : WorkloadBase(std::move(params.label), 1, 1, 1), axis_(params.axis) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& shape = inputs[0].info.shape;
    const auto rank = static_cast<int64_t>(shape.size());
    if (axis_ < -rank || axis_ > rank)
      return Invalid("axis " + std::to_string(axis_) + " is out of range for rank " +
                     std::to_string(rank));
    BACKPLANE_RETURN_IF_ERROR(
        CheckOutputShape(outputs[0], FlattenShape(shape, axis_ < 0 ? axis_ + rank : axis_)));
    CopyBytes(outputs[0].data, inputs[0].data, FloatBytes(shape));
    return Status::Ok();
  }

  const int64_t axis_;
};

// ---- Reshape --------------------------------------------------------------------------------

// The errors that the target alone shows, whatever the input shape.
std::optional<std::string> ReshapeTargetError(const std::vector<int64_t>& target, bool allowzero,
                                              std::size_t input_rank) {
  const auto minus_ones = std::count(target.begin(), target.end(), -1);
  const bool has_zero = std::find(target.begin(), target.end(), 0) != target.end();
  if (minus_ones > 1)
    return "shape " + ToString(target) + " has more than one -1";
  if (allowzero && has_zero && minus_ones > 0)
    return "shape " + ToString(target) + " has both 0 and -1, invalid with allowzero=1";
  for (std::size_t i = 0; i < target.size(); ++i) {
    if (target[i] < -1)
      return "shape " + ToString(target) + " has a negative dim other than -1";
    if (target[i] == 0 && !allowzero && i >= input_rank) {
      return "shape " + ToString(target) + " copies dim " + std::to_string(i) +
             " (0 with allowzero=0) but the input has rank " + std::to_string(input_rank);
    }
  }
  return std::nullopt;
}

// The output shape for a fully known input shape.
std::optional<std::string> ResolveReshape(const Shape& in, const std::vector<int64_t>& target,
                                          bool allowzero, Shape* out) {
  if (auto error = ReshapeTargetError(target, allowzero, in.size()))
    return error;
  *out = target;
  for (std::size_t i = 0; i < out->size(); ++i) {
    if ((*out)[i] == 0 && !allowzero)
      (*out)[i] = in[i];  // 0 copies the input's dim
  }
  // The target is the model's constant: its dims may multiply past int64 ([2^62+1, 4] wraps to
  // 4, the input's count), so they are bounded before `known` multiplies them.
  if (!BoundedDimProduct(*out)) {
    return "shape " + ToString(target) + " resolves to " + ToString(*out) +
           ", whose element count overflows the limit of 2^40";
  }
  int64_t known = 1;
  std::optional<std::size_t> inferred;
  for (std::size_t i = 0; i < out->size(); ++i) {
    const int64_t dim = (*out)[i];
    if (dim == -1) {
      inferred = i;
      continue;
    }
    known *= dim;
  }
  const int64_t total = ElementCount(in);
  if (inferred) {
    if (known == 0 || total % known != 0) {
      return "cannot infer the -1 in " + ToString(target) + " for input " + ToString(in) + " (" +
             std::to_string(total) + " elements)";
    }
    (*out)[*inferred] = total / known;
  } else if (known != total) {
    return "shape " + ToString(target) + " has " + std::to_string(known) + " elements, the input " +
           ToString(in) + " has " + std::to_string(total);
  }
  return std::nullopt;
}

class ReshapeWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    std::vector<int64_t> target;  // copied out of the constant at creation
    bool allowzero;
    bool computed;  // the shape is no constant: read from input 1 at run time
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(
        op, {.min_inputs = 2, .max_inputs = 2, .attributes = {"allowzero"}, .typed = true}));
    BACKPLANE_RETURN_IF_ERROR(CheckOneType(op, 1));
    auto allowzero = FlagAttribute(op, "allowzero", false);
    if (!allowzero.ok())
      return allowzero.error();
    const TensorInfo& shape_info = op.inputs[1];
    if (shape_info.type != DataType::kInt64) {
      return NodeUnimplemented(
          op, "the shape input must be INT64, is " + std::string(ToString(shape_info.type)));
    }
    if (shape_info.shape.size() != 1 || shape_info.shape[0] < 0) {
      return NodeInvalid(
          op, "the shape input must be 1-D with a known length, is " + ToString(shape_info.shape));
    }
    if (op.constant_inputs.size() < 2 || op.constant_inputs[1] == nullptr)
      return Params{NodeLabel(op), {}, allowzero.value(), /*computed=*/true};
    const auto* data = static_cast<const int64_t*>(op.constant_inputs[1]);
    std::vector<int64_t> target(data, data + shape_info.shape[0]);
    const Shape& in = op.inputs[0].shape;
    if (std::all_of(in.begin(), in.end(), [](int64_t dim) { return dim >= 0; })) {
      Shape out;
      if (auto error = ResolveReshape(in, target, allowzero.value(), &out))
        return NodeInvalid(op, *error);
    } else if (auto error = ReshapeTargetError(target, allowzero.value(), in.size())) {
      return NodeInvalid(op, *error);
    }
    return Params{NodeLabel(op), std::move(target), allowzero.value(), /*computed=*/false};
  }

  explicit ReshapeWorkload(Params params)
      : WorkloadBase(params.label, 1, 2, 1), params_(std::move(params)) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    Shape out;
    // A computed shape is checked here like a constant one at creation: a model whose shape
    // arithmetic goes wrong gets this node's error, never a copy of the wrong size.
    if (params_.computed && (inputs.size() < 2 || inputs[1].info.type != DataType::kInt64 ||
                             inputs[1].info.shape.size() != 1))
      return Invalid("the shape input must be a 1-D INT64 tensor");
    const std::vector<int64_t> target = params_.computed ? IndexValues(inputs[1]) : params_.target;
    if (auto error = ResolveReshape(inputs[0].info.shape, target, params_.allowzero, &out))
      return Invalid(*error);
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], out));
    CopyBytes(outputs[0].data, inputs[0].data, inputs[0].info.ByteSize());
    return Status::Ok();
  }

  const Params params_;
};

// ---- Transpose ------------------------------------------------------------------------------

class TransposeWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    std::vector<int64_t> perm;  // empty: reverse the dims
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.attributes = {"perm"}, .typed = true}));
    BACKPLANE_RETURN_IF_ERROR(CheckOneType(op, 1));
    auto perm = IntsAttribute(op, "perm");
    if (!perm.ok())
      return perm.error();
    std::vector<int64_t> values = perm.value().value_or(std::vector<int64_t>{});
    if (perm.value()) {
      const std::size_t rank = op.inputs[0].shape.size();
      std::vector<int64_t> sorted = values;
      std::sort(sorted.begin(), sorted.end());
      bool ok = sorted.size() == rank;
      for (std::size_t i = 0; ok && i < rank; ++i)
        ok = sorted[i] == static_cast<int64_t>(i);
      if (!ok) {
        return NodeInvalid(op, "perm " + ToString(values) + " is not a permutation of the " +
                                   std::to_string(rank) + " input dims");
      }
    }
    return Params{NodeLabel(op), std::move(values)};
  }

  explicit TransposeWorkload(Params params)
      : WorkloadBase(params.label, 1, 1, 1), params_(std::move(params)) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& in_shape = inputs[0].info.shape;
    const std::size_t rank = in_shape.size();
    std::vector<int64_t> perm = params_.perm;
    if (perm.empty()) {
      for (std::size_t i = rank; i-- > 0;)
        perm.push_back(static_cast<int64_t>(i));
    }
    if (perm.size() != rank)
      return Invalid("perm has " + std::to_string(perm.size()) + " entries, the input rank is " +
                     std::to_string(rank));
    Shape out_shape(rank);
    for (std::size_t i = 0; i < rank; ++i)
      out_shape[i] = in_shape[perm[i]];
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], out_shape));
    const std::vector<int64_t> in_strides = Strides(in_shape);
    const std::size_t size = ElementSize(inputs[0].info.type);
    const auto* in = static_cast<const std::byte*>(inputs[0].data);
    auto* out = static_cast<std::byte*>(outputs[0].data);
    const auto count = static_cast<std::size_t>(ElementCount(out_shape));
    // Output dim i walks input dim perm[i].
    for (std::size_t flat = 0; flat < count; ++flat) {
      auto rest = static_cast<int64_t>(flat);
      int64_t offset = 0;
      for (std::size_t i = rank; i-- > 0;) {
        offset += (rest % out_shape[i]) * in_strides[perm[i]];
        rest /= out_shape[i];
      }
      std::memcpy(out + flat * size, in + static_cast<std::size_t>(offset) * size, size);
    }
    return Status::Ok();
  }

  const Params params_;
};

// ---- Concat ---------------------------------------------------------------------------------

// The output shape, or an error; dynamic dims pass.
std::optional<std::string> ConcatShape(std::span<const Shape* const> inputs, int64_t axis_given,
                                       Shape* out) {
  const Shape& first = *inputs[0];
  const auto rank = static_cast<int64_t>(first.size());
  if (axis_given < -rank || axis_given >= rank) {
    return "axis " + std::to_string(axis_given) + " is out of range for rank " +
           std::to_string(rank);
  }
  const int64_t axis = axis_given < 0 ? axis_given + rank : axis_given;
  *out = first;
  for (std::size_t i = 1; i < inputs.size(); ++i) {
    const Shape& shape = *inputs[i];
    if (shape.size() != first.size()) {
      return "input " + std::to_string(i) + " " + ToString(shape) + " has another rank than " +
             ToString(first);
    }
    for (int64_t d = 0; d < rank; ++d) {
      if (d == axis) {
        (*out)[d] = (*out)[d] < 0 || shape[d] < 0 ? -1 : (*out)[d] + shape[d];
      } else if (DimsConflict(shape[d], first[d])) {
        return "input " + std::to_string(i) + " " + ToString(shape) + " differs from " +
               ToString(first) + " outside axis " + std::to_string(axis);
      }
    }
  }
  return std::nullopt;
}

class ConcatWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    int64_t axis;  // as given; may be negative
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(
        op, {.min_inputs = 1, .max_inputs = SIZE_MAX, .attributes = {"axis"}, .typed = true}));
    BACKPLANE_RETURN_IF_ERROR(CheckOneType(op, op.inputs.size()));
    if (!op.attributes.contains("axis"))
      return NodeInvalid(op, "attribute 'axis' is required");
    auto axis = IntAttribute(op, "axis", 0);
    if (!axis.ok())
      return axis.error();
    std::vector<const Shape*> shapes;
    for (const auto& input : op.inputs)
      shapes.push_back(&input.shape);
    Shape out;
    if (auto error = ConcatShape(shapes, axis.value(), &out))
      return NodeInvalid(op, *error);
    return Params{NodeLabel(op), axis.value()};
  }

  explicit ConcatWorkload(Params params)
      : WorkloadBase(std::move(params.label), 1, SIZE_MAX, 1), axis_(params.axis) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    std::vector<const Shape*> shapes;
    for (const auto& input : inputs)
      shapes.push_back(&input.info.shape);
    Shape out_shape;
    if (auto error = ConcatShape(shapes, axis_, &out_shape))
      return Invalid(*error);
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], out_shape));
    const auto rank = static_cast<int64_t>(out_shape.size());
    const int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
    // Each input contributes one contiguous block of dims[axis:] per index of dims[:axis].
    int64_t outer = 1;
    for (int64_t d = 0; d < axis; ++d)
      outer *= out_shape[d];
    auto* out = static_cast<std::byte*>(outputs[0].data);
    std::size_t written = 0;
    for (int64_t o = 0; o < outer; ++o) {
      for (const auto& input : inputs) {
        const std::size_t block = input.info.ByteSize() / static_cast<std::size_t>(outer);
        CopyBytes(out + written, static_cast<const std::byte*>(input.data) + o * block, block);
        written += block;
      }
    }
    return Status::Ok();
  }

  const int64_t axis_;
};

// ---- Pad (opset >= 11: pads and constant_value are inputs; constant mode only) ---------------

class PadWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    std::vector<int64_t> pads;  // copied out of the constant at creation
    float value;
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    // The mode first: a reflect pad hears "mode 'reflect' is not supported", whatever else.
    auto mode_text = StringAttribute(op, "mode", "constant");
    if (!mode_text.ok())
      return mode_text.error();
    const auto mode = op_rules::ParsePadMode(mode_text.value());
    if (!mode) {
      return NodeInvalid(op, "unknown mode '" + mode_text.value() +
                                 "' (ONNX has constant, reflect, edge and wrap)");
    }
    if (*mode != op_rules::PadMode::kConstant)
      return NodeUnimplemented(op, "mode '" + mode_text.value() +
                                       "' is not supported (only "
                                       "'constant')");
    if (HasInput(op, 3))
      return NodeUnimplemented(op, "the axes input (input 3) is not supported");
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(
        op, {.min_inputs = 2, .max_inputs = 4, .attributes = {"mode"}, .float_inputs = 1}));
    const TensorInfo& pads_info = op.inputs[1];
    if (pads_info.type != DataType::kInt64 || pads_info.shape.size() != 1 ||
        pads_info.shape[0] < 0 || op.constant_inputs[1] == nullptr) {
      return NodeUnimplemented(op, "pads (input 1) must be a constant 1-D INT64 tensor");
    }
    const auto* data = static_cast<const int64_t*>(op.constant_inputs[1]);
    std::vector<int64_t> pads(data, data + pads_info.shape[0]);
    if (auto shape = op_rules::PaddedShape(op.inputs[0].shape, pads); !shape.ok())
      return NodeError(op, shape.error());
    float value = 0;
    if (HasInput(op, 2)) {
      const TensorInfo& value_info = op.inputs[2];
      if (value_info.type != DataType::kFloat32 || ElementCount(value_info.shape) != 1 ||
          op.constant_inputs[2] == nullptr) {
        return NodeUnimplemented(op, "constant_value (input 2) must be a constant FP32 scalar");
      }
      value = *static_cast<const float*>(op.constant_inputs[2]);
    }
    return Params{NodeLabel(op), std::move(pads), value};
  }

  explicit PadWorkload(Params params)
      : WorkloadBase(params.label, 1, 4, 1), params_(std::move(params)) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& in_shape = inputs[0].info.shape;
    auto out_shape = op_rules::PaddedShape(in_shape, params_.pads);
    if (!out_shape.ok())
      return Invalid(out_shape.error().message());
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], out_shape.value()));
    const auto in = inputs[0].Elements<float>();
    const auto out = outputs[0].Elements<float>();
    const std::vector<int64_t> in_strides = Strides(in_shape);
    const Shape& shape = out_shape.value();
    const std::size_t rank = shape.size();
    // Each output element: its coordinates, shifted back by the begin pads, are either inside
    // the input (copied) or not (the constant). A negative pad shifts the other way and crops.
    for (std::size_t i = 0; i < out.size(); ++i) {
      int64_t rest = static_cast<int64_t>(i);
      int64_t offset = 0;
      bool inside = true;
      for (std::size_t d = rank; d-- > 0;) {
        const int64_t coordinate = rest % shape[d] - params_.pads[d];
        rest /= shape[d];
        if (coordinate < 0 || coordinate >= in_shape[d])
          inside = false;
        else
          offset += coordinate * in_strides[d];
      }
      out[i] = inside ? in[offset] : params_.value;
    }
    return Status::Ok();
  }

  const Params params_;
};

constexpr KernelEntry kLayoutKernels[] = {
    {"Identity", CheckKernel<IdentityWorkload>, CreateKernel<IdentityWorkload>},
    {"Flatten", CheckKernel<FlattenWorkload>, CreateKernel<FlattenWorkload>},
    {"Reshape", CheckKernel<ReshapeWorkload>, CreateKernel<ReshapeWorkload>},
    {"Transpose", CheckKernel<TransposeWorkload>, CreateKernel<TransposeWorkload>},
    {"Concat", CheckKernel<ConcatWorkload>, CreateKernel<ConcatWorkload>},
    {"Pad", CheckKernel<PadWorkload>, CreateKernel<PadWorkload>},
};

}  // namespace

std::span<const KernelEntry> LayoutKernels() {
  return kLayoutKernels;
}

}  // namespace backplane::cpu_ref
