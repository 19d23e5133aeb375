// One named step per old form that differs from opset 13 for a supported operator. What the ONNX
// changelog says for the others, from opset 7 on, and why they need no step:
// - Add, Sub, Mul, Div (7): multidirectional broadcasting, as at 13 (13 and 14 add types only).
// - Gemm (7, 9, 11): C required before 11; the opset-13 form, C optional, accepts every old model.
// - Reshape (5), Flatten (9, 11), Concat (4, 11), Transpose (1): 11 and 13 add negative axes and
//   types; the old attribute values mean the same.
// - Conv (1, 11), MaxPool (8, 10, 11, 12), AveragePool (7, 10, 11): attributes added later default
//   to the old behaviour (ceil_mode 0, dilations 1), so an old node is a valid new node.
// - MatMul, Relu, Sigmoid, Tanh, LeakyRelu, HardSigmoid, Identity, Global*Pool: types only.
// - QuantizeLinear, DequantizeLinear (10): per tensor only, a valid opset-13 node as it stands;
//   shape inference refuses a 1-D scale (per axis) before 13.
// - BatchNormalization 9 to 13: the opset-14 form in inference; outputs other than Y are refused
//   by shape inference whatever the opset.
// Traps kept in mind here: Softmax before 13 has the same attribute name with another meaning,
// and its default axis is 1, not -1; Clip-6's defaults are the float limits, not infinities.
#include "opset_upgrade.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "network_rewrite.hpp"
#include "shape_inference.hpp"

