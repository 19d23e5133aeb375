#include "swap_test_util.hpp"

#include <cmath>

namespace backplane::testing {

Network TwoLayerIdentityNetwork(int64_t elements) {
  const TensorInfo info{DataType::kFloat32, {elements}};
  Network network{.name = "two_layers"};
  network.inputs = {{"x", info}};
  network.outputs = {{"y", info}};
  network.nodes = {{.name = "first", .op_type = "Identity", .inputs = {"x"}, .outputs = {"h"}},
                   {.name = "second", .op_type = "Identity", .inputs = {"h"}, .outputs = {"y"}}};
  network.values = {{"x", info}, {"h", info}, {"y", info}};
  return network;
}

float ExecuteOffset(Runtime& runtime, NetworkId network) {
  const std::vector<float> input(4, 5.0f);
  const ConstTensorView view{{DataType::kFloat32, {4}}, input.data()};
  auto outputs = runtime.Execute(network, std::span(&view, 1));
  if (!outputs.ok())
    return NAN;
  const auto values = outputs.value().at(0).Elements<float>();
  for (float value : values) {
    if (value != values[0])
      return NAN;
  }
  return values[0] - 5.0f;
}

Network ChainNetwork(Shape shape) {
  const TensorInfo info{DataType::kFloat32, std::move(shape)};
  Network network{.name = "chain"};
  network.inputs = {{"x", info}};
  network.outputs = {{"y", info}};
  network.nodes = {
      {.name = "relu", .op_type = "Relu", .inputs = {"x"}, .outputs = {"h"}},
      {.name = "add", .op_type = "Add", .inputs = {"h", "x"}, .outputs = {"s"}},
      {.name = "copy", .op_type = "Identity", .inputs = {"s"}, .outputs = {"y"}},
  };
  network.values = {{"x", info}, {"h", info}, {"s", info}, {"y", info}};
  return network;
}

}  // namespace backplane::testing
