// Shape computations evaluated during shape inference: the values of Shape nodes and of the small
// integer arithmetic exporters apply to them (Gather, Concat, Unsqueeze, Slice, Add, Where...), so
// that a Reshape's target, a Slice's end or a ConstantOfShape's shape computed from input shapes
// is known wherever the shapes are. Integers only, and a few elements: what it folds is shapes,
// never a tensor of data.
#include <algorithm>
#include <limits>
#include <optional>
#include <string_view>
#include <variant>
#include <vector>

#include "backplane/sdk/op_rules.hpp"
#include "shape_inference.hpp"

namespace backplane {
namespace {

// Folded values stay small: shapes and the indices computed from them, not tensors of data.
constexpr int64_t kMaxFoldedElements = 64;

bool IsIndexType(DataType type) {
  return type == DataType::kInt64 || type == DataType::kInt32 || type == DataType::kBool;
}

// A folded input's elements widened to int64 (INT64, INT32 and BOOL only).
std::vector<int64_t> Widen(const Tensor& tensor) {
  std::vector<int64_t> out;
  switch (tensor.info().type) {
    case DataType::kInt64:
      for (int64_t v : tensor.Elements<int64_t>())
        out.push_back(v);
      break;
    case DataType::kInt32:
      for (int32_t v : tensor.Elements<int32_t>())
        out.push_back(v);
      break;
    case DataType::kBool:
      for (uint8_t v : tensor.Elements<uint8_t>())
        out.push_back(v != 0 ? 1 : 0);
      break;
    default:
      break;
  }
  return out;
}

// `values` narrowed into a tensor of `info`'s type.
Tensor Narrow(const TensorInfo& info, const std::vector<int64_t>& values) {
  Tensor tensor(info);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (info.type == DataType::kInt64)
      tensor.Elements<int64_t>()[i] = values[i];
    else if (info.type == DataType::kInt32)
      tensor.Elements<int32_t>()[i] = static_cast<int32_t>(values[i]);
    else
      tensor.Elements<uint8_t>()[i] = values[i] != 0 ? 1 : 0;
  }
  return tensor;
}

// The arithmetic of one element-wise operator on integers; nullopt where it has no integer
// answer (a division by zero), so that the node is left to run instead.
std::optional<int64_t> Apply(std::string_view op, int64_t a, int64_t b) {
  int64_t out = 0;
  if (op == "Add")
    return __builtin_add_overflow(a, b, &out) ? std::nullopt : std::optional(out);
  if (op == "Sub")
    return __builtin_sub_overflow(a, b, &out) ? std::nullopt : std::optional(out);
  if (op == "Mul")
    return __builtin_mul_overflow(a, b, &out) ? std::nullopt : std::optional(out);
  if (op == "Div") {
    // Truncating, as C++ and ONNX Runtime divide integers.
    if (b == 0 || (a == std::numeric_limits<int64_t>::min() && b == -1))
      return std::nullopt;
    return a / b;
  }
  if (op == "Equal")
    return a == b ? 1 : 0;
  return std::nullopt;
}

// Element `flat` of a tensor of `shape` as broadcast to `out`.
int64_t At(const std::vector<int64_t>& values, const Shape& shape, const Shape& out, int64_t flat) {
  return values[op_rules::BroadcastOffset(flat, out, shape)];
}

}  // namespace

