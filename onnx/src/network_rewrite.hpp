// What import's rewrites of a network (opset_upgrade, qoperator_expansion) share: fresh names for
// what they add, and constants made of values. Private to backplane_onnx.
#pragma once

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"

namespace backplane {

// Names for what a rewrite adds (constants, values, nodes): "<node>/<role>", or with a numeric
// suffix when a value or node of the network already has that name.
class NameAllocator {
 public:
  explicit NameAllocator(Network& network) : network_(network) {
    for (const auto& [name, tensor] : network.constants)
      used_.insert(name);
    for (const ValueInfo& input : network.inputs)
      used_.insert(input.name);
    for (const Node& node : network.nodes) {
      used_.insert(node.name);
      used_.insert(node.inputs.begin(), node.inputs.end());
      used_.insert(node.outputs.begin(), node.outputs.end());
    }
  }

  // A fresh name built from `wanted`.
  std::string Value(const std::string& wanted) {
    std::string name = wanted;
    for (int suffix = 1; used_.contains(name); ++suffix)
      name = wanted + "_" + std::to_string(suffix);
    used_.insert(name);
    return name;
  }

  // `tensor` added to the network's constants under a fresh name built from `wanted`.
  std::string Constant(const std::string& wanted, Tensor tensor) {
    std::string name = Value(wanted);
    network_.constants.emplace(name, std::move(tensor));
    return name;
  }

 private:
  Network& network_;
  std::set<std::string> used_;
};

// A constant of `type` and `shape` holding `values` (T the element's C++ type).
template <typename T>
Tensor MakeTensor(DataType type, Shape shape, const std::vector<T>& values) {
  Tensor tensor(TensorInfo{type, std::move(shape)});
  std::memcpy(tensor.data(), values.data(), values.size() * sizeof(T));
  return tensor;
}

}  // namespace backplane