namespace backplane {
namespace {

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
// normalises over the one axis, default -1. When every dimension after `axis` is 1 the two agree
// and the node only gets that axis explicitly. Otherwise it becomes what it means, as ONNX's own
// version converter writes it: Flatten(axis) -> Softmax(axis 1) -> Reshape back to the input's
// shape. The Reshape's target holds the input's known dims and -1 for the unknown one, so at most
// one dim may be unknown (a symbolic batch is); two would leave the target ambiguous: refused.
Status UpgradeSoftmax(Network& network, std::size_t index, int64_t opset, NameAllocator& names) {
  Node& node = network.nodes[index];
  // Inference has checked the node at its own opset: one input, `axis` an int within the rank.
  int64_t axis = 1;
  if (auto it = node.attributes.find("axis"); it != node.attributes.end())
    axis = std::get<int64_t>(it->second);
  auto input = network.values.find(node.inputs[0]);
  if (input == network.values.end())
    return Internal(Described(node, opset) + ": input '" + node.inputs[0] +
                    "' has no inferred info");
  const Shape shape = input->second.shape;
  const auto rank = static_cast<int64_t>(shape.size());
  if (axis < 0)
    axis += rank;
  if (std::all_of(shape.begin() + axis + 1, shape.end(), [](int64_t dim) { return dim == 1; })) {
    node.attributes["axis"] = axis;
    return Status::Ok();
  }
  if (std::count_if(shape.begin(), shape.end(), [](int64_t dim) { return dim < 0; }) > 1)
    return Unimplemented(Described(node, opset) +
                         ": Softmax before opset 13 normalises its input " + ToString(shape) +
                         " over axes " + std::to_string(axis) + " to " + std::to_string(rank - 1) +
                         " together, which is rewritten as Flatten, Softmax, Reshape; the Reshape "
                         "back needs every dimension but one known, and " +
                         std::to_string(std::count_if(shape.begin(), shape.end(),
                                                      [](int64_t dim) { return dim < 0; })) +
                         " are unknown");

  const std::string name = node.name;
  const std::string flattened = names.Value(name + "/flattened");
  const std::string normalized = names.Value(name + "/normalized");
  Shape target = shape;
  std::replace_if(
      target.begin(), target.end(), [](int64_t dim) { return dim < 0; }, -1);
  const std::string target_name = names.Constant(
      name + "/shape",
      MakeTensor<int64_t>(DataType::kInt64, {static_cast<int64_t>(target.size())}, target));
  std::vector<Node> rewritten = {{.name = names.Value(name + "/flatten"),
                                  .op_type = "Flatten",
                                  .attributes = {{"axis", axis}},
                                  .inputs = {node.inputs[0]},
                                  .outputs = {flattened}},
                                 {.name = name,
                                  .op_type = "Softmax",
                                  .attributes = {{"axis", int64_t{1}}},
                                  .inputs = {flattened},
                                  .outputs = {normalized}},
                                 {.name = names.Value(name + "/reshape"),
                                  .op_type = "Reshape",
                                  .attributes = {},
                                  .inputs = {normalized, target_name},
                                  .outputs = {node.outputs[0]}}};
  // The new values' infos, by the rules that infer every other value.
  network.values[target_name] = network.constants.at(target_name).info();
  for (const Node& step : rewritten) {
    std::vector<const TensorInfo*> inputs;
    for (const std::string& value : step.inputs)
      inputs.push_back(&network.values.at(value));
    auto outputs = InferNodeOutputs(step, /*opset=*/13, inputs, network.constants);
    if (!outputs.ok())
      return std::move(outputs).error();
    network.values[step.outputs[0]] = std::move((*outputs)[0]);
  }
  // `node` dangles from here on.
  const auto at = network.nodes.begin() + static_cast<std::ptrdiff_t>(index);
  network.nodes.erase(at);
  network.nodes.insert(network.nodes.begin() + static_cast<std::ptrdiff_t>(index),
                       std::make_move_iterator(rewritten.begin()),
                       std::make_move_iterator(rewritten.end()));
  return Status::Ok();
}

// Clip-6 (before 11) took `min` and `max` as float attributes, defaulting to the lowest and the
// highest float; from 11 they are optional inputs 1 and 2. Both become constants: an omitted
// input means no bound at all, which differs from the old defaults on infinite inputs.
Status UpgradeClip(Node& node, int64_t opset, NameAllocator& names) {
  BACKPLANE_RETURN_IF_ERROR(RequireSingleInput(node, opset, "Clip-6"));
  float min = 0;
  float max = 0;
  BACKPLANE_RETURN_IF_ERROR(
      TakeFloatAttribute(node, opset, "min", std::numeric_limits<float>::lowest(), &min));
  BACKPLANE_RETURN_IF_ERROR(
      TakeFloatAttribute(node, opset, "max", std::numeric_limits<float>::max(), &max));
  node.inputs.push_back(
      names.Constant(node.name + "/min", MakeTensor<float>(DataType::kFloat32, {}, {min})));
  node.inputs.push_back(
      names.Constant(node.name + "/max", MakeTensor<float>(DataType::kFloat32, {}, {max})));
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
Status UpgradePad(Node& node, int64_t opset, NameAllocator& names) {
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
  node.inputs.push_back(names.Constant(node.name + "/pads", std::move(pads_tensor)));
  node.inputs.push_back(names.Constant(node.name + "/constant_value",
                                       MakeTensor<float>(DataType::kFloat32, {}, {value})));
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

// The step for `node`'s old form, if it has one at `opset` and needs no shapes.
Status UpgradeAttributeForm(Node& node, int64_t opset, NameAllocator& names) {
  const std::string& op = node.op_type;
  if (op == "Clip" && opset < 11)
    return UpgradeClip(node, opset, names);
  if (op == "Dropout" && opset < 12)
    return UpgradeDropout(node, opset);
  if (op == "Pad" && opset < 11)
    return UpgradePad(node, opset, names);
  if (op == "BatchNormalization" && opset < 9)
    return UpgradeBatchNormalization(node, opset);
  return Status::Ok();
}

}  // namespace

Status UpgradeAttributesToOpset13(Network& network) {
  if (network.opset >= 13)
    return Status::Ok();
  NameAllocator names(network);
  for (Node& node : network.nodes)
    BACKPLANE_RETURN_IF_ERROR(UpgradeAttributeForm(node, network.opset, names));
  return Status::Ok();
}

Status UpgradeSoftmaxToOpset13(Network& network) {
  if (network.opset >= 13)
    return Status::Ok();
  NameAllocator names(network);
  // Indexed: a rewrite inserts nodes around the one it rewrites, and steps over them.
  for (std::size_t i = 0; i < network.nodes.size(); ++i) {
    if (network.nodes[i].op_type != "Softmax")
      continue;
    const std::size_t before = network.nodes.size();
    BACKPLANE_RETURN_IF_ERROR(UpgradeSoftmax(network, i, network.opset, names));
    i += network.nodes.size() - before;  // past a Flatten, Softmax, Reshape it became
  }
  return Status::Ok();
}

}  // namespace backplane
