// Shape inference for the supported operators, shared by import (declared input shapes, dynamic
// dimensions as -1) and InferShapes (concrete shapes per request). Private to backplane_core.
#pragma once

#include <map>
#include <span>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"

namespace backplane {

using ValueInfoMap = std::map<std::string, TensorInfo, std::less<>>;
using TensorMap = std::map<std::string, Tensor, std::less<>>;

// The op types import accepts, Constant included (it is folded away at import).
bool IsSupportedOp(std::string_view op_type);

// The info of every output of `node` (an empty TensorInfo for an omitted optional output), from
// the infos of its inputs (null for an omitted optional input). Checks input counts, data types,
// attributes and shape compatibility; errors name the node. `constants` supplies data inputs such
// as Reshape's shape; `folded` (may be null) the values computed from shapes alone (FoldNode),
// which serve where a constant is needed for a shape (Reshape's shape, Unsqueeze's axes, Slice's
// starts). Such a value that is neither is unknown: the output's dimensions stay dynamic, unless
// `concrete` (every graph input's shape is known) says it never will be, and then the node is
// refused: its output's shape would depend on values computed at run time.
Result<std::vector<TensorInfo>> InferNodeOutputs(const Node& node, int64_t opset,
                                                 std::span<const TensorInfo* const> inputs,
                                                 const TensorMap& constants,
                                                 const TensorMap* folded = nullptr,
                                                 bool concrete = false);

// The value of each output of `node` when it can be computed from its inputs' shapes and from
// constant or folded values alone, small integer tensors only (a Shape, and the Gather, Concat,
// Unsqueeze, arithmetic... that exporters apply to it): what makes a Reshape's target static per
// input shape. Empty when it cannot. `inputs` are the node's input infos (null: omitted) and
// `values` their values (null: not known); `outputs` the inferred output infos.
std::vector<Tensor> FoldNode(const Node& node, std::span<const TensorInfo* const> inputs,
                             std::span<const Tensor* const> values,
                             std::span<const TensorInfo> outputs);

// Every value of `network` (constants, inputs, node outputs) for the given graph input infos, in
// the order of network.inputs. Nodes must be in topological order.
Result<ValueInfoMap> InferAllValues(const Network& network, std::span<const TensorInfo> inputs);

// "node 'Conv_0' (Conv)": how errors name a node.
std::string DescribeNode(const Node& node);

// "[?,4]": a shape for messages, dimensions unknown at load as '?'.
std::string ShapeText(const Shape& shape);

}  // namespace backplane
