// The operators of shape computations, token lookups and masks, on every element type they take:
// Shape, Gather, Unsqueeze, Squeeze, Slice, Expand, ConstantOfShape, Range, Where, Equal, Cast,
// Neg and Not. Values that decide an output's shape (Slice's starts, Expand's shape, Range's
// bounds) are read from the input views at run time, and the shape they give is checked against
// the output the host allocated: a wrong value is this node's error, never a write out of bounds.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernel_support.hpp"

namespace backplane::cpu_ref {
namespace {

constexpr std::initializer_list<DataType> kIndexTypes = {DataType::kInt64, DataType::kInt32};
constexpr std::initializer_list<DataType> kCastTypes = {DataType::kFloat32, DataType::kInt64,
                                                        DataType::kInt32, DataType::kBool};

const std::byte* Bytes(const ConstTensorView& view) {
  return static_cast<const std::byte*>(view.data);
}
std::byte* Bytes(const TensorView& view) {
  return static_cast<std::byte*>(view.data);
}

// The shape of a view's coordinates, and back.
std::vector<int64_t> Unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> coordinates(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    coordinates[d] = flat % shape[d];
    flat /= shape[d];
  }
  return coordinates;
}

// ---- Shape ----------------------------------------------------------------------------------

class ShapeWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    int64_t start;
    std::optional<int64_t> end;
  };
  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.attributes = {"start", "end"}, .typed = true}));
    BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 0, kAnyType));
    auto start = IntAttribute(op, "start", 0);
    if (!start.ok())
      return start.error();
    std::optional<int64_t> end;
    if (op.attributes.contains("end")) {
      auto given = IntAttribute(op, "end", 0);
      if (!given.ok())
        return given.error();
      end = given.value();
    }
    return Params{NodeLabel(op), start.value(), end};
  }
  explicit ShapeWorkload(Params params)
      : WorkloadBase(params.label, 1, 1, 1), params_(std::move(params)) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& shape = inputs[0].info.shape;
    const auto rank = static_cast<int64_t>(shape.size());
    auto clamp = [rank](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
    const int64_t from = clamp(params_.start);
    const int64_t to = clamp(params_.end.value_or(rank));
    Shape dims;
    for (int64_t d = from; d < to; ++d)
      dims.push_back(shape[d]);
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], {static_cast<int64_t>(dims.size())}));
    if (outputs[0].info.type != DataType::kInt64)
      return Invalid("the output must be INT64");
    std::copy(dims.begin(), dims.end(), outputs[0].Elements<int64_t>().begin());
    return Status::Ok();
  }
  const Params params_;
};

// ---- Gather ---------------------------------------------------------------------------------

class GatherWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    int64_t axis;  // as given
  };
  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(
        op, {.min_inputs = 2, .max_inputs = 2, .attributes = {"axis"}, .typed = true}));
    BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 0, kAnyType));
    BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 1, kIndexTypes));
    auto axis = IntAttribute(op, "axis", 0);
    if (!axis.ok())
      return axis.error();
    const auto rank = static_cast<int64_t>(op.inputs[0].shape.size());
    if (rank == 0)
      return NodeInvalid(op, "data must have rank >= 1");
    BACKPLANE_RETURN_IF_ERROR(StatusOf(NormalizeAxis(op, axis.value(), rank)));
    return Params{NodeLabel(op), axis.value()};
  }
  explicit GatherWorkload(Params params)
      : WorkloadBase(params.label, 2, 2, 1), axis_given_(params.axis) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& data = inputs[0].info.shape;
    const Shape& indices_shape = inputs[1].info.shape;
    const auto rank = static_cast<int64_t>(data.size());
    if (axis_given_ < -rank || axis_given_ >= rank)
      return Invalid("axis " + std::to_string(axis_given_) + " is out of range for rank " +
                     std::to_string(rank));
    const int64_t axis = axis_given_ < 0 ? axis_given_ + rank : axis_given_;
    Shape out(data.begin(), data.begin() + axis);
    out.insert(out.end(), indices_shape.begin(), indices_shape.end());
    out.insert(out.end(), data.begin() + axis + 1, data.end());
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], out));
    if (outputs[0].info.type != inputs[0].info.type)
      return Invalid("the output must have the data's type");
    const std::vector<int64_t> indices = IndexValues(inputs[1]);
    const int64_t size = data[axis];
    // Every index is checked before anything is written.
    for (std::size_t i = 0; i < indices.size(); ++i) {
      if (indices[i] < -size || indices[i] >= size)
        return Invalid("index " + std::to_string(indices[i]) + " (element " + std::to_string(i) +
                       " of the indices) is out of range [" + std::to_string(-size) + ", " +
                       std::to_string(size) + ") for axis " + std::to_string(axis) +
                       " of the data " + ToString(data));
    }
    int64_t outer = 1;
    for (int64_t d = 0; d < axis; ++d)
      outer *= data[d];
    int64_t inner = 1;
    for (int64_t d = axis + 1; d < rank; ++d)
      inner *= data[d];
    const std::size_t block = static_cast<std::size_t>(inner) * ElementSize(inputs[0].info.type);
    const std::byte* in = Bytes(inputs[0]);
    std::byte* dst = Bytes(outputs[0]);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t index : indices) {
        const int64_t row = index < 0 ? index + size : index;
        if (block > 0)
          std::memcpy(dst, in + static_cast<std::size_t>(o * size + row) * block, block);
        dst += block;
      }
    }
    return Status::Ok();
  }
  const int64_t axis_given_;
};

