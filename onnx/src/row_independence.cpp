// The batch dimension followed through a network, one rule per operator (row_independence.hpp).
//
// Traps kept in mind here:
// - Every value is either the batch's (dimension 0 is the batch: at run time it has exactly the
//   batch's rows, and row r depends on row r of the inputs alone) or no request's (computed from
//   constants alone, the same whatever the batch). A rule marks an output the batch's only when
//   both hold; there is no third state, so a batch moved to another axis is refused at once,
//   even where a later node would move it back.
// - Broadcasting aligns shapes from the right: an operand that carries the batch but has a
//   lower rank than the result puts the batch on another axis; a constant of the result's rank
//   whose dimension 0 is not 1 pairs row r with its own row r, so a request's answer would
//   depend on where it sits in the batch (and a batch of any other size would not run at all).
// - Flatten with axis 2 or more merges the batch with the dimensions before the axis: dimension
//   0 of the result is then rows x channels, no longer the batch, although no two rows' elements
//   meet. Only known dimensions of 1 between them keep it the batch.
// - Reshape may copy dimension 0 (a 0 in the target, without allowzero) or compute it (-1):
//   the -1 is the batch only when the rest of the target holds exactly a row's elements, which
//   needs the row's dimensions known; a positive dimension 0 is never the batch.
// - Softmax's default axis is -1 from opset 13 and 1 before (import rewrites the old forms, but a
//   network built by hand may not be imported): a rank-1 input normalises over the batch.
// - QuantizeLinear and DequantizeLinear per axis 0 scale each row of the batch differently.
// - Unknown operators fail closed: a new operator is batched only once it has a rule here.
#include "backplane/onnx/row_independence.hpp"

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "shape_inference.hpp"

namespace backplane {
namespace {

constexpr std::string_view kMix = ": rows of different requests would mix";

std::string IntsText(const std::vector<int64_t>& values) {
  std::string text = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0)
      text += ',';
    text += std::to_string(values[i]);
  }
  return text + "]";
}

// One node's rule: whether its outputs carry the batch, or why it is refused. Reads the
// network's inferred values, its constants and the set of values that carry the batch.
class NodeRule {
 public:
  NodeRule(const Network& network, const Node& node, const std::set<std::string>& batched)
      : network_(network), node_(node), batched_(batched) {}

  // true: every output carries the batch; false: no output depends on a request.
  Result<bool> Apply() const {
    bool any = false;
    for (std::size_t i = 0; i < node_.inputs.size(); ++i)
      any = any || Batched(i);
    if (!any)
      return false;  // constants alone: the same value for every batch
    for (std::size_t i = 0; i < node_.inputs.size(); ++i) {
      if (Has(i) && !network_.values.contains(node_.inputs[i]))
        return Refuse("has no inferred shape for " + Input(i));  // not imported
    }
    const std::string& op = node_.op_type;
    if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div")
      return Broadcast();
    if (op == "Relu" || op == "LeakyRelu" || op == "Sigmoid" || op == "HardSigmoid" ||
        op == "HardSwish" || op == "Tanh" || op == "Identity" || op == "Clip" || op == "Dropout" ||
        op == "Conv" || op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" ||
        op == "GlobalMaxPool" || op == "BatchNormalization")
      return KeepsRows(BatchOnlyInData());  // row by row, on dimension 0 as N
    if (op == "Softmax")
      return Softmax();
    if (op == "Gemm")
      return Gemm();
    if (op == "MatMul")
      return MatMul();
    if (op == "Flatten")
      return Flatten();
    if (op == "Reshape")
      return Reshape();
    if (op == "Transpose")
      return Transpose();
    if (op == "Concat")
      return Concat();
    if (op == "Pad")
      return Pad();
    if (op == "QuantizeLinear" || op == "DequantizeLinear")
      return Quantization();
    return Refuse("has no rule for the batch dimension, so its rows cannot be shown to stay apart");
  }

