#include "kernel_support.hpp"

#include <algorithm>

namespace backplane::cpu_ref {

std::string NodeLabel(const OperatorDesc& op) {
  return op.op_type + " node '" + op.name + "'";
}

Status NodeUnimplemented(const OperatorDesc& op, const std::string& reason) {
  return Unimplemented("CpuRef: " + NodeLabel(op) + ": " + reason);
}

Status NodeInvalid(const OperatorDesc& op, const std::string& reason) {
  return InvalidArgument("CpuRef: " + NodeLabel(op) + ": " + reason);
}

Status NodeError(const OperatorDesc& op, const Status& status) {
  return {status.code(), "CpuRef: " + NodeLabel(op) + ": " + std::string(status.message())};
}

Status CheckShapeBounds(const OperatorDesc& op) {
  auto check = [&](const Shape& shape, const std::string& what) {
    Status status = CheckKnownElementCount(shape, what);
    return status.ok() ? status : NodeInvalid(op, status.message());
  };
  for (std::size_t i = 0; i < op.inputs.size(); ++i)
    BACKPLANE_RETURN_IF_ERROR(check(op.inputs[i].shape, "input " + std::to_string(i)));
  for (std::size_t i = 0; i < op.outputs.size(); ++i)
    BACKPLANE_RETURN_IF_ERROR(check(op.outputs[i].shape, "output " + std::to_string(i)));
  return Status::Ok();
}

Status CheckSignature(const OperatorDesc& op, const Signature& signature) {
  if (op.inputs.size() < signature.min_inputs || op.inputs.size() > signature.max_inputs) {
    const std::string expected =
        signature.min_inputs == signature.max_inputs
            ? std::to_string(signature.min_inputs)
            : (signature.max_inputs == SIZE_MAX ? "at least " + std::to_string(signature.min_inputs)
                                                : std::to_string(signature.min_inputs) + " to " +
                                                      std::to_string(signature.max_inputs));
    return NodeInvalid(op,
                       "needs " + expected + " input(s), has " + std::to_string(op.inputs.size()));
  }
  if (op.outputs.size() != signature.outputs) {
    return NodeInvalid(op, "needs " + std::to_string(signature.outputs) + " output(s), has " +
                               std::to_string(op.outputs.size()));
  }
  BACKPLANE_RETURN_IF_ERROR(CheckShapeBounds(op));
  for (std::size_t i = 0; i < op.inputs.size() && i < signature.float_inputs && !signature.typed;
       ++i) {
    const DataType type = op.inputs[i].type;
    // kUndefined marks an omitted optional input; whether it may be omitted is the kernel's call.
    if (type != DataType::kFloat32 && type != DataType::kUndefined) {
      return NodeUnimplemented(op, "CpuRef runs FP32 only; input " + std::to_string(i) + " is " +
                                       std::string(ToString(type)));
    }
  }
  for (std::size_t i = 0; i < op.outputs.size() && !signature.typed; ++i) {
    const DataType type = op.outputs[i].type;
    if (type != DataType::kFloat32 && type != DataType::kUndefined) {
      return NodeUnimplemented(op, "CpuRef runs FP32 only; output " + std::to_string(i) + " is " +
                                       std::string(ToString(type)));
    }
  }
  for (const auto& [key, value] : op.attributes) {
    const auto& known = signature.attributes;
    if (std::find(known.begin(), known.end(), key) == known.end())
      return NodeUnimplemented(op, "unsupported attribute '" + key + "'");
  }
  return Status::Ok();
}

Status CheckTypeIn(const OperatorDesc& op, std::size_t index,
                   std::initializer_list<DataType> types) {
  const DataType type = op.inputs[index].type;
  if (std::find(types.begin(), types.end(), type) != types.end())
    return Status::Ok();
  std::string names;
  for (DataType allowed : types)
    names += (names.empty() ? "" : ", ") + std::string(ToString(allowed));
  return NodeUnimplemented(op, "input " + std::to_string(index) + " is " +
                                   std::string(ToString(type)) + ", CpuRef runs it on " + names);
}

std::vector<int64_t> IndexValues(const ConstTensorView& view) {
  std::vector<int64_t> values;
  if (view.info.type == DataType::kInt64) {
    for (int64_t v : view.Elements<int64_t>())
      values.push_back(v);
  } else if (view.info.type == DataType::kInt32) {
    for (int32_t v : view.Elements<int32_t>())
      values.push_back(v);
  }
  return values;
}

bool HasInput(const OperatorDesc& op, std::size_t index) {
  return index < op.inputs.size() && op.inputs[index].type != DataType::kUndefined;
}

namespace {

template <typename T>
Result<std::optional<T>> TypedAttribute(const OperatorDesc& op, std::string_view key,
                                        std::string_view type_name) {
  auto it = op.attributes.find(key);
  if (it == op.attributes.end())
    return std::optional<T>();
  if (const T* value = std::get_if<T>(&it->second))
    return std::optional<T>(*value);
  return NodeInvalid(op, "attribute '" + std::string(key) + "' must be " + std::string(type_name));
}

}  // namespace

Result<int64_t> IntAttribute(const OperatorDesc& op, std::string_view key, int64_t fallback) {
  auto value = TypedAttribute<int64_t>(op, key, "an int");
  if (!value.ok())
    return value.error();
  return value.value().value_or(fallback);
}

Result<float> FloatAttribute(const OperatorDesc& op, std::string_view key, float fallback) {
  auto value = TypedAttribute<float>(op, key, "a float");
  if (!value.ok())
    return value.error();
  return value.value().value_or(fallback);
}

Result<std::string> StringAttribute(const OperatorDesc& op, std::string_view key,
                                    std::string fallback) {
  auto value = TypedAttribute<std::string>(op, key, "a string");
  if (!value.ok())
    return value.error();
  return value.value().value_or(std::move(fallback));
}

Result<std::optional<std::vector<int64_t>>> IntsAttribute(const OperatorDesc& op,
                                                          std::string_view key) {
  return TypedAttribute<std::vector<int64_t>>(op, key, "a list of ints");
}

Result<bool> FlagAttribute(const OperatorDesc& op, std::string_view key, bool fallback) {
  auto value = IntAttribute(op, key, fallback ? 1 : 0);
  if (!value.ok())
    return value.error();
  if (value.value() != 0 && value.value() != 1) {
    return NodeInvalid(op, "attribute '" + std::string(key) + "' must be 0 or 1, is " +
                               std::to_string(value.value()));
  }
  return value.value() == 1;
}

Result<int64_t> NormalizeAxis(const OperatorDesc& op, int64_t axis, int64_t rank, int64_t extra) {
  const int64_t limit = rank + extra;
  if (axis < -limit || axis >= limit) {
    return NodeInvalid(op, "axis " + std::to_string(axis) + " is out of range [" +
                               std::to_string(-limit) + "," + std::to_string(limit - 1) +
                               "] for rank " + std::to_string(rank));
  }
  return axis < 0 ? axis + limit : axis;
}

std::vector<int64_t> Strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;)
    strides[i - 1] = strides[i] * shape[i];
  return strides;
}

