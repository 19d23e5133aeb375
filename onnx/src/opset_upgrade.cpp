// One named step per old form that differs from opset 13 for a supported operator. What the ONNX
// changelog says for the others, from opset 7 on, and why they need no step:
// - Add, Sub, Mul, Div (7): multidirectional broadcasting, as at 13 (13 and 14 add types only).
// - Gemm (7, 9, 11): C required before 11; the opset-13 form, C optional, accepts every old model.
// - Reshape (5), Flatten (9, 11), Concat (4, 11), Transpose (1): 11 and 13 add negative axes and
//   types; the old attribute values mean the same.
// - Conv (1, 11), MaxPool (8, 10, 11, 12), AveragePool (7, 10, 11): attributes added later default
//   to the old behaviour (ceil_mode 0, dilations 1), so an old node is a valid new node.
// - MatMul, Relu, Sigmoid, Tanh, LeakyRelu, HardSigmoid, Identity, Global*Pool: types only.
// - BatchNormalization 9 to 13: the opset-14 form in inference; outputs other than Y are refused
//   by shape inference whatever the opset.
// Traps kept in mind here: Softmax before 13 has the same attribute name with another meaning,
// and its default axis is 1, not -1; Clip-6's defaults are the float limits, not infinities.
#include "opset_upgrade.hpp"

#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "shape_inference.hpp"

namespace backplane {
namespace {

// The values a rewrite adds: constants under names no value of the network uses.
class ConstantAdder {
 public:
  explicit ConstantAdder(Network& network) : network_(network) {
    for (const auto& [name, tensor] : network.constants)
      used_.insert(name);
    for (const ValueInfo& input : network.inputs)
      used_.insert(input.name);
    for (const Node& node : network.nodes) {
      used_.insert(node.inputs.begin(), node.inputs.end());
      used_.insert(node.outputs.begin(), node.outputs.end());
    }
  }

  // "<node>/<role>", or with a numeric suffix when that is taken; returns the name.
  std::string Add(const Node& node, const std::string& role, Tensor tensor) {
    std::string name = node.name + "/" + role;
    for (int suffix = 1; used_.contains(name); ++suffix)
      name = node.name + "/" + role + "_" + std::to_string(suffix);
    used_.insert(name);
    network_.constants.emplace(name, std::move(tensor));
    return name;
  }

