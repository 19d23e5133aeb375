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

// The op types import accepts, Constant included (it is folded away at import).
bool IsSupportedOp(std::string_view op_type);

// The info of every output of `node` (an empty TensorInfo for an omitted optional output), from
// the infos of its inputs (null for an omitted optional input). Checks input counts, data types,
// attributes and shape compatibility; errors name the node. `constants` supplies data inputs such
// as Reshape's shape.
Result<std::vector<TensorInfo>> InferNodeOutputs(
    const Node& node, int64_t opset, std::span<const TensorInfo* const> inputs,
    const std::map<std::string, Tensor, std::less<>>& constants);

// Every value of `network` (constants, inputs, node outputs) for the given graph input infos, in
// the order of network.inputs. Nodes must be in topological order.
Result<ValueInfoMap> InferAllValues(const Network& network, std::span<const TensorInfo> inputs);

// "node 'Conv_0' (Conv)": how errors name a node.
std::string DescribeNode(const Node& node);

// "[?,4]": a shape for messages, dimensions unknown at load as '?'.
std::string ShapeText(const Shape& shape);

}  // namespace backplane