std::vector<Tensor> FoldNode(const Node& node, std::span<const TensorInfo* const> inputs,
                             std::span<const Tensor* const> values,
                             std::span<const TensorInfo> outputs) {
  if (outputs.size() != 1)
    return {};
  const TensorInfo& out = outputs[0];
  const auto count = BoundedDimProduct(out.shape);
  if (!IsIndexType(out.type) ||
      std::any_of(out.shape.begin(), out.shape.end(), [](int64_t dim) { return dim < 0; }) ||
      !count || *count > kMaxFoldedElements)
    return {};
  const std::string& op = node.op_type;
  if (op == "Shape") {
    // Only the input's shape is read: its data never needs to be known.
    const Shape& shape = inputs[0]->shape;
    if (std::any_of(shape.begin(), shape.end(), [](int64_t dim) { return dim < 0; }))
      return {};
    const auto rank = static_cast<int64_t>(shape.size());
    int64_t start = 0;
    int64_t end = rank;
    if (auto it = node.attributes.find("start"); it != node.attributes.end())
      start = std::get<int64_t>(it->second);
    if (auto it = node.attributes.find("end"); it != node.attributes.end())
      end = std::get<int64_t>(it->second);
    auto clamp = [rank](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
    std::vector<int64_t> dims;
    for (int64_t d = clamp(start); d < clamp(end); ++d)
      dims.push_back(shape[d]);
    std::vector<Tensor> folded;
    folded.push_back(Narrow(out, dims));
    return folded;
  }
  // Every other operator folds from known values of index types only.
  std::vector<std::vector<int64_t>> in(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] == nullptr)
      continue;
    if (values[i] == nullptr || !IsIndexType(values[i]->info().type))
      return {};
    in[i] = Widen(*values[i]);
  }
  std::vector<int64_t> result(static_cast<std::size_t>(*count));
  if (op == "Identity" || op == "Unsqueeze" || op == "Squeeze" || op == "Reshape" || op == "Cast") {
    // The same elements under another shape (or type: narrowing happens below).
    if (op == "Cast" && out.type == DataType::kBool) {
      for (std::size_t i = 0; i < result.size(); ++i)
        result[i] = in[0][i] != 0 ? 1 : 0;
    } else {
      result = in[0];
    }
  } else if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Equal") {
    for (std::size_t i = 0; i < result.size(); ++i) {
      const auto flat = static_cast<int64_t>(i);
      auto value = Apply(op, At(in[0], inputs[0]->shape, out.shape, flat),
                         At(in[1], inputs[1]->shape, out.shape, flat));
      if (!value)
        return {};
      result[i] = *value;
    }
  } else if (op == "Where") {
    for (std::size_t i = 0; i < result.size(); ++i) {
      const auto flat = static_cast<int64_t>(i);
      result[i] = At(in[0], inputs[0]->shape, out.shape, flat) != 0
                      ? At(in[1], inputs[1]->shape, out.shape, flat)
                      : At(in[2], inputs[2]->shape, out.shape, flat);
    }
  } else if (op == "Expand") {
    for (std::size_t i = 0; i < result.size(); ++i)
      result[i] = At(in[0], inputs[0]->shape, out.shape, static_cast<int64_t>(i));
  } else if (op == "ConstantOfShape") {
    int64_t fill = 0;
    if (auto it = node.attributes.find("value"); it != node.attributes.end()) {
      if (const int64_t* value = std::get_if<int64_t>(&it->second))
        fill = *value;
      else
        return {};
    }
    std::fill(result.begin(), result.end(), fill);
  } else if (op == "Gather" || op == "Concat" || op == "Slice") {
    // Along one axis; folded for 1-D data only, which is what shape computations are.
    if (inputs[0]->shape.size() != 1)
      return {};
    if (op == "Concat") {
      result.clear();
      for (const auto& part : in)
        result.insert(result.end(), part.begin(), part.end());
    } else if (op == "Gather") {
      const auto size = static_cast<int64_t>(in[0].size());
      for (std::size_t i = 0; i < result.size(); ++i) {
        const int64_t index = in[1][i] < 0 ? in[1][i] + size : in[1][i];
        if (index < 0 || index >= size)
          return {};  // inference refused it already; never read out of range
        result[i] = in[0][index];
      }
    } else {
      const auto dim = static_cast<int64_t>(in[0].size());
      const int64_t step = in.size() > 4 && !in[4].empty() ? in[4][0] : 1;
      if (in[1].size() != 1 || in[2].size() != 1 || step == 0)
        return {};
      auto [from, to] = op_rules::SliceBounds(in[1][0], in[2][0], step, dim);
      result.clear();
      for (int64_t i = from; step > 0 ? i < to : i > to; i += step)
        result.push_back(in[0][i]);
    }
  } else if (op == "Range") {
    int64_t value = in[0][0];
    for (std::size_t i = 0; i < result.size(); ++i) {
      result[i] = value;
      if (i + 1 < result.size() && __builtin_add_overflow(value, in[2][0], &value))
        return {};
    }
  } else {
    return {};
  }
  if (result.size() != static_cast<std::size_t>(*count))
    return {};
  std::vector<Tensor> folded;
  folded.push_back(Narrow(out, result));
  return folded;
}

}  // namespace backplane