 private:
  Network& network_;
  std::set<std::string> used_;
};

template <typename T>
Tensor MakeTensor(DataType type, Shape shape, const std::vector<T>& values) {
  Tensor tensor(TensorInfo{type, std::move(shape)});
  std::memcpy(tensor.data(), values.data(), values.size() * sizeof(T));
  return tensor;
}

// "node 'sm' (Softmax) at opset 11": how the steps name what they refuse.
std::string Described(const Node& node, int64_t opset) {
  return DescribeNode(node) + " at opset " + std::to_string(opset);
}

// The old forms took a single input; a second one means the model is not what its opset says.
Status RequireSingleInput(const Node& node, int64_t opset, const std::string& form) {
  if (node.inputs.size() == 1)
    return Status::Ok();
  return InvalidArgument(Described(node, opset) + ": " + form + " takes one input, the node has " +
                         std::to_string(node.inputs.size()));
}

Status TakeFloatAttribute(Node& node, int64_t opset, const std::string& key, float fallback,
                          float* value) {
  *value = fallback;
  auto it = node.attributes.find(key);
  if (it == node.attributes.end())
    return Status::Ok();
  const float* given = std::get_if<float>(&it->second);
  if (given == nullptr)
    return InvalidArgument(Described(node, opset) + ": attribute '" + key + "' must be a float");
  *value = *given;
  node.attributes.erase(it);
  return Status::Ok();
}

// Softmax-1 and -11 (before 13) coerce the input to 2-D, [d0*...*d(axis-1), d(axis)*...*d(r-1)],
// and normalise each row: over all axes from `axis` on together, default axis 1. Softmax-13
// normalises over the one axis, default -1. The two agree when every dimension after `axis` is 1
// (the last axis among them), so the node is given that axis explicitly; anything else is refused.
Status UpgradeSoftmax(Node& node, int64_t opset, const TensorInfo* input) {
  int64_t axis = 1;
  if (auto it = node.attributes.find("axis"); it != node.attributes.end()) {
    const int64_t* given = std::get_if<int64_t>(&it->second);
    if (given == nullptr)
      return InvalidArgument(Described(node, opset) + ": attribute 'axis' must be an int");
    axis = *given;
  }
  if (input == nullptr || input->type == DataType::kUndefined)
    return Unimplemented(Described(node, opset) +
                         ": the rank of the input is unknown at import, and Softmax before opset "
                         "13 means different things at different ranks");
  const Shape& shape = input->shape;
  const auto rank = static_cast<int64_t>(shape.size());
  if (axis < -rank || axis >= rank)
    return InvalidArgument(Described(node, opset) + ": axis " + std::to_string(axis) +
                           " is out of range for input rank " + std::to_string(rank));
  if (axis < 0)
    axis += rank;
  for (int64_t d = axis + 1; d < rank; ++d) {
    if (shape[d] != 1)
      return Unimplemented(
          Described(node, opset) + ": Softmax before opset 13 coerces its input " +
          ToString(shape) + " to 2-D around axis " + std::to_string(axis) +
          " and normalises over axes " + std::to_string(axis) + " to " + std::to_string(rank - 1) +
          " together; only an axis that is the last one (or followed by dimensions of 1 only) is "
          "supported");
  }
  node.attributes["axis"] = axis;
  return Status::Ok();
}

// Clip-6 (before 11) took `min` and `max` as float attributes, defaulting to the lowest and the
// highest float; from 11 they are optional inputs 1 and 2. Both become constants: an omitted
// input means no bound at all, which differs from the old defaults on infinite inputs.
Status UpgradeClip(Node& node, int64_t opset, ConstantAdder& constants) {
  BACKPLANE_RETURN_IF_ERROR(RequireSingleInput(node, opset, "Clip-6"));
  float min = 0;
  float max = 0;
  BACKPLANE_RETURN_IF_ERROR(
      TakeFloatAttribute(node, opset, "min", std::numeric_limits<float>::lowest(), &min));
  BACKPLANE_RETURN_IF_ERROR(
      TakeFloatAttribute(node, opset, "max", std::numeric_limits<float>::max(), &max));
  node.inputs.push_back(
      constants.Add(node, "min", MakeTensor<float>(DataType::kFloat32, {}, {min})));
  node.inputs.push_back(
      constants.Add(node, "max", MakeTensor<float>(DataType::kFloat32, {}, {max})));
  return Status::Ok();
}

// Dropout-7 and -10 (before 12) took `ratio` as an attribute; from 12 it is input 1, with
// training_mode input 2. In inference Dropout is the identity and the ratio unused: dropped.
// (Dropout-6's `is_test` lies below the oldest opset accepted.)
Status UpgradeDropout(Node& node, int64_t opset) {
  BACKPLANE_RETURN_IF_ERROR(RequireSingleInput(node, opset, "Dropout-7"));
  node.attributes.erase("ratio");
  return Status::Ok();
}

// Pad-2 (before 11) took `pads` (required) and `value` (default 0) as attributes; from 11 they are
// inputs 1 (INT64, same layout: all begins, then all ends) and 2. `mode` stays an attribute.
Status UpgradePad(Node& node, int64_t opset, ConstantAdder& constants) {
  BACKPLANE_RETURN_IF_ERROR(RequireSingleInput(node, opset, "Pad-2"));
  auto pads_it = node.attributes.find("pads");
  if (pads_it == node.attributes.end())
    return InvalidArgument(Described(node, opset) + ": Pad-2 requires the attribute 'pads'");
  const auto* pads = std::get_if<std::vector<int64_t>>(&pads_it->second);
  if (pads == nullptr)
    return InvalidArgument(Described(node, opset) + ": attribute 'pads' must be ints");
  Tensor pads_tensor =
      MakeTensor<int64_t>(DataType::kInt64, {static_cast<int64_t>(pads->size())}, *pads);
  node.attributes.erase(pads_it);
  float value = 0;
  BACKPLANE_RETURN_IF_ERROR(TakeFloatAttribute(node, opset, "value", 0.0f, &value));
  node.inputs.push_back(constants.Add(node, "pads", std::move(pads_tensor)));
  node.inputs.push_back(
      constants.Add(node, "constant_value", MakeTensor<float>(DataType::kFloat32, {}, {value})));
  return Status::Ok();
}

// BatchNormalization-7 (before 9) had `spatial`, default 1: one mean and variance per channel,
// the only meaning from 9 on. spatial=0 (per element of C x D1 x ... statistics) is refused.
Status UpgradeBatchNormalization(Node& node, int64_t opset) {
  auto it = node.attributes.find("spatial");
  if (it == node.attributes.end())
    return Status::Ok();
  const int64_t* spatial = std::get_if<int64_t>(&it->second);
  if (spatial == nullptr || *spatial != 1)
    return Unimplemented(Described(node, opset) +
                         ": spatial=0 (statistics per element rather than per channel) is not "
                         "supported, only spatial=1");
  node.attributes.erase(it);
  return Status::Ok();
}

// The step for `node`'s old form, if it has one at `opset`. `first_input` is the inferred info of
// input 0 (null when unknown).
Status UpgradeNodeToOpset13(Node& node, int64_t opset, const TensorInfo* first_input,
                            ConstantAdder& constants) {
  const std::string& op = node.op_type;
  if (op == "Softmax" && opset < 13)
    return UpgradeSoftmax(node, opset, first_input);
  if (op == "Clip" && opset < 11)
    return UpgradeClip(node, opset, constants);
  if (op == "Dropout" && opset < 12)
    return UpgradeDropout(node, opset);
  if (op == "Pad" && opset < 11)
    return UpgradePad(node, opset, constants);
  if (op == "BatchNormalization" && opset < 9)
    return UpgradeBatchNormalization(node, opset);
  return Status::Ok();
}

}  // namespace

Status UpgradeToOpset13(Network& network) {
  if (network.opset >= 13)
    return Status::Ok();
  ConstantAdder constants(network);
  ValueInfoMap values;
  for (const auto& [name, tensor] : network.constants)
    values[name] = tensor.info();
  for (const ValueInfo& input : network.inputs)
    values[input.name] = input.info;
  std::vector<const TensorInfo*> node_inputs;
  for (Node& node : network.nodes) {
    const TensorInfo* first_input = nullptr;
    if (!node.inputs.empty()) {
      auto it = values.find(node.inputs[0]);
      first_input = it == values.end() ? nullptr : &it->second;
    }
    BACKPLANE_RETURN_IF_ERROR(UpgradeNodeToOpset13(node, network.opset, first_input, constants));
    // The next nodes' input ranks: this node inferred in its new form (constants it gained
    // included). Import infers every value again afterwards, the same way.
    node_inputs.clear();
    for (const std::string& input : node.inputs) {
      if (input.empty()) {
        node_inputs.push_back(nullptr);
        continue;
      }
      auto it = values.find(input);
      if (it == values.end()) {
        auto constant = network.constants.find(input);
        if (constant == network.constants.end())
          return Internal(DescribeNode(node) + ": input '" + input + "' has no inferred info");
        it = values.emplace(input, constant->second.info()).first;
      }
      node_inputs.push_back(&it->second);
    }
    auto outputs = InferNodeOutputs(node, /*opset=*/13, node_inputs, network.constants);
    if (!outputs.ok())
      return std::move(outputs).error();
    for (std::size_t i = 0; i < node.outputs.size(); ++i) {
      if (!node.outputs[i].empty())
        values[node.outputs[i]] = std::move((*outputs)[i]);
    }
  }
  return Status::Ok();
}

}  // namespace backplane