// ---- Unsqueeze, Squeeze: the data under a shape the host computed ------------------------------

// Checks the axes against the input and output ranks at run time, then copies the bytes.
class AxesCopyWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    bool unsqueeze;
  };
  static Result<Params> Parse(const OperatorDesc& op) {
    const bool unsqueeze = op.op_type == "Unsqueeze";
    if (op.attributes.contains("axes"))
      return NodeUnimplemented(op,
                               "attribute 'axes' is the form of opsets before 13: give axes "
                               "as input 1");
    BACKPLANE_RETURN_IF_ERROR(
        CheckSignature(op, {.min_inputs = unsqueeze ? 2u : 1u, .max_inputs = 2, .typed = true}));
    BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 0, kAnyType));
    if (HasInput(op, 1))
      BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 1, {DataType::kInt64}));
    if (op.outputs[0].type != op.inputs[0].type)
      return NodeInvalid(op, "the output must have the input's type");
    return Params{NodeLabel(op), unsqueeze};
  }
  explicit AxesCopyWorkload(Params params)
      : WorkloadBase(params.label, 1, 2, 1), unsqueeze_(params.unsqueeze) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& in = inputs[0].info.shape;
    const bool has_axes = inputs.size() > 1 && inputs[1].info.type != DataType::kUndefined;
    std::vector<int64_t> axes = has_axes ? IndexValues(inputs[1]) : std::vector<int64_t>{};
    const auto rank = static_cast<int64_t>(unsqueeze_ ? in.size() + axes.size() : in.size());
    std::vector<bool> marked(static_cast<std::size_t>(rank), false);
    for (int64_t axis : axes) {
      if (axis < -rank || axis >= rank)
        return Invalid("axis " + std::to_string(axis) + " is out of range for rank " +
                       std::to_string(rank));
      const int64_t normal = axis < 0 ? axis + rank : axis;
      if (marked[normal])
        return Invalid("axes " + ToString(axes) + " name an axis twice");
      marked[normal] = true;
    }
    Shape out;
    if (unsqueeze_) {
      std::size_t next = 0;
      for (int64_t d = 0; d < rank; ++d)
        out.push_back(marked[d] ? 1 : in[next++]);
    } else {
      for (int64_t d = 0; d < rank; ++d) {
        const bool squeeze = has_axes ? marked[d] : in[d] == 1;
        if (squeeze && in[d] != 1)
          return Invalid("axis " + std::to_string(d) + " of " + ToString(in) +
                         " is not 1 and cannot be squeezed");
        if (!squeeze)
          out.push_back(in[d]);
      }
    }
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], out));
    if (inputs[0].info.ByteSize() > 0)
      std::memcpy(outputs[0].data, inputs[0].data, inputs[0].info.ByteSize());
    return Status::Ok();
  }
  const bool unsqueeze_;
};

// ---- Slice (opset >= 10: starts, ends, axes and steps are inputs) ------------------------------

class SliceWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
  };
  static Result<Params> Parse(const OperatorDesc& op) {
    for (std::string_view key : {"starts", "ends", "axes"}) {
      if (op.attributes.contains(key))
        return NodeUnimplemented(
            op, "attribute '" + std::string(key) + "' is Slice-1's; from opset 10 they are inputs");
    }
    BACKPLANE_RETURN_IF_ERROR(
        CheckSignature(op, {.min_inputs = 3, .max_inputs = 5, .typed = true}));
    BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 0, kAnyType));
    for (std::size_t i = 1; i < op.inputs.size(); ++i) {
      if (HasInput(op, i))
        BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, i, kIndexTypes));
    }
    return Params{NodeLabel(op)};
  }
  explicit SliceWorkload(Params params) : WorkloadBase(params.label, 3, 5, 1) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& in = inputs[0].info.shape;
    const auto rank = static_cast<int64_t>(in.size());
    auto given = [&](std::size_t i) {
      return i < inputs.size() && inputs[i].info.type != DataType::kUndefined;
    };
    const std::vector<int64_t> starts = IndexValues(inputs[1]);
    const std::vector<int64_t> ends = IndexValues(inputs[2]);
    std::vector<int64_t> axes;
    if (given(3)) {
      axes = IndexValues(inputs[3]);
    } else {
      for (std::size_t i = 0; i < starts.size(); ++i)
        axes.push_back(static_cast<int64_t>(i));
    }
    std::vector<int64_t> steps =
        given(4) ? IndexValues(inputs[4]) : std::vector<int64_t>(starts.size(), 1);
    if (ends.size() != starts.size() || axes.size() != starts.size() ||
        steps.size() != starts.size())
      return Invalid("starts, ends, axes and steps must have one length");
    // Per axis of the input: first index and step (the whole axis, step 1, unless sliced).
    std::vector<int64_t> first(in.size(), 0);
    std::vector<int64_t> step(in.size(), 1);
    Shape out = in;
    std::vector<bool> seen(in.size(), false);
    for (std::size_t i = 0; i < axes.size(); ++i) {
      if (axes[i] < -rank || axes[i] >= rank)
        return Invalid("axis " + std::to_string(axes[i]) + " is out of range for rank " +
                       std::to_string(rank));
      const int64_t axis = axes[i] < 0 ? axes[i] + rank : axes[i];
      if (seen[axis])
        return Invalid("axes " + ToString(axes) + " name an axis twice");
      seen[axis] = true;
      if (steps[i] == 0)
        return Invalid("steps must not be 0");
      out[axis] = op_rules::SliceLength(starts[i], ends[i], steps[i], in[axis]);
      first[axis] =
          in[axis] == 0 ? 0 : op_rules::SliceBounds(starts[i], ends[i], steps[i], in[axis]).first;
      step[axis] = steps[i];
    }
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], out));
    const std::size_t size = ElementSize(inputs[0].info.type);
    const std::vector<int64_t> strides = Strides(in);
    const int64_t count = ElementCount(out);
    for (int64_t flat = 0; flat < count; ++flat) {
      const std::vector<int64_t> at = Unravel(flat, out);
      int64_t offset = 0;
      for (std::size_t d = 0; d < in.size(); ++d)
        offset += (first[d] + at[d] * step[d]) * strides[d];
      std::memcpy(Bytes(outputs[0]) + flat * size, Bytes(inputs[0]) + offset * size, size);
    }
    return Status::Ok();
  }
};

// ---- Expand ---------------------------------------------------------------------------------

class ExpandWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
  };
  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(
        CheckSignature(op, {.min_inputs = 2, .max_inputs = 2, .typed = true}));
    BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 0, kAnyType));
    BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 1, {DataType::kInt64}));
    return Params{NodeLabel(op)};
  }
  explicit ExpandWorkload(Params params) : WorkloadBase(params.label, 2, 2, 1) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& in = inputs[0].info.shape;
    const Shape target = IndexValues(inputs[1]);
    if (std::any_of(target.begin(), target.end(), [](int64_t dim) { return dim < 0; }))
      return Invalid("shape " + ToString(target) + " has a negative dimension");
    auto out = op_rules::Broadcast(in, target);
    if (!out.ok())
      return Invalid(out.error().message());
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], out.value()));
    const std::size_t size = ElementSize(inputs[0].info.type);
    const int64_t count = ElementCount(out.value());
    for (int64_t flat = 0; flat < count; ++flat) {
      const int64_t from = op_rules::BroadcastOffset(flat, out.value(), in);
      std::memcpy(Bytes(outputs[0]) + flat * size, Bytes(inputs[0]) + from * size, size);
    }
    return Status::Ok();
  }
};

// ---- ConstantOfShape ------------------------------------------------------------------------

class ConstantOfShapeWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    DataType type;
    double float_value;
    int64_t int_value;
  };
  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(
        CheckSignature(op, {.attributes = {"value", "dtype"}, .typed = true}));
    BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 0, {DataType::kInt64}));
    auto dtype = IntAttribute(op, "dtype", static_cast<int64_t>(DataType::kFloat32));
    if (!dtype.ok())
      return dtype.error();
    const auto type = static_cast<DataType>(dtype.value());
    if (std::find(kCastTypes.begin(), kCastTypes.end(), type) == kCastTypes.end())
      return NodeUnimplemented(op, "a value of type " + std::to_string(dtype.value()) +
                                       " is not supported (FP32, INT64, INT32 and BOOL are)");
    if (op.outputs[0].type != type)
      return NodeInvalid(op, "the output must be " + std::string(ToString(type)));
    Params params{NodeLabel(op), type, 0.0, 0};
    if (type == DataType::kFloat32) {
      auto value = FloatAttribute(op, "value", 0.0f);
      if (!value.ok())
        return value.error();
      params.float_value = value.value();
    } else {
      auto value = IntAttribute(op, "value", 0);
      if (!value.ok())
        return value.error();
      params.int_value = value.value();
    }
    return params;
  }
  explicit ConstantOfShapeWorkload(Params params)
      : WorkloadBase(params.label, 1, 1, 1), params_(std::move(params)) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape target = IndexValues(inputs[0]);
    if (std::any_of(target.begin(), target.end(), [](int64_t dim) { return dim < 0; }))
      return Invalid("shape " + ToString(target) + " has a negative dimension");
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], target));
    switch (params_.type) {
      case DataType::kFloat32:
        std::ranges::fill(outputs[0].Elements<float>(), static_cast<float>(params_.float_value));
        break;
      case DataType::kInt64:
        std::ranges::fill(outputs[0].Elements<int64_t>(), params_.int_value);
        break;
      case DataType::kInt32:
        std::ranges::fill(outputs[0].Elements<int32_t>(), static_cast<int32_t>(params_.int_value));
        break;
      default:
        std::ranges::fill(outputs[0].Elements<uint8_t>(), params_.int_value != 0 ? 1 : 0);
        break;
    }
    return Status::Ok();
  }
  const Params params_;
};

// ---- Range ----------------------------------------------------------------------------------

class RangeWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
  };
  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(
        CheckSignature(op, {.min_inputs = 3, .max_inputs = 3, .typed = true}));
    for (std::size_t i = 0; i < 3; ++i) {
      BACKPLANE_RETURN_IF_ERROR(
          CheckTypeIn(op, i, {DataType::kFloat32, DataType::kInt64, DataType::kInt32}));
      if (op.inputs[i].type != op.inputs[0].type)
        return NodeInvalid(op, "start, limit and delta must have one type");
    }
    return Params{NodeLabel(op)};
  }
  explicit RangeWorkload(Params params) : WorkloadBase(params.label, 3, 3, 1) {}

 private:
  template <typename T>
  Status Compute(std::span<const ConstTensorView> inputs, const TensorView& output) const {
    for (std::size_t i = 0; i < 3; ++i) {
      if (inputs[i].info.ElementCount() != 1)
        return Invalid("start, limit and delta must be scalars");
    }
    const T start = inputs[0].Elements<T>()[0];
    const T limit = inputs[1].Elements<T>()[0];
    const T delta = inputs[2].Elements<T>()[0];
    if (delta == T{0})
      return Invalid("delta is 0");
    // ONNX: max(ceil((limit - start) / delta), 0) elements, start + i * delta.
    const double length =
        std::max(std::ceil((static_cast<double>(limit) - static_cast<double>(start)) / delta), 0.0);
    if (!(length <= static_cast<double>(kMaxElementCount)))
      return Invalid("the range has too many elements");
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(output, {static_cast<int64_t>(length)}));
    const auto out = output.Elements<T>();
    for (std::size_t i = 0; i < out.size(); ++i) {
      if constexpr (std::is_same_v<T, float>) {
        out[i] = start + static_cast<float>(i) * delta;
      } else {
        // Every element lies between start and limit, but i * delta alone may not fit in T
        // (start near the minimum, a large delta): computed wrapping, which lands right.
        out[i] = static_cast<T>(static_cast<uint64_t>(start) +
                                static_cast<uint64_t>(i) * static_cast<uint64_t>(delta));
      }
    }
    return Status::Ok();
  }
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    switch (inputs[0].info.type) {
      case DataType::kFloat32:
        return Compute<float>(inputs, outputs[0]);
      case DataType::kInt64:
        return Compute<int64_t>(inputs, outputs[0]);
      case DataType::kInt32:
        return Compute<int32_t>(inputs, outputs[0]);
      default:
        return Invalid("unsupported type");
    }
  }
};

