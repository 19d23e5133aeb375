#include "qoperator_expansion.hpp"

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "network_rewrite.hpp"
#include "shape_inference.hpp"

namespace backplane {
namespace {

// The scale and zero point (names of values; the zero point "" when omitted) of a quantized value.
struct Quantization {
  std::string scale;
  std::string zero_point;
};

// One quantized operand of a QLinear node: input indices of the tensor, its scale and zero point,
// and the axis its 1-D scale runs along (ignored for a scalar).
struct Operand {
  std::size_t tensor, scale, zero_point;
  int64_t axis;
};

// A QLinear operator: its float counterpart, operands, the output's scale and zero point, and
// where the bias is (Conv's int32 B, dequantized with x_scale x w_scale).
struct Form {
  std::string_view float_op;
  std::vector<Operand> operands;
  std::size_t y_scale, y_zero_point;
  std::optional<std::size_t> bias;
  std::size_t min_inputs, max_inputs;
};

const std::map<std::string, Form, std::less<>>& Forms() {
  static const auto* forms = new std::map<std::string, Form, std::less<>>{
      // x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp[, B]: per output channel on w's axis 0.
      {"QLinearConv", {"Conv", {{0, 1, 2, 0}, {3, 4, 5, 0}}, 6, 7, 8, 8, 9}},
      // a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp: a per row, b per column.
      {"QLinearMatMul", {"MatMul", {{0, 1, 2, -2}, {3, 4, 5, -1}}, 6, 7, std::nullopt, 8, 8}},
      // com.microsoft: A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp (zero points optional).
      {"QLinearAdd", {"Add", {{0, 1, 2, 0}, {3, 4, 5, 0}}, 6, 7, std::nullopt, 7, 8}},
  };
  return *forms;
}

// Operators that move or pick elements without computing new ones: on a quantized value they give
// the same result dequantized or not, so they run on the dequantized value and quantize back with
// the value's own scale and zero point (exact).
const std::set<std::string, std::less<>>& ValuePreservingOps() {
  static const auto* ops = new std::set<std::string, std::less<>>{
      "MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze"};
  return *ops;
}

class Expander {
 public:
  explicit Expander(Network& network) : network_(network), names_(network) {}

  Status Run() {
    std::vector<Node> nodes;
    nodes.reserve(network_.nodes.size());
    for (Node& node : network_.nodes) {
      if (auto form = Forms().find(node.op_type); form != Forms().end()) {
        BACKPLANE_RETURN_IF_ERROR(ExpandQLinear(node, form->second, nodes));
      } else if (ValuePreservingOps().contains(node.op_type) && !node.inputs.empty() &&
                 quantized_.contains(node.inputs[0]) && node.outputs.size() == 1) {
        WrapValuePreserving(std::move(node), nodes);
      } else {
        if (node.op_type == "QuantizeLinear" && node.inputs.size() >= 2 && !node.outputs.empty())
          quantized_[node.outputs[0]] = {node.inputs[1], Input(node, 2)};
        nodes.push_back(std::move(node));
      }
    }
    network_.nodes = std::move(nodes);
    return Status::Ok();
  }

 private:
  static std::string Input(const Node& node, std::size_t index) {
    return index < node.inputs.size() ? node.inputs[index] : std::string();
  }

  // DequantizeLinear(tensor, scale[, zero_point]) into a fresh value, `axis` set only when the
  // scale may be 1-D (not a constant scalar).
  std::string Dequantize(const std::string& tensor, const Quantization& q, int64_t axis,
                         const std::string& node_name, std::vector<Node>& nodes) {
    std::string out = names_.Value(node_name + "/" + tensor + "_dequantized");
    Node dequantize{.name = names_.Value(node_name + "/dequantize_" + tensor),
                    .op_type = "DequantizeLinear",
                    .inputs = {tensor, q.scale},
                    .outputs = {out}};
    if (!q.zero_point.empty())
      dequantize.inputs.push_back(q.zero_point);
    if (!IsConstantScalar(q.scale))
      dequantize.attributes.emplace("axis", axis);
    nodes.push_back(std::move(dequantize));
    return out;
  }

  void Quantize(const std::string& value, const Quantization& q, const std::string& output,
                const std::string& node_name, std::vector<Node>& nodes) {
    Node quantize{.name = names_.Value(node_name + "/quantize"),
                  .op_type = "QuantizeLinear",
                  .inputs = {value, q.scale},
                  .outputs = {output}};
    if (!q.zero_point.empty())
      quantize.inputs.push_back(q.zero_point);
    nodes.push_back(std::move(quantize));
    quantized_[output] = q;
  }

