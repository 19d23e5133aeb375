// ONNX model import: protobuf → Network, with validation and shape inference. Everything is
// checked here, once, so that backends and the runtime can trust a Network: every error names the
// model, the node or value, and the reason.
#include <onnx/onnx_pb.h>

#include <fstream>
#include <limits>
#include <queue>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "onnx_tensor.hpp"
#include "opset_upgrade.hpp"
#include "qoperator_expansion.hpp"
#include "shape_inference.hpp"

namespace backplane {
namespace {

constexpr int64_t kMinIrVersion = 3;
constexpr int64_t kMaxIrVersion = 13;
// Backends implement opset-13 semantics and see no opset: a model of opset 7 to 12 is rewritten
// node by node into its opset-13 form (opset_upgrade.hpp), or refused where no opset-13 form
// means the same. Below 7, broadcasting took attributes.
constexpr int64_t kMinOpset = kOldestUpgradableOpset;
constexpr int64_t kMaxOpset = 25;

bool IsDefaultDomain(const std::string& domain) {
  return domain.empty() || domain == "ai.onnx";
}

std::string ElementTypeName(int32_t type) {
  if (onnx::TensorProto::DataType_IsValid(type))
    return onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(type));
  return "data type " + std::to_string(type);
}

std::string AttributeTypeName(onnx::AttributeProto::AttributeType type) {
  return onnx::AttributeProto::AttributeType_Name(type);
}

// Builds error messages that start with the model's name.
class ModelErrors {
 public:
  explicit ModelErrors(std::string_view model_name) : prefix_("model " + std::string(model_name)) {}
  Status Invalid(const std::string& reason) const {
    return InvalidArgument(prefix_ + ": " + reason);
  }
  Status Unsupported(const std::string& reason) const {
    return Unimplemented(prefix_ + ": " + reason);
  }
  Status Wrap(const Status& status) const {
    return {status.code(), prefix_ + ": " + status.message()};
  }

