// The description of one operator (a network layer) as a backend sees it: for the support query
// and for workload creation.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "backplane/core/tensor.hpp"

namespace backplane {

// ONNX attribute values that the supported operators use.
using AttributeValue =
    std::variant<int64_t, float, std::string, std::vector<int64_t>, std::vector<float>>;
using AttributeMap = std::map<std::string, AttributeValue, std::less<>>;

// Operators have ONNX semantics as of opset 13 (import rewrites older forms into it, or refuses
// them). An omitted optional input (Conv's B, Gemm's C) is either absent at the end of `inputs`
// or, in the middle, an entry of type DataType::kUndefined with a null constant.
struct OperatorDesc {
  std::string op_type;  // ONNX operator type, e.g. "Add"
  std::string name;     // node name, for messages
  AttributeMap attributes;
  std::vector<TensorInfo> inputs;
  std::vector<TensorInfo> outputs;
  // Per input: the data when the input is a constant (initializer or Constant node), else null.
  // Owned by the network and valid as long as any workload created from this description lives.
  std::vector<const void*> constant_inputs;

  template <typename T>
  std::optional<T> Attribute(std::string_view key) const {
    auto it = attributes.find(key);
    if (it == attributes.end())
      return std::nullopt;
    if (const T* value = std::get_if<T>(&it->second))
      return *value;
    return std::nullopt;
  }
};

}  // namespace backplane