 private:
  Status Refuse(const std::string& reason) const {
    return InvalidArgument(DescribeNode(node_) + " " + reason);
  }
  bool Has(std::size_t i) const { return i < node_.inputs.size() && !node_.inputs[i].empty(); }
  bool Batched(std::size_t i) const { return Has(i) && batched_.contains(node_.inputs[i]); }
  const Shape& ShapeOf(std::size_t i) const { return network_.values.at(node_.inputs[i]).shape; }
  std::string Input(std::size_t i) const {
    return "input " + std::to_string(i) + " ('" + node_.inputs[i] + "')";
  }
  std::optional<int64_t> Int(std::string_view key) const {
    auto it = node_.attributes.find(key);
    if (it == node_.attributes.end())
      return std::nullopt;
    if (const auto* value = std::get_if<int64_t>(&it->second))
      return *value;
    return std::nullopt;
  }
  // An axis attribute resolved against `rank` (negative counts from the end), or nullopt when
  // it is out of [-rank, rank + extra) or not an INT (import refuses both; a hand-built network
  // may not have been imported).
  std::optional<int64_t> Axis(std::string_view key, int64_t fallback, std::size_t rank,
                              int64_t extra = 0) const {
    int64_t axis = fallback;
    if (node_.attributes.contains(key)) {
      auto value = Int(key);
      if (!value)
        return std::nullopt;
      axis = *value;
    }
    const auto r = static_cast<int64_t>(rank);
    if (axis < -r || axis >= r + extra)
      return std::nullopt;
    return axis < 0 ? axis + r : axis;
  }
  const Tensor* Constant(std::size_t i) const {
    auto it = network_.constants.find(node_.inputs[i]);
    return it == network_.constants.end() ? nullptr : &it->second;
  }

  // Input `data` alone may carry the batch: every other input is a parameter the operator
  // applies to each row alike (a weight, a bias, statistics, bounds, a shape).
  Status BatchOnlyInData(std::size_t data = 0) const {
    for (std::size_t i = 0; i < node_.inputs.size(); ++i) {
      if (i != data && Batched(i))
        return Refuse(Input(i) +
                      " carries the batch dimension, but the operator applies it to every row "
                      "alike" +
                      std::string(kMix));
    }
    return Status::Ok();
  }
  static Result<bool> KeepsRows(Status status) {
    if (!status.ok())
      return status;
    return true;
  }

  Result<bool> Broadcast() const {
    std::size_t rank = 0;
    for (std::size_t i = 0; i < node_.inputs.size(); ++i)
      rank = std::max(rank, Has(i) ? ShapeOf(i).size() : 0);
    for (std::size_t i = 0; i < node_.inputs.size(); ++i) {
      if (!Has(i))
        continue;
      const Shape& shape = ShapeOf(i);
      if (Batched(i) && shape.size() < rank)
        return Refuse("broadcasts " + Input(i) + " of shape " + ShapeText(shape) +
                      ", which carries the batch, to rank " + std::to_string(rank) +
                      ": its batch dimension would land on dimension " +
                      std::to_string(rank - shape.size()) + std::string(kMix));
      if (!Batched(i) && shape.size() == rank && shape[0] != 1)
        return Refuse("broadcasts " + Input(i) + " of shape " + ShapeText(shape) +
                      " along dimension 0, the batch: row r would meet its row r, so a "
                      "request's answer would depend on where it sits in the batch");
    }
    return true;
  }

  // Element by element with a scale and zero point per tensor, or per index of `axis`: per index
  // of axis 0 they would pair row r of the batch with the model's scale r (and a batch of another
  // size would not run at all).
  Result<bool> Quantization() const {
    BACKPLANE_RETURN_IF_ERROR(BatchOnlyInData());
    const Shape& scale = ShapeOf(1);
    const bool per_axis = scale.size() == 1 && scale[0] != 1;
    if (!per_axis)
      return true;
    const auto axis = Axis("axis", 1, ShapeOf(0).size());
    if (!axis)
      return Refuse("has an invalid 'axis'");
    if (*axis == 0)
      return Refuse("has a scale of shape " + ShapeText(scale) +
                    " per index of axis 0, the batch dimension: row r would meet scale r, so a "
                    "request's answer would depend on where it sits in the batch");
    return true;
  }

  Result<bool> Softmax() const {
    BACKPLANE_RETURN_IF_ERROR(BatchOnlyInData());
    const auto axis = Axis("axis", network_.opset >= 13 ? -1 : 1, ShapeOf(0).size());
    if (!axis)
      return Refuse("has an invalid 'axis'");
    if (*axis == 0)
      return Refuse("normalises over axis 0, the batch dimension" + std::string(kMix));
    return true;
  }