  bool IsConstantScalar(const std::string& name) const {
    auto it = network_.constants.find(name);
    return it != network_.constants.end() && it->second.info().shape.empty();
  }

  Status ExpandQLinear(Node& node, const Form& form, std::vector<Node>& nodes) {
    const std::size_t count = node.inputs.size();
    if (count < form.min_inputs || count > form.max_inputs || node.outputs.size() != 1) {
      return InvalidArgument(
          DescribeNode(node) + ": takes " + std::to_string(form.min_inputs) +
          (form.min_inputs == form.max_inputs ? "" : " to " + std::to_string(form.max_inputs)) +
          " inputs and one output, the node has " + std::to_string(count) + " and " +
          std::to_string(node.outputs.size()));
    }
    Node computed{.name = names_.Value(node.name + "/" + std::string(form.float_op)),
                  .op_type = std::string(form.float_op),
                  .attributes = std::move(node.attributes)};
    for (const Operand& operand : form.operands) {
      const Quantization q{Input(node, operand.scale), Input(node, operand.zero_point)};
      computed.inputs.push_back(
          Dequantize(node.inputs[operand.tensor], q, operand.axis, node.name, nodes));
    }
    if (form.bias && !Input(node, *form.bias).empty()) {
      auto bias = DequantizeBias(node, *form.bias, nodes);
      if (!bias.ok())
        return std::move(bias).error();
      computed.inputs.push_back(std::move(bias).value());
    }
    const std::string result = names_.Value(node.name + "/" + node.outputs[0] + "_float");
    computed.outputs = {result};
    nodes.push_back(std::move(computed));
    Quantize(result, {Input(node, form.y_scale), Input(node, form.y_zero_point)}, node.outputs[0],
             node.name, nodes);
    return Status::Ok();
  }

  // QLinearConv's B: INT32 with scale x_scale x w_scale (per output channel) and zero point 0, by
  // the operator's definition. The product is computed here, so both scales must be constants.
  Result<std::string> DequantizeBias(const Node& node, std::size_t index,
                                     std::vector<Node>& nodes) {
    const Tensor* x_scale = FloatConstant(node.inputs[1]);
    const Tensor* w_scale = FloatConstant(node.inputs[4]);
    if (x_scale == nullptr || w_scale == nullptr || x_scale->info().ElementCount() != 1) {
      return Status(StatusCode::kUnimplemented,
                    DescribeNode(node) +
                        ": a bias needs x_scale (a scalar) and w_scale as FP32 constants, to "
                        "dequantize it with their product");
    }
    const float x = x_scale->Elements<float>()[0];
    std::vector<float> product;
    for (float w : w_scale->Elements<float>())
      product.push_back(x * w);
    const std::string scale =
        names_.Constant(node.name + "/bias_scale",
                        MakeTensor<float>(DataType::kFloat32, w_scale->info().shape, product));
    return Dequantize(node.inputs[index], {scale, ""}, 0, node.name, nodes);
  }

  const Tensor* FloatConstant(const std::string& name) const {
    auto it = network_.constants.find(name);
    return it != network_.constants.end() && it->second.info().type == DataType::kFloat32
               ? &it->second
               : nullptr;
  }

  void WrapValuePreserving(Node node, std::vector<Node>& nodes) {
    const Quantization q = quantized_.at(node.inputs[0]);
    node.inputs[0] = Dequantize(node.inputs[0], q, 0, node.name, nodes);
    const std::string output = node.outputs[0];
    node.outputs[0] = names_.Value(node.name + "/" + output + "_float");
    const std::string result = node.outputs[0];
    const std::string name = node.name;
    nodes.push_back(std::move(node));
    Quantize(result, q, output, name, nodes);
  }

  Network& network_;
  NameAllocator names_;
  std::map<std::string, Quantization, std::less<>> quantized_;  // value -> its quantization
};

}  // namespace

bool IsQOperator(std::string_view domain, std::string_view op_type) {
  const bool default_domain = domain.empty() || domain == "ai.onnx";
  if (op_type == "QLinearAdd")
    return domain == "com.microsoft";
  return default_domain && (op_type == "QLinearConv" || op_type == "QLinearMatMul");
}

Status ExpandQOperators(Network& network) {
  return Expander(network).Run();
}

}  // namespace backplane