 private:
  std::string prefix_;
};

// A graph input or output's declared type; `for_input` demands a shape (an unknown rank cannot
// be executed) and a supported element type.
Result<TensorInfo> DeclaredInfo(const onnx::ValueInfoProto& value, bool for_input,
                                const ModelErrors& errors) {
  const std::string what = (for_input ? "graph input '" : "graph output '") + value.name() + "'";
  if (!value.has_type() || !value.type().has_tensor_type()) {
    if (for_input)
      return errors.Unsupported(what + " is not a tensor");
    return TensorInfo{};
  }
  const auto& tensor_type = value.type().tensor_type();
  TensorInfo info;
  const int32_t elem_type = tensor_type.elem_type();
  // UINT8 and INT8 are what DequantizeLinear takes and QuantizeLinear gives; INT64, INT32 and
  // BOOL are token ids, attention masks and shapes.
  if (elem_type == onnx::TensorProto::FLOAT || elem_type == onnx::TensorProto::INT64 ||
      elem_type == onnx::TensorProto::INT32 || elem_type == onnx::TensorProto::BOOL ||
      elem_type == onnx::TensorProto::UINT8 || elem_type == onnx::TensorProto::INT8) {
    info.type = static_cast<DataType>(elem_type);
  } else if (elem_type != onnx::TensorProto::UNDEFINED || for_input) {
    return errors.Unsupported(what + " has unsupported data type " + ElementTypeName(elem_type) +
                              " (supported: FLOAT, INT64, INT32, BOOL, and UINT8 and INT8 for "
                              "quantized values)");
  }
  if (!tensor_type.has_shape()) {
    if (for_input)
      return errors.Unsupported(what + " has no shape (unknown rank is not supported)");
    return info;
  }
  for (const auto& dim : tensor_type.shape().dim()) {
    if (dim.has_dim_value()) {
      if (dim.dim_value() < 0)
        return errors.Invalid(what + " has a negative dimension " +
                              std::to_string(dim.dim_value()));
      info.shape.push_back(dim.dim_value());
    } else {
      info.shape.push_back(-1);  // dim_param or nothing: fixed per request
    }
  }
  // The known dimensions alone may already overflow: refused here, naming the value, before
  // shape inference or any request multiplies them.
  Status bounded = CheckKnownElementCount(info.shape, what);
  if (!bounded.ok())
    return errors.Wrap(bounded);
  return info;
}

Result<AttributeValue> ConvertAttribute(const onnx::AttributeProto& attribute,
                                        const std::string& node) {
  switch (attribute.type()) {
    case onnx::AttributeProto::INT:
      return AttributeValue(static_cast<int64_t>(attribute.i()));
    case onnx::AttributeProto::FLOAT:
      return AttributeValue(attribute.f());
    case onnx::AttributeProto::STRING:
      return AttributeValue(attribute.s());
    case onnx::AttributeProto::INTS:
      return AttributeValue(std::vector<int64_t>(attribute.ints().begin(), attribute.ints().end()));
    case onnx::AttributeProto::FLOATS:
      return AttributeValue(
          std::vector<float>(attribute.floats().begin(), attribute.floats().end()));
    default:
      return Unimplemented(node + ": attribute '" + attribute.name() + "' has unsupported type " +
                           AttributeTypeName(attribute.type()));
  }
}

// ConstantOfShape's TENSOR attribute 'value' (one element) as backends see it, since an
// attribute cannot hold a tensor: 'value' a FLOAT for FP32, an INT for INT64, INT32 and BOOL
// (0 or 1), and 'dtype' the element type's number (DataType).
Status ConvertFillValue(const onnx::TensorProto& proto, const std::string& node,
                        AttributeMap& attributes) {
  auto tensor = TensorFromProto(proto, node + " attribute 'value'");
  if (!tensor.ok())
    return tensor.error();
  const TensorInfo& info = tensor->info();
  if (ElementCount(info.shape) != 1)
    return InvalidArgument(node + ": attribute 'value' must hold one element, has shape " +
                           ToString(info.shape));
  switch (info.type) {
    case DataType::kFloat32:
      attributes.emplace("value", tensor->Elements<float>()[0]);
      break;
    case DataType::kInt64:
      attributes.emplace("value", tensor->Elements<int64_t>()[0]);
      break;
    case DataType::kInt32:
      attributes.emplace("value", static_cast<int64_t>(tensor->Elements<int32_t>()[0]));
      break;
    case DataType::kBool:
      attributes.emplace("value", static_cast<int64_t>(tensor->Elements<uint8_t>()[0] != 0));
      break;
    default:
      return Unimplemented(node + ": attribute 'value' of " + std::string(ToString(info.type)) +
                           " is not supported (FLOAT, INT64, INT32 and BOOL are)");
  }
  attributes.emplace("dtype", static_cast<int64_t>(info.type));
  return Status::Ok();
}

// Kahn's algorithm, stable: among ready nodes the one earliest in the file goes first, so a
// well-ordered file keeps its order. Returns the order or, on a cycle, the index of a node on it.
Result<std::vector<std::size_t>> TopologicalOrder(
    const std::vector<Node>& nodes, const std::unordered_map<std::string, std::size_t>& producer,
    const ModelErrors& errors) {
  const std::size_t count = nodes.size();
  std::vector<std::vector<std::size_t>> consumers(count);
  std::vector<std::size_t> pending(count, 0);  // inputs produced by nodes not yet placed
  for (std::size_t i = 0; i < count; ++i) {
    for (const std::string& input : nodes[i].inputs) {
      auto it = producer.find(input);
      if (input.empty() || it == producer.end())
        continue;  // graph input or constant: available from the start
      consumers[it->second].push_back(i);
      ++pending[i];
    }
  }
  std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
  for (std::size_t i = 0; i < count; ++i) {
    if (pending[i] == 0)
      ready.push(i);
  }
  std::vector<std::size_t> order;
  order.reserve(count);
  while (!ready.empty()) {
    const std::size_t next = ready.top();
    ready.pop();
    order.push_back(next);
    for (std::size_t consumer : consumers[next]) {
      if (--pending[consumer] == 0)
        ready.push(consumer);
    }
  }
  if (order.size() == count)
    return order;
  // Every unplaced node waits on an unplaced producer; walking producers from any of them must
  // revisit a node, and that node lies on a cycle (a node merely downstream of one would not).
  std::size_t current = 0;
  while (pending[current] == 0)
    ++current;
  std::vector<bool> visited(count, false);
  while (!visited[current]) {
    visited[current] = true;
    for (const std::string& input : nodes[current].inputs) {
      auto it = producer.find(input);
      if (!input.empty() && it != producer.end() && pending[it->second] > 0) {
        current = it->second;
        break;
      }
    }
  }
  return errors.Invalid("node '" + nodes[current].name + "' (" + nodes[current].op_type +
                        ") is on a cycle");
}

// Declared output info vs inferred: what both know must agree. The inferred info is kept, so that
// Network::outputs and Network::values never disagree.
Result<TensorInfo> CheckOutputInfo(const onnx::ValueInfoProto& graph_output,
                                   const TensorInfo& declared, const TensorInfo& inferred,
                                   const ModelErrors& errors) {
  const std::string& name = graph_output.name();
  if (declared.type != DataType::kUndefined && declared.type != inferred.type)
    return errors.Invalid("graph output '" + name + "' is declared " +
                          std::string(ToString(declared.type)) + " but inferred " +
                          std::string(ToString(inferred.type)));
  if (!graph_output.type().tensor_type().has_shape())
    return inferred;
  const std::string mismatch = "graph output '" + name + "' is declared with shape " +
                               ToString(declared.shape) + " but inferred " +
                               ToString(inferred.shape) + " (shape mismatch)";
  if (declared.shape.size() != inferred.shape.size())
    return errors.Invalid(mismatch);
  for (std::size_t d = 0; d < declared.shape.size(); ++d) {
    if (declared.shape[d] >= 0 && inferred.shape[d] >= 0 && declared.shape[d] != inferred.shape[d])
      return errors.Invalid(mismatch);
  }
  return inferred;
}

}  // namespace