Status WorkloadBase::Execute(std::span<const ConstTensorView> inputs,
                             std::span<const TensorView> outputs) {
  if (inputs.size() < min_inputs_ || inputs.size() > max_inputs_ || outputs.size() != outputs_) {
    return Invalid("got " + std::to_string(inputs.size()) + " input(s) and " +
                   std::to_string(outputs.size()) + " output(s)");
  }
  // A request fixes dynamic dimensions: its shapes get the same bound as a description's.
  for (const auto& input : inputs) {
    for (int64_t dim : input.info.shape) {
      if (dim < 0)
        return Invalid("input shape " + ToString(input.info.shape) + " is not resolved");
    }
    Status bounded = CheckKnownElementCount(input.info.shape, "input");
    if (!bounded.ok())
      return Invalid(bounded.message());
  }
  for (const auto& output : outputs) {
    for (int64_t dim : output.info.shape) {
      if (dim < 0)
        return Invalid("output shape " + ToString(output.info.shape) + " is not resolved");
    }
    Status bounded = CheckKnownElementCount(output.info.shape, "output");
    if (!bounded.ok())
      return Invalid(bounded.message());
  }
  try {
    return Run(inputs, outputs);
  } catch (const std::exception& error) {
    return Internal("CpuRef: " + label_ + ": " + error.what());
  } catch (...) {
    return Internal("CpuRef: " + label_ + ": unknown exception");
  }
}

Status WorkloadBase::CheckOutputShape(const TensorView& output, const Shape& expected) const {
  if (output.info.shape != expected) {
    return Invalid("output allocated as " + ToString(output.info.shape) + ", the inputs give " +
                   ToString(expected));
  }
  return Status::Ok();
}

Status WorkloadBase::Invalid(const std::string& reason) const {
  return InvalidArgument("CpuRef: " + label_ + ": " + reason);
}

}  // namespace backplane::cpu_ref