  Result<bool> Gemm() const {
    if (Batched(1))
      return Refuse("multiplies by " + Input(1) +
                    " (B), which carries the batch dimension: each output row would sum over the "
                    "rows of every request");
    if (!Batched(0))
      return Refuse(Input(2) + " (C) carries the batch dimension but A does not" +
                    std::string(kMix));
    if (node_.attributes.contains("transA") && Int("transA") != 0)  // an INT, else refused
      return Refuse("transposes A (transA=1), which makes the batch dimension the one summed over" +
                    std::string(kMix));
    if (Has(2)) {
      const Shape& c = ShapeOf(2);
      if (Batched(2) && c.size() != 2)
        return Refuse("broadcasts " + Input(2) + " (C) of shape " + ShapeText(c) +
                      ", which carries the batch, over the columns" + std::string(kMix));
      if (!Batched(2) && c.size() == 2 && c[0] != 1)
        return Refuse("adds " + Input(2) + " (C) of shape " + ShapeText(c) +
                      " row by row: row r would meet its row r, so a request's answer would "
                      "depend on where it sits in the batch");
    }
    return true;
  }

  // numpy.matmul: the last two dimensions multiply, those before them broadcast from the right
  // (a vector A is [1,k], a vector B [k,1]). The batch stays apart as A's rows (M) when A is a
  // matrix and B no more than one, or as a broadcast dimension of the result's rank, wherever
  // it is: then the other operand must not have rows of its own there.
  Result<bool> MatMul() const {
    const Shape& a = ShapeOf(0);
    const Shape& b = ShapeOf(1);
    if (Batched(0) && a.size() == 1)
      return Refuse("multiplies " + Input(0) + " of shape " + ShapeText(a) +
                    " as a vector: the batch is the dimension summed over" + std::string(kMix));
    if (Batched(1) && b.size() <= 2)
      return Refuse("multiplies by " + Input(1) + " of shape " + ShapeText(b) +
                    ", a matrix or vector that carries the batch dimension: output rows would sum "
                    "over it, or spread it across their columns" +
                    std::string(kMix));
    const std::size_t rank = std::max(a.size(), b.size());
    if (Batched(0) && a.size() == 2) {
      if (b.size() > 2)
        return Refuse("multiplies A of shape " + ShapeText(a) + " by " + Input(1) + " of shape " +
                      ShapeText(b) + ", whose leading dimensions go before the batch" +
                      std::string(kMix));
      return true;
    }
    for (std::size_t i = 0; i < 2; ++i) {
      const Shape& shape = ShapeOf(i);
      if (Batched(i) && shape.size() < rank)
        return Refuse("multiplies " + Input(i) + " of shape " + ShapeText(shape) +
                      ", which carries the batch, by an operand of rank " + std::to_string(rank) +
                      ", whose leading dimensions go before the batch" + std::string(kMix));
      if (!Batched(i) && shape.size() == rank && shape[0] != 1)
        return Refuse("broadcasts " + Input(i) + " of shape " + ShapeText(shape) +
                      " along dimension 0, the batch: row r would meet its matrix r, so a "
                      "request's answer would depend on where it sits in the batch");
    }
    return true;
  }

  Result<bool> Flatten() const {
    const Shape& x = ShapeOf(0);
    const auto axis = Axis("axis", 1, x.size(), /*extra=*/1);
    if (!axis)
      return Refuse("has an invalid 'axis'");
    if (*axis == 0)
      return Refuse("flattens with axis 0, which folds the whole batch into one row" +
                    std::string(kMix));
    for (int64_t d = 1; d < *axis; ++d) {
      if (x[d] != 1)
        return Refuse("flattens " + ShapeText(x) + " with axis " + std::to_string(*axis) +
                      ", which merges the batch dimension with dimension " + std::to_string(d) +
                      ": dimension 0 of its output would no longer be the batch" +
                      std::string(kMix));
    }
    return true;
  }