Result<Network> ImportOnnxModel(std::span<const std::byte> model, std::string_view model_name,
                                const ImportOptions& options) {
  const ModelErrors errors(model_name);
  onnx::ModelProto proto;
  if (model.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !proto.ParseFromArray(model.data(), static_cast<int>(model.size())))
    return InvalidArgument(std::string(model_name) +
                           " is not a valid ONNX model (protobuf parse failed)");

  Network network;
  network.name = std::string(model_name);
  network.ir_version = proto.ir_version();
  if (network.ir_version < kMinIrVersion || network.ir_version > kMaxIrVersion)
    return errors.Unsupported("IR version " + std::to_string(network.ir_version) +
                              " is not supported (supported: " + std::to_string(kMinIrVersion) +
                              " to " + std::to_string(kMaxIrVersion) + ")");
  bool has_default_opset = false;
  for (const auto& opset : proto.opset_import()) {
    if (IsDefaultDomain(opset.domain())) {
      has_default_opset = true;
      network.opset = opset.version();
    }
  }
  if (!has_default_opset)
    return errors.Invalid("no opset import for the default ONNX domain");
  if (network.opset < kMinOpset || network.opset > kMaxOpset)
    return errors.Unsupported("opset " + std::to_string(network.opset) +
                              " is not supported (supported: " + std::to_string(kMinOpset) +
                              " to " + std::to_string(kMaxOpset) + ")");
  if (!proto.has_graph())
    return errors.Invalid("has no graph");
  const onnx::GraphProto& graph = proto.graph();
  if (graph.sparse_initializer_size() > 0)
    return errors.Unsupported("sparse initializers are not supported");

  // Where each value comes from, for duplicate-producer and dangling-edge checks.
  std::unordered_map<std::string, std::string> source;
  auto claim = [&](const std::string& value, const std::string& by) -> Status {
    if (value.empty())
      return errors.Invalid(by + " has an empty name");
    auto [it, inserted] = source.emplace(value, by);
    if (!inserted)
      return errors.Invalid("value '" + value + "' is produced twice: by " + it->second +
                            " and by " + by);
    return Status::Ok();
  };

  for (const onnx::TensorProto& initializer : graph.initializer()) {
    const std::string what = "initializer '" + initializer.name() + "'";
    BACKPLANE_RETURN_IF_ERROR(claim(initializer.name(), what));
    auto tensor = TensorFromProto(initializer, what);
    if (!tensor.ok())
      return errors.Wrap(tensor.error());
    network.constants.emplace(initializer.name(), std::move(tensor).value());
  }

  std::size_t bound_used = 0;
  for (const onnx::ValueInfoProto& input : graph.input()) {
    // Before IR 4 every initializer is also listed as an input; it stays a constant.
    if (network.constants.contains(input.name()) && source[input.name()].starts_with("initializer"))
      continue;
    auto declared = DeclaredInfo(input, /*for_input=*/true, errors);
    if (!declared.ok())
      return std::move(declared).error();
    auto bound = options.bound_inputs.find(input.name());
    if (bound != options.bound_inputs.end()) {
      const TensorInfo& value = bound->second.info();
      bool fits = value.type == declared->type && value.shape.size() == declared->shape.size();
      for (std::size_t d = 0; fits && d < value.shape.size(); ++d)
        fits = declared->shape[d] < 0 || declared->shape[d] == value.shape[d];
      if (!fits)
        return errors.Invalid("value bound to graph input '" + input.name() + "' is " +
                              std::string(ToString(value.type)) + " " + ToString(value.shape) +
                              ", the input is declared " + std::string(ToString(declared->type)) +
                              " " + ToString(declared->shape));
      BACKPLANE_RETURN_IF_ERROR(claim(input.name(), "bound graph input '" + input.name() + "'"));
      network.constants.emplace(input.name(), bound->second);
      ++bound_used;
      continue;
    }
    BACKPLANE_RETURN_IF_ERROR(claim(input.name(), "graph input '" + input.name() + "'"));
    network.inputs.push_back({input.name(), std::move(declared).value()});
  }
  if (bound_used != options.bound_inputs.size()) {
    for (const auto& [name, tensor] : options.bound_inputs) {
      bool is_input = false;
      for (const auto& input : graph.input())
        is_input = is_input || input.name() == name;
      if (!is_input)
        return errors.Invalid("bound value '" + name + "' is not a graph input");
    }
  }

  // Nodes: attributes converted, Constant nodes folded, ops and domains checked.
  std::vector<Node> nodes;
  std::unordered_map<std::string, std::size_t> producer;  // value → index into `nodes`
  for (int index = 0; index < graph.node_size(); ++index) {
    const onnx::NodeProto& proto_node = graph.node(index);
    Node node;
    node.op_type = proto_node.op_type();
    node.name =
        proto_node.name().empty() ? node.op_type + "_" + std::to_string(index) : proto_node.name();
    const std::string described = DescribeNode(node);
    // QOperator nodes are rewritten into QDQ form below (qoperator_expansion.hpp).
    const bool q_operator = IsQOperator(proto_node.domain(), node.op_type);
    if (!q_operator && !IsDefaultDomain(proto_node.domain()))
      return errors.Unsupported(described + ": operator domain '" + proto_node.domain() +
                                "' is not supported (only the default ONNX domain, and "
                                "com.microsoft's QLinearAdd)");
    if (!q_operator && !IsSupportedOp(node.op_type))
      return errors.Unsupported(described + ": unsupported operator " + node.op_type);
    node.inputs.assign(proto_node.input().begin(), proto_node.input().end());
    node.outputs.assign(proto_node.output().begin(), proto_node.output().end());
    // A trailing "" output is an optional output not asked for (Dropout's mask, MaxPool's
    // Indices): dropped, so that backends and the runtime see only outputs that exist.
    while (!node.outputs.empty() && node.outputs.back().empty())
      node.outputs.pop_back();

    if (node.op_type == "Constant") {
      if (proto_node.attribute_size() != 1 || proto_node.attribute(0).name() != "value" ||
          proto_node.attribute(0).type() != onnx::AttributeProto::TENSOR) {
        const std::string attribute =
            proto_node.attribute_size() > 0 ? proto_node.attribute(0).name() : "";
        return errors.Unsupported(described + ": only the TENSOR attribute 'value' is supported" +
                                  (attribute.empty() || attribute == "value"
                                       ? std::string()
                                       : ", not '" + attribute + "'"));
      }
      if (!node.inputs.empty() || node.outputs.size() != 1 || node.outputs[0].empty())
        return errors.Invalid(described + ": takes no inputs and has exactly one output");
      auto tensor = TensorFromProto(proto_node.attribute(0).t(), described + " value");
      if (!tensor.ok())
        return errors.Wrap(tensor.error());
      BACKPLANE_RETURN_IF_ERROR(claim(node.outputs[0], described));
      network.constants.emplace(node.outputs[0], std::move(tensor).value());
      continue;
    }

    for (const onnx::AttributeProto& attribute : proto_node.attribute()) {
      if (node.op_type == "ConstantOfShape" && attribute.name() == "value" &&
          attribute.type() == onnx::AttributeProto::TENSOR) {
        auto status = ConvertFillValue(attribute.t(), described, node.attributes);
        if (!status.ok())
          return errors.Wrap(status);
        continue;
      }
      auto value = ConvertAttribute(attribute, described);
      if (!value.ok())
        return errors.Wrap(value.error());
      node.attributes.emplace(attribute.name(), std::move(value).value());
    }
    for (const std::string& output : node.outputs) {
      if (output.empty())
        continue;  // omitted optional output
      BACKPLANE_RETURN_IF_ERROR(claim(output, described));
      producer.emplace(output, nodes.size());
    }
    nodes.push_back(std::move(node));
  }

  for (const Node& node : nodes) {
    for (const std::string& input : node.inputs) {
      if (!input.empty() && !source.contains(input))
        return errors.Invalid(DescribeNode(node) + ": input '" + input +
                              "' is not produced by any node, graph input or initializer "
                              "(dangling edge)");
    }
  }
  auto order = TopologicalOrder(nodes, producer, errors);
  if (!order.ok())
    return std::move(order).error();
  network.nodes.reserve(nodes.size());
  for (std::size_t index : *order)
    network.nodes.push_back(std::move(nodes[index]));
  if (Status upgraded = UpgradeAttributesToOpset13(network); !upgraded.ok())
    return errors.Wrap(upgraded);
  if (Status expanded = ExpandQOperators(network); !expanded.ok())
    return errors.Wrap(expanded);

  std::vector<TensorInfo> declared_outputs;
  for (const onnx::ValueInfoProto& output : graph.output()) {
    if (!source.contains(output.name()))
      return errors.Invalid("graph output '" + output.name() +
                            "' is not produced by any node, graph input or initializer");
    auto declared = DeclaredInfo(output, /*for_input=*/false, errors);
    if (!declared.ok())
      return std::move(declared).error();
    declared_outputs.push_back(std::move(declared).value());
  }
  if (graph.output_size() == 0)
    return errors.Invalid("has no graph outputs");

  std::vector<TensorInfo> input_infos;
  for (const ValueInfo& input : network.inputs)
    input_infos.push_back(input.info);
  auto values = InferAllValues(network, input_infos);
  if (!values.ok())
    return errors.Wrap(values.error());
  network.values = std::move(values).value();
  if (Status upgraded = UpgradeSoftmaxToOpset13(network); !upgraded.ok())
    return errors.Wrap(upgraded);

  for (int i = 0; i < graph.output_size(); ++i) {
    const std::string& name = graph.output(i).name();
    auto checked =
        CheckOutputInfo(graph.output(i), declared_outputs[i], network.values.at(name), errors);
    if (!checked.ok())
      return std::move(checked).error();
    network.outputs.push_back({name, std::move(checked).value()});
  }
  return network;
}

Result<Network> ImportOnnxFile(const std::filesystem::path& path, const ImportOptions& options) {
  std::ifstream file(path, std::ios::binary);
  if (!file)
    return NotFound("cannot open ONNX model " + path.string());
  std::ostringstream contents;
  contents << file.rdbuf();
  const std::string bytes = std::move(contents).str();
  return ImportOnnxModel(std::as_bytes(std::span(bytes.data(), bytes.size())), path.string(),
                         options);
}

}  // namespace backplane