// ---- Where, Equal ---------------------------------------------------------------------------

class WhereWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
  };
  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(
        CheckSignature(op, {.min_inputs = 3, .max_inputs = 3, .typed = true}));
    BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 0, {DataType::kBool}));
    BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 1, kAnyType));
    if (op.inputs[2].type != op.inputs[1].type || op.outputs[0].type != op.inputs[1].type)
      return NodeInvalid(op, "X, Y and the output must have one type");
    return Params{NodeLabel(op)};
  }
  explicit WhereWorkload(Params params) : WorkloadBase(params.label, 3, 3, 1) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    auto first = op_rules::Broadcast(inputs[0].info.shape, inputs[1].info.shape);
    if (!first.ok())
      return Invalid(first.error().message());
    auto out = op_rules::Broadcast(first.value(), inputs[2].info.shape);
    if (!out.ok())
      return Invalid(out.error().message());
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], out.value()));
    const std::size_t size = ElementSize(inputs[1].info.type);
    const auto condition = inputs[0].Elements<uint8_t>();
    const int64_t count = ElementCount(out.value());
    for (int64_t flat = 0; flat < count; ++flat) {
      const bool take_x =
          condition[op_rules::BroadcastOffset(flat, out.value(), inputs[0].info.shape)] != 0;
      const ConstTensorView& from = inputs[take_x ? 1 : 2];
      const int64_t offset = op_rules::BroadcastOffset(flat, out.value(), from.info.shape);
      std::memcpy(Bytes(outputs[0]) + flat * size, Bytes(from) + offset * size, size);
    }
    return Status::Ok();
  }
};

class EqualWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
  };
  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(
        CheckSignature(op, {.min_inputs = 2, .max_inputs = 2, .typed = true}));
    BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 0, kCastTypes));
    if (op.inputs[1].type != op.inputs[0].type || op.outputs[0].type != DataType::kBool)
      return NodeInvalid(op, "the inputs must have one type and the output be BOOL");
    return Params{NodeLabel(op)};
  }
  explicit EqualWorkload(Params params) : WorkloadBase(params.label, 2, 2, 1) {}

 private:
  template <typename T>
  Status Compute(std::span<const ConstTensorView> inputs, const TensorView& output,
                 const Shape& out) const {
    const auto a = inputs[0].Elements<T>();
    const auto b = inputs[1].Elements<T>();
    const auto y = output.Elements<uint8_t>();
    for (std::size_t i = 0; i < y.size(); ++i) {
      const auto flat = static_cast<int64_t>(i);
      y[i] = a[op_rules::BroadcastOffset(flat, out, inputs[0].info.shape)] ==
                     b[op_rules::BroadcastOffset(flat, out, inputs[1].info.shape)]
                 ? 1
                 : 0;
    }
    return Status::Ok();
  }
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    auto out = op_rules::Broadcast(inputs[0].info.shape, inputs[1].info.shape);
    if (!out.ok())
      return Invalid(out.error().message());
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], out.value()));
    return VisitElementType(
        inputs[0].info.type,
        [&](auto zero) { return Compute<decltype(zero)>(inputs, outputs[0], out.value()); },
        [&] { return Invalid("unsupported type"); });
  }
};

// ---- Cast, Neg, Not -------------------------------------------------------------------------

// One element converted as ONNX's Cast does: to BOOL, nonzero (NaN too) is true; from FP32 to an
// integer, truncated toward zero. ONNX leaves a value out of the integer's range undefined; here
// it saturates, and NaN becomes 0, so that no input is undefined behaviour.
template <typename To, typename From>
To CastElement(From value) {
  if constexpr (std::is_same_v<To, uint8_t>) {
    return value != From{0} ? 1 : 0;
  } else if constexpr (std::is_same_v<From, float> && std::is_integral_v<To>) {
    if (std::isnan(value))
      return 0;
    const double truncated = std::trunc(static_cast<double>(value));
    if (truncated <= static_cast<double>(std::numeric_limits<To>::min()))
      return std::numeric_limits<To>::min();
    if (truncated >= static_cast<double>(std::numeric_limits<To>::max()))
      return std::numeric_limits<To>::max();
    return static_cast<To>(truncated);
  } else {
    return static_cast<To>(value);  // integers wrap as two's complement (C++20)
  }
}

class CastWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
  };
  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(
        CheckSignature(op, {.attributes = {"to", "saturate"}, .typed = true}));
    BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 0, kCastTypes));
    auto to = IntAttribute(op, "to", 0);
    if (!to.ok())
      return to.error();
    const auto type = static_cast<DataType>(to.value());
    if (std::find(kCastTypes.begin(), kCastTypes.end(), type) == kCastTypes.end())
      return NodeUnimplemented(op, "'to' = " + std::to_string(to.value()) +
                                       " is not supported (FLOAT, INT64, INT32 and BOOL are)");
    if (op.outputs[0].type != type)
      return NodeInvalid(op, "the output must be " + std::string(ToString(type)));
    return Params{NodeLabel(op)};
  }
  explicit CastWorkload(Params params) : WorkloadBase(params.label, 1, 1, 1) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], inputs[0].info.shape));
    auto unsupported = [&] { return Invalid("unsupported type"); };
    return VisitElementType(
        inputs[0].info.type,
        [&](auto from_zero) {
          using From = decltype(from_zero);
          return VisitElementType(
              outputs[0].info.type,
              [&](auto to_zero) {
                using To = decltype(to_zero);
                const auto in = inputs[0].Elements<From>();
                const auto out = outputs[0].Elements<To>();
                for (std::size_t i = 0; i < in.size(); ++i)
                  out[i] = CastElement<To>(in[i]);
                return Status::Ok();
              },
              unsupported);
        },
        unsupported);
  }
};

class NegNotWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    bool negate;  // Neg; else Not
  };
  static Result<Params> Parse(const OperatorDesc& op) {
    const bool negate = op.op_type == "Neg";
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.typed = true}));
    if (negate)
      BACKPLANE_RETURN_IF_ERROR(
          CheckTypeIn(op, 0, {DataType::kFloat32, DataType::kInt64, DataType::kInt32}));
    else
      BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 0, {DataType::kBool}));
    if (op.outputs[0].type != op.inputs[0].type)
      return NodeInvalid(op, "the output must have the input's type");
    return Params{NodeLabel(op), negate};
  }
  explicit NegNotWorkload(Params params)
      : WorkloadBase(params.label, 1, 1, 1), negate_(params.negate) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], inputs[0].info.shape));
    return VisitElementType(
        inputs[0].info.type,
        [&](auto zero) {
          using T = decltype(zero);
          const auto in = inputs[0].Elements<T>();
          const auto out = outputs[0].Elements<T>();
          for (std::size_t i = 0; i < in.size(); ++i) {
            if (!negate_)
              out[i] = in[i] != 0 ? 0 : 1;
            else if constexpr (std::is_same_v<T, float>)
              out[i] = -in[i];
            else  // the minimum negates to itself, as two's complement does
              out[i] = static_cast<T>(uint64_t{0} - static_cast<uint64_t>(in[i]));
          }
          return Status::Ok();
        },
        [&] { return Invalid("unsupported type"); });
  }
  const bool negate_;
};

template <typename W>
constexpr KernelEntry Entry(std::string_view op_type) {
  return {op_type, CheckKernel<W>, CreateKernel<W>};
}

constexpr KernelEntry kIndexKernels[] = {
    Entry<ShapeWorkload>("Shape"),
    Entry<GatherWorkload>("Gather"),
    Entry<AxesCopyWorkload>("Unsqueeze"),
    Entry<AxesCopyWorkload>("Squeeze"),
    Entry<SliceWorkload>("Slice"),
    Entry<ExpandWorkload>("Expand"),
    Entry<ConstantOfShapeWorkload>("ConstantOfShape"),
    Entry<RangeWorkload>("Range"),
    Entry<WhereWorkload>("Where"),
    Entry<EqualWorkload>("Equal"),
    Entry<CastWorkload>("Cast"),
    Entry<NegNotWorkload>("Neg"),
    Entry<NegNotWorkload>("Not"),
};

}  // namespace

std::span<const KernelEntry> IndexKernels() {
  return kIndexKernels;
}

}  // namespace backplane::cpu_ref