  Result<bool> Reshape() const {
    BACKPLANE_RETURN_IF_ERROR(BatchOnlyInData());
    const Tensor* shape = Has(1) ? Constant(1) : nullptr;
    if (shape == nullptr || shape->info().type != DataType::kInt64)
      return Refuse("has a shape that is not an INT64 constant");
    const auto requested = shape->Elements<int64_t>();
    const std::vector<int64_t> target(requested.begin(), requested.end());
    const bool allow_zero = node_.attributes.contains("allowzero") && Int("allowzero") != 0;
    const Shape& x = ShapeOf(0);
    const std::string reshapes = "reshapes " + ShapeText(x) + " to " + IntsText(target);
    if (!target.empty() && target[0] == 0 && !allow_zero)
      return true;  // dimension 0 copied; the element count then fixes the rest of a row
    if (target.empty() || target[0] != -1)
      return Refuse(reshapes + ": dimension 0 of its output would not be the batch" +
                    std::string(kMix));
    // -1 first: the batch only when the rest of the target is exactly a row. Dimensions copied
    // with 0 at the same position are on both sides and cancel.
    const auto copied = [&](std::size_t i) {
      return i < target.size() && i < x.size() && target[i] == 0 && !allow_zero;
    };
    int64_t row = 1;
    for (std::size_t i = 1; i < x.size(); ++i) {
      if (copied(i))
        continue;
      if (x[i] < 0)
        return Refuse(reshapes + " computing dimension 0, and dimension " + std::to_string(i) +
                      " of a row is unknown at load, so it cannot be shown to stay the batch" +
                      std::string(kMix));
      row *= x[i];  // within the bound: x passed shape inference
    }
    int64_t target_row = 1;
    for (std::size_t i = 1; i < target.size(); ++i) {
      if (!copied(i))
        target_row *= target[i];  // positive: one -1 at most, and it is first
    }
    if (row == 0 || row != target_row)
      return Refuse(reshapes + ", whose dimensions after the first hold " +
                    std::to_string(target_row) + " elements where a row has " +
                    std::to_string(row) + ": dimension 0 of its output would not be the batch" +
                    std::string(kMix));
    return true;
  }

  Result<bool> Transpose() const {
    const std::size_t rank = ShapeOf(0).size();
    std::vector<int64_t> perm(rank);
    std::iota(perm.rbegin(), perm.rend(), 0);
    if (auto it = node_.attributes.find("perm"); it != node_.attributes.end()) {
      const auto* given = std::get_if<std::vector<int64_t>>(&it->second);
      if (given == nullptr)
        return Refuse("has an invalid 'perm'");
      perm = *given;
    }
    if (perm.empty() || perm[0] != 0) {
      const auto moved = std::find(perm.begin(), perm.end(), 0);
      return Refuse("moves the batch dimension to dimension " +
                    std::to_string(moved - perm.begin()) + " (perm " + IntsText(perm) + ")" +
                    std::string(kMix));
    }
    return true;
  }

  Result<bool> Concat() const {
    for (std::size_t i = 0; i < node_.inputs.size(); ++i) {
      if (!Batched(i))
        return Refuse("joins " + Input(i) +
                      ", which does not carry the batch dimension, to inputs "
                      "that do: its rows would meet rows of the batch by position" +
                      std::string(kMix));
    }
    const auto axis = Axis("axis", 0, ShapeOf(0).size());
    if (!axis || !node_.attributes.contains("axis"))
      return Refuse("has an invalid 'axis'");
    if (*axis == 0)
      return Refuse("concatenates along axis 0, the batch dimension" + std::string(kMix));
    return true;
  }

  Result<bool> Pad() const {
    BACKPLANE_RETURN_IF_ERROR(BatchOnlyInData());
    const Tensor* pads = Has(1) ? Constant(1) : nullptr;
    const std::size_t rank = ShapeOf(0).size();
    if (pads == nullptr || pads->info().type != DataType::kInt64 ||
        pads->Elements<int64_t>().size() != 2 * rank || Has(3))
      return Refuse("has pads that are not an INT64 constant of two values per axis");
    const auto values = pads->Elements<int64_t>();
    if (values[0] != 0 || values[rank] != 0)
      return Refuse("pads axis 0, the batch dimension (" + std::to_string(values[0]) + " before, " +
                    std::to_string(values[rank]) + " after)" + std::string(kMix));
    return true;
  }

  const Network& network_;
  const Node& node_;
  const std::set<std::string>& batched_;
};

}  // namespace

Status CheckRowsIndependent(const Network& network) {
  std::set<std::string> batched;  // the values that carry the batch
  for (const ValueInfo& input : network.inputs) {
    if (input.info.shape.empty())
      return InvalidArgument("graph input '" + input.name +
                             "' is a scalar (shape []), which has no batch dimension");
    batched.insert(input.name);
  }
  for (const Node& node : network.nodes) {
    auto carries = NodeRule(network, node, batched).Apply();
    if (!carries.ok())
      return std::move(carries).error();
    if (*carries) {
      for (const std::string& output : node.outputs) {
        if (!output.empty())
          batched.insert(output);
      }
    }
  }
  for (const ValueInfo& output : network.outputs) {
    if (!batched.contains(output.name))
      return InvalidArgument("graph output '" + output.name +
                             "' does not carry the batch dimension: it is computed from "
                             "constants alone, and could not be split back into requests");
  }
  return Status::Ok();
}

}  // namespace backplane
