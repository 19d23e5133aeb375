// Shape inference with ONNX semantics for the supported operators. A negative dimension is
// dynamic: it propagates as -1 wherever the result cannot be resolved without it, and checks that
// need it are left to the per-request pass, when it is known.
#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/sdk/op_rules.hpp"
#include "shape_inference.hpp"

namespace backplane {
namespace {

constexpr int64_t kDynamic = -1;

// Sized by its initializers: a std::array with a stale count would pad with "" and "support" it.
constexpr std::string_view kSupportedOps[] = {"Add",
                                              "Sub",
                                              "Mul",
                                              "Div",
                                              "Relu",
                                              "LeakyRelu",
                                              "Sigmoid",
                                              "HardSigmoid",
                                              "HardSwish",
                                              "Tanh",
                                              "Clip",
                                              "Softmax",
                                              "Gemm",
                                              "MatMul",
                                              "Conv",
                                              "MaxPool",
                                              "AveragePool",
                                              "GlobalAveragePool",
                                              "GlobalMaxPool",
                                              "BatchNormalization",
                                              "Flatten",
                                              "Reshape",
                                              "Transpose",
                                              "Concat",
                                              "Identity",
                                              "Dropout",
                                              "Pad",
                                              "Constant",
                                              "QuantizeLinear",
                                              "DequantizeLinear",
                                              "Gather",
                                              "Shape",
                                              "Unsqueeze",
                                              "Squeeze",
                                              "Slice",
                                              "Cast",
                                              "Equal",
                                              "Where",
                                              "Expand",
                                              "ConstantOfShape",
                                              "Range",
                                              "ReduceMean",
                                              "ReduceSum",
                                              "Pow",
                                              "Sqrt",
                                              "Erf",
                                              "Neg",
                                              "Not",
                                              "LayerNormalization"};

bool Known(int64_t dim) {
  return dim >= 0;
}

std::string DimText(int64_t dim) {
  return Known(dim) ? std::to_string(dim) : "?";
}

// Element count, or kDynamic when a dimension is unknown (and none is zero). Only for dims whose
// known product passed BoundedDimProduct (the node's checked inputs and outputs, or a subset of
// them): it cannot overflow then.
int64_t Product(std::span<const int64_t> dims) {
  int64_t product = 1;
  bool unknown = false;
  for (int64_t dim : dims) {
    if (dim == 0)
      return 0;
    if (!Known(dim))
      unknown = true;
    else
      product *= dim;
  }
  return unknown ? kDynamic : product;
}

// Range's length, max(ceil((limit - start) / delta), 0); nullopt for a delta of 0 or a length
// over the bound on element counts.
std::optional<int64_t> RangeLength(double start, double limit, double delta) {
  if (delta == 0 || !std::isfinite(start) || !std::isfinite(limit) || !std::isfinite(delta))
    return std::nullopt;
  const double length = std::max(std::ceil((limit - start) / delta), 0.0);
  if (length > static_cast<double>(kMaxElementCount))
    return std::nullopt;
  return static_cast<int64_t>(length);
}

// Checks one node and computes its outputs. Each Infer* method fills `outputs_` or returns an
// error built with Error(), so that every message names the node.
class NodeInference {
 public:
  NodeInference(const Node& node, int64_t opset, std::span<const TensorInfo* const> inputs,
                const TensorMap& constants, const TensorMap* folded, bool concrete)
      : node_(node),
        opset_(opset),
        inputs_(inputs),
        constants_(constants),
        folded_(folded),
        concrete_(concrete) {}

  // Every shape in and out is held to core's bound on element counts, so that no operator's
  // arithmetic below, nor a backend's, nor the runtime's allocation, ever multiplies past int64.
  Result<std::vector<TensorInfo>> Run() {
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      if (inputs_[i] != nullptr)
        BACKPLANE_RETURN_IF_ERROR(CheckBound(In(i), "input '" + node_.inputs[i] + "'"));
    }
    outputs_.assign(node_.outputs.size(), TensorInfo{});
    Status status = Dispatch();
    if (!status.ok())
      return status;
    for (std::size_t i = 0; i < outputs_.size(); ++i)
      BACKPLANE_RETURN_IF_ERROR(CheckBound(outputs_[i].shape, "output '" + node_.outputs[i] + "'"));
    return std::move(outputs_);
  }

 private:
  Status Dispatch() {
    const std::string& op = node_.op_type;
    if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div")
      return InferBroadcast();
    if (op == "Relu" || op == "Sigmoid" || op == "Tanh" || op == "HardSwish" || op == "Sqrt" ||
        op == "Erf")
      return InferUnary();
    if (op == "Identity")
      return InferTyped(kAnyType);
    if (op == "Neg")
      return InferTyped(kSignedTypes);
    if (op == "Not")
      return InferTyped({DataType::kBool});
    if (op == "Gather")
      return InferGather();
    if (op == "Shape")
      return InferShapeOp();
    if (op == "Unsqueeze")
      return InferUnsqueeze();
    if (op == "Squeeze")
      return InferSqueeze();
    if (op == "Slice")
      return InferSlice();
    if (op == "Cast")
      return InferCast();
    if (op == "Equal")
      return InferEqual();
    if (op == "Where")
      return InferWhere();
    if (op == "Expand")
      return InferExpand();
    if (op == "ConstantOfShape")
      return InferConstantOfShape();
    if (op == "Range")
      return InferRange();
    if (op == "ReduceMean" || op == "ReduceSum")
      return InferReduce();
    if (op == "Pow")
      return InferPow();
    if (op == "LayerNormalization")
      return InferLayerNormalization();
    if (op == "LeakyRelu")
      return InferUnary({"alpha"});
    if (op == "HardSigmoid")
      return InferUnary({"alpha", "beta"});
    if (op == "Clip")
      return InferClip();
    if (op == "Dropout")
      return InferDropout();
    if (op == "Pad")
      return InferPad();
    if (op == "Softmax")
      return InferSoftmax();
    if (op == "Gemm")
      return InferGemm();
    if (op == "MatMul")
      return InferMatMul();
    if (op == "Conv")
      return InferConv();
    if (op == "MaxPool" || op == "AveragePool")
      return InferPool();
    if (op == "GlobalAveragePool" || op == "GlobalMaxPool")
      return InferGlobalPool();
    if (op == "BatchNormalization")
      return InferBatchNormalization();
    if (op == "Flatten")
      return InferFlatten();
    if (op == "Reshape")
      return InferReshape();
    if (op == "Transpose")
      return InferTranspose();
    if (op == "Concat")
      return InferConcat();
    if (op == "QuantizeLinear" || op == "DequantizeLinear")
      return InferQuantization();
    return Error(StatusCode::kUnimplemented, "unsupported operator " + op);
  }

  Status Error(StatusCode code, const std::string& reason) const {
    return {code, DescribeNode(node_) + ": " + reason};
  }
  Status Mismatch(const std::string& reason) const {
    return Error(StatusCode::kInvalidArgument, "shape mismatch: " + reason);
  }
  // core's rule on the known dimensions of `shape`, which `what` names after the node.
  Status CheckBound(const Shape& shape, const std::string& what) const {
    Status status = CheckKnownElementCount(shape, what);
    return status.ok() ? status : Error(status.code(), status.message());
  }
  Status Overflow(const std::string& what) const {
    return Error(StatusCode::kInvalidArgument,
                 what + " overflows the limit of 2^40 (" + std::to_string(kMaxElementCount) + ")");
  }

  // Input and output counts; trailing omitted outputs do not count.
  Status CheckArity(std::size_t min_inputs, std::size_t max_inputs, std::size_t max_outputs) {
    if (inputs_.size() < min_inputs || inputs_.size() > max_inputs) {
      std::string expected = min_inputs == max_inputs
                                 ? std::to_string(min_inputs)
                                 : std::to_string(min_inputs) + " to " + std::to_string(max_inputs);
      return Error(StatusCode::kInvalidArgument,
                   "takes " + expected + " inputs, got " + std::to_string(inputs_.size()));
    }
    for (std::size_t i = 0; i < min_inputs; ++i) {
      if (inputs_[i] == nullptr)
        return Error(StatusCode::kInvalidArgument,
                     "required input " + std::to_string(i) + " is omitted");
    }
    if (node_.outputs.empty() || node_.outputs[0].empty())
      return Error(StatusCode::kInvalidArgument, "has no output");
    for (std::size_t i = max_outputs; i < node_.outputs.size(); ++i) {
      if (!node_.outputs[i].empty())
        return Error(StatusCode::kUnimplemented, "optional output " + std::to_string(i) + " ('" +
                                                     node_.outputs[i] + "') is not supported");
    }
    return Status::Ok();
  }

  // Activations are FP32; `allowed_int64_input` is an input index that must be INT64 instead.
  Status CheckTypes(std::optional<std::size_t> int64_input = std::nullopt) {
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      if (inputs_[i] == nullptr)
        continue;
      DataType expected = int64_input == i ? DataType::kInt64 : DataType::kFloat32;
      if (inputs_[i]->type != expected)
        return Error(StatusCode::kUnimplemented,
                     "unsupported data type " + std::string(ToString(inputs_[i]->type)) +
                         " for input " + std::to_string(i) + " ('" + node_.inputs[i] +
                         "'), expected " + std::string(ToString(expected)));
    }
    return Status::Ok();
  }

  const Shape& In(std::size_t i) const { return inputs_[i]->shape; }
  bool Has(std::size_t i) const { return i < inputs_.size() && inputs_[i] != nullptr; }
  void SetOutput(Shape shape, DataType type = DataType::kFloat32) {
    outputs_[0] = TensorInfo{type, std::move(shape)};
  }

  // --- attributes -------------------------------------------------------------------------------

  template <typename T>
  Status Attr(std::string_view key, const T& fallback, T* out, std::string_view type_name) const {
    auto it = node_.attributes.find(key);
    if (it == node_.attributes.end()) {
      *out = fallback;
      return Status::Ok();
    }
    if (const T* value = std::get_if<T>(&it->second)) {
      *out = *value;
      return Status::Ok();
    }
    return Error(StatusCode::kInvalidArgument,
                 "attribute '" + std::string(key) + "' must be " + std::string(type_name));
  }
  Status Int(std::string_view key, int64_t fallback, int64_t* out) const {
    return Attr<int64_t>(key, fallback, out, "an INT");
  }
  Status Float(std::string_view key, float fallback, float* out) const {
    return Attr<float>(key, fallback, out, "a FLOAT");
  }
  Status Ints(std::string_view key, const std::vector<int64_t>& fallback,
              std::vector<int64_t>* out) const {
    return Attr<std::vector<int64_t>>(key, fallback, out, "INTS");
  }
  Status String(std::string_view key, const std::string& fallback, std::string* out) const {
    return Attr<std::string>(key, fallback, out, "a STRING");
  }
  bool HasAttr(std::string_view key) const { return node_.attributes.contains(key); }

  // Resolves a possibly negative axis against `rank`; the valid range is [-rank, rank + extra).
  Status Axis(std::string_view key, int64_t fallback, std::size_t rank, int64_t extra,
              std::size_t* axis) const {
    int64_t value = 0;
    BACKPLANE_RETURN_IF_ERROR(Int(key, fallback, &value));
    const auto r = static_cast<int64_t>(rank);
    if (value < -r || value >= r + extra)
      return Error(StatusCode::kInvalidArgument,
                   "attribute '" + std::string(key) + "' = " + std::to_string(value) +
                       " is out of range for rank " + std::to_string(rank));
    *axis = static_cast<std::size_t>(value < 0 ? value + r : value);
    return Status::Ok();
  }

  // --- dimension algebra ------------------------------------------------------------------------

  // Multidirectional (numpy) broadcasting: the SDK's rule (op_rules.hpp).
  Status Broadcast(const Shape& a, const Shape& b, Shape* out) const {
    auto shape = op_rules::Broadcast(a, b);
    if (!shape.ok())
      return Mismatch(shape.error().message());
    *out = std::move(shape).value();
    return Status::Ok();
  }

  // Two dimensions that must be equal: the known one wins.
  Status MergeDim(int64_t a, int64_t b, const std::string& what, int64_t* out) const {
    if (Known(a) && Known(b) && a != b)
      return Mismatch(what + ": " + std::to_string(a) + " vs " + std::to_string(b));
    *out = Known(a) ? a : b;
    return Status::Ok();
  }

  Status RequireRank(std::size_t input, std::size_t min_rank, std::size_t max_rank) const {
    const std::size_t rank = In(input).size();
    if (rank < min_rank || rank > max_rank) {
      std::string expected = min_rank == max_rank ? std::to_string(min_rank)
                             : max_rank == SIZE_MAX
                                 ? "at least " + std::to_string(min_rank)
                                 : std::to_string(min_rank) + " to " + std::to_string(max_rank);
      return Mismatch("input " + std::to_string(input) + " ('" + node_.inputs[input] +
                      "') has rank " + std::to_string(rank) + " (shape " + ShapeText(In(input)) +
                      "), expected rank " + expected);
    }
    return Status::Ok();
  }

  // --- operators --------------------------------------------------------------------------------

  // Add, Sub, Mul, Div: FP32, or integers as shape computations use them (both inputs alike).
  Status InferBroadcast() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(2, 2, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({0, 1}, kNumberTypes));
    Shape shape;
    BACKPLANE_RETURN_IF_ERROR(Broadcast(In(0), In(1), &shape));
    SetOutput(std::move(shape), inputs_[0]->type);
    return Status::Ok();
  }

  // `float_attributes` are checked to be FLOATs (LeakyRelu's alpha, HardSigmoid's alpha, beta).
  Status InferUnary(std::initializer_list<std::string_view> float_attributes = {}) {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 1, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
    for (std::string_view key : float_attributes) {
      float value = 0;
      BACKPLANE_RETURN_IF_ERROR(Float(key, 0, &value));
    }
    SetOutput(In(0));
    return Status::Ok();
  }

  // An optional input that a backend reads once, at load time (Clip's bounds, Dropout's
  // training_mode): present means a constant holding a single element of `type`, which it
  // returns; null when the input is omitted.
  Result<const Tensor*> ScalarConstant(std::size_t index, std::string_view role,
                                       DataType type) const {
    if (!Has(index))
      return static_cast<const Tensor*>(nullptr);
    const std::string what =
        std::string(role) + " input " + std::to_string(index) + " ('" + node_.inputs[index] + "')";
    auto constant = constants_.find(node_.inputs[index]);
    if (constant == constants_.end())
      return Error(StatusCode::kUnimplemented,
                   what +
                       " must be a constant (an initializer or a Constant node): it is read "
                       "once, when the network is loaded");
    const TensorInfo& info = constant->second.info();
    if (info.type != type)
      return Error(StatusCode::kInvalidArgument, what + " must be " + std::string(ToString(type)) +
                                                     ", is " + std::string(ToString(info.type)));
    if (ElementCount(info.shape) != 1)
      return Error(StatusCode::kInvalidArgument,
                   what + " must be a scalar, has shape " + ShapeText(info.shape));
    return &constant->second;
  }

  Status InferClip() {
    // Clip-6 took min and max as attributes; import rewrites them into inputs below opset 11
    // (opset_upgrade.cpp). From 11 on they are inputs, and an attribute of that name would be
    // silently ignored by a backend.
    for (std::string_view key : {"min", "max"}) {
      if (HasAttr(key))
        return Error(StatusCode::kInvalidArgument,
                     "attribute '" + std::string(key) +
                         "' is Clip-6's; from opset 11 min and max are inputs 1 and 2");
    }
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 3, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
    for (std::size_t i = 1; i <= 2; ++i) {
      auto bound = ScalarConstant(i, i == 1 ? "min" : "max", DataType::kFloat32);
      if (!bound.ok())
        return bound.error();
    }
    SetOutput(In(0));
    return Status::Ok();
  }

  Status InferDropout() {
    // Inference only: output 0 is the input. training_mode is checked first, so that a training
    // graph hears "training is not supported" rather than a complaint about its mask.
    auto training = ScalarConstant(2, "training_mode", DataType::kBool);
    if (!training.ok())
      return training.error();
    if (*training != nullptr && (*training)->Elements<uint8_t>()[0] != 0)
      return Error(StatusCode::kUnimplemented,
                   "training_mode input 2 ('" + node_.inputs[2] +
                       "') is true: only inference (training_mode absent or false) is supported");
    if (node_.outputs.size() > 1 && !node_.outputs[1].empty())
      return Error(StatusCode::kUnimplemented,
                   "output 1 ('" + node_.outputs[1] +
                       "') is the BOOL mask, and BOOL tensors are not supported (the mask is all "
                       "true in inference: drop the output)");
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 3, 1));
    // ratio (input 1) is FP32 and unused in inference; training_mode was checked above.
    for (std::size_t i = 0; i < 2 && i < inputs_.size(); ++i) {
      if (inputs_[i] != nullptr && inputs_[i]->type != DataType::kFloat32)
        return Error(StatusCode::kUnimplemented, "unsupported data type " +
                                                     std::string(ToString(inputs_[i]->type)) +
                                                     " for input " + std::to_string(i) + " ('" +
                                                     node_.inputs[i] + "'), expected FP32");
    }
    if (Has(1) && Product(In(1)) > 1)
      return Error(StatusCode::kInvalidArgument, "ratio input 1 ('" + node_.inputs[1] +
                                                     "') must be a scalar, has shape " +
                                                     ShapeText(In(1)));
    SetOutput(In(0));
    return Status::Ok();
  }

  Status InferSoftmax() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 1, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
    std::size_t axis = 0;
    // Opset 13 changed the default axis from 1 (with 2-D coercion) to -1; shapes are unchanged.
    // Import rewrites every older Softmax into an opset-13 form that means the same, after
    // inference (opset_upgrade.cpp).
    BACKPLANE_RETURN_IF_ERROR(Axis("axis", opset_ >= 13 ? -1 : 1, In(0).size(), 0, &axis));
    SetOutput(In(0));
    return Status::Ok();
  }

  Status InferGemm() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(2, 3, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
    BACKPLANE_RETURN_IF_ERROR(RequireRank(0, 2, 2));
    BACKPLANE_RETURN_IF_ERROR(RequireRank(1, 2, 2));
    int64_t trans_a = 0;
    int64_t trans_b = 0;
    BACKPLANE_RETURN_IF_ERROR(Int("transA", 0, &trans_a));
    BACKPLANE_RETURN_IF_ERROR(Int("transB", 0, &trans_b));
    const Shape& a = In(0);
    const Shape& b = In(1);
    const int64_t m = trans_a ? a[1] : a[0];
    const int64_t k_a = trans_a ? a[0] : a[1];
    const int64_t k_b = trans_b ? b[1] : b[0];
    const int64_t n = trans_b ? b[0] : b[1];
    int64_t k = 0;
    BACKPLANE_RETURN_IF_ERROR(
        MergeDim(k_a, k_b, "inner dimensions of A " + ShapeText(a) + " and B " + ShapeText(b), &k));
    if (Has(2)) {
      // C broadcasts one way, to [M, N].
      const Shape& c = In(2);
      const Shape target = {m, n};
      if (c.size() > 2)
        return Mismatch("C " + ShapeText(c) +
                        " does not broadcast to [M,N] = " + ShapeText(target));
      for (std::size_t i = 0; i < c.size(); ++i) {
        const int64_t want = target[2 - c.size() + i];
        if (Known(c[i]) && c[i] != 1 && Known(want) && c[i] != want)
          return Mismatch("C " + ShapeText(c) +
                          " does not broadcast to [M,N] = " + ShapeText(target));
      }
    }
    SetOutput({m, n});
    return Status::Ok();
  }

  Status InferMatMul() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(2, 2, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
    BACKPLANE_RETURN_IF_ERROR(RequireRank(0, 1, SIZE_MAX));
    BACKPLANE_RETURN_IF_ERROR(RequireRank(1, 1, SIZE_MAX));
    // numpy.matmul: a 1-D A gets a leading 1, a 1-D B a trailing 1, both removed afterwards.
    Shape a = In(0);
    Shape b = In(1);
    const bool a_vector = a.size() == 1;
    const bool b_vector = b.size() == 1;
    if (a_vector)
      a.insert(a.begin(), 1);
    if (b_vector)
      b.push_back(1);
    int64_t k = 0;
    BACKPLANE_RETURN_IF_ERROR(
        MergeDim(a[a.size() - 1], b[b.size() - 2],
                 "inner dimensions of " + ShapeText(In(0)) + " and " + ShapeText(In(1)), &k));
    Shape batch;
    Status status = Broadcast(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2), &batch);
    if (!status.ok())
      return Mismatch("batch dimensions of " + ShapeText(In(0)) + " and " + ShapeText(In(1)) +
                      " cannot be broadcast");
    if (!a_vector)
      batch.push_back(a[a.size() - 2]);
    if (!b_vector)
      batch.push_back(b[b.size() - 1]);
    SetOutput(std::move(batch));
    return Status::Ok();
  }

  // The window attributes of Conv and the pools, checked by the SDK's rule (op_rules.hpp).
  Status ReadWindow(std::size_t spatial, op_rules::WindowOp op,
                    op_rules::WindowAttributes* window) const {
    auto read = op_rules::ReadWindowAttributes(node_.attributes, spatial, op);
    if (!read.ok())
      return Error(read.error().code(), read.error().message());
    *window = std::move(read).value();
    return Status::Ok();
  }

  // Conv and the pools: N x `channels` x the window's positions along each spatial dimension of
  // `x`; unknown where the input's or the kernel's dimension is.
  Status SetWindowedOutput(const op_rules::WindowAttributes& window,
                           std::span<const int64_t> kernel, const Shape& x, int64_t channels) {
    auto dims = op_rules::ResolveWindow(window, std::span(x).subspan(2), kernel);
    if (!dims.ok())
      return Error(dims.error().code(), dims.error().message());
    Shape out = {x[0], channels};
    const Shape spatial = op_rules::WindowOutputDims(dims.value());
    out.insert(out.end(), spatial.begin(), spatial.end());
    SetOutput(std::move(out));
    return Status::Ok();
  }

  Status InferConv() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(2, 3, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
    BACKPLANE_RETURN_IF_ERROR(RequireRank(0, 3, SIZE_MAX));
    const Shape& x = In(0);
    const Shape& w = In(1);
    const std::size_t spatial = x.size() - 2;
    BACKPLANE_RETURN_IF_ERROR(RequireRank(1, x.size(), x.size()));
    int64_t group = 1;
    BACKPLANE_RETURN_IF_ERROR(Int("group", 1, &group));
    if (group < 1)
      return Error(StatusCode::kInvalidArgument, "group must be positive");
    const int64_t channels = x[1];
    const int64_t filters = w[0];
    // group comes from the model: w[1] x group is bounded, else it could wrap to x's channels.
    const auto expected_channels = BoundedMul(w[1], group);
    if (Known(channels) && Known(w[1]) && expected_channels != channels)
      return Mismatch("input '" + node_.inputs[0] + "' " + ShapeText(x) + " has " +
                      std::to_string(channels) + " channels, weight '" + node_.inputs[1] + "' " +
                      ShapeText(w) + " expects " + std::to_string(w[1]) + " x group " +
                      std::to_string(group) + " = " +
                      (expected_channels ? std::to_string(*expected_channels) : "too many"));
    if (Known(filters) && filters % group != 0)
      return Mismatch("weight count " + std::to_string(filters) + " is not divisible by group " +
                      std::to_string(group));
    if (Has(2)) {
      BACKPLANE_RETURN_IF_ERROR(RequireRank(2, 1, 1));
      int64_t merged = 0;
      BACKPLANE_RETURN_IF_ERROR(
          MergeDim(In(2)[0], filters, "bias length vs number of filters", &merged));
    }
    op_rules::WindowAttributes window;
    BACKPLANE_RETURN_IF_ERROR(ReadWindow(spatial, op_rules::WindowOp::kConv, &window));
    // W's spatial dims are the kernel; a kernel_shape must agree with the known ones.
    Shape kernel(w.begin() + 2, w.end());
    for (std::size_t i = 0; i < window.kernel_shape.size(); ++i) {
      BACKPLANE_RETURN_IF_ERROR(MergeDim(window.kernel_shape[i], kernel[i],
                                         "kernel_shape vs weight " + ShapeText(w), &kernel[i]));
    }
    return SetWindowedOutput(window, kernel, x, filters);
  }

  Status InferPool() {
    // MaxPool's optional Indices output is INT64 and not supported.
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 1, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
    BACKPLANE_RETURN_IF_ERROR(RequireRank(0, 3, SIZE_MAX));
    const Shape& x = In(0);
    op_rules::WindowAttributes window;
    BACKPLANE_RETURN_IF_ERROR(ReadWindow(x.size() - 2, op_rules::WindowOp::kPool, &window));
    int64_t storage_order = 0;
    BACKPLANE_RETURN_IF_ERROR(Int("storage_order", 0, &storage_order));
    return SetWindowedOutput(window, window.kernel_shape, x, x[1]);
  }

  Status InferGlobalPool() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 1, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
    BACKPLANE_RETURN_IF_ERROR(RequireRank(0, 3, SIZE_MAX));
    Shape out = In(0);
    std::fill(out.begin() + 2, out.end(), 1);
    SetOutput(std::move(out));
    return Status::Ok();
  }

  Status InferBatchNormalization() {
    // Inference mode only: the running-statistics outputs exist in training mode.
    BACKPLANE_RETURN_IF_ERROR(CheckArity(5, 5, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
    int64_t training_mode = 0;
    BACKPLANE_RETURN_IF_ERROR(Int("training_mode", 0, &training_mode));
    if (training_mode != 0)
      return Error(StatusCode::kUnimplemented, "training_mode=1 is not supported");
    int64_t spatial = 1;
    BACKPLANE_RETURN_IF_ERROR(Int("spatial", 1, &spatial));
    if (spatial != 1)
      return Error(StatusCode::kUnimplemented, "spatial=0 is not supported");
    BACKPLANE_RETURN_IF_ERROR(RequireRank(0, 2, SIZE_MAX));
    const int64_t channels = In(0)[1];
    static constexpr std::array<std::string_view, 5> kNames = {"X", "scale", "B", "mean", "var"};
    for (std::size_t i = 1; i < 5; ++i) {
      BACKPLANE_RETURN_IF_ERROR(RequireRank(i, 1, 1));
      int64_t merged = 0;
      BACKPLANE_RETURN_IF_ERROR(MergeDim(
          In(i)[0], channels,
          std::string(kNames[i]) + " length vs channels of X " + ShapeText(In(0)), &merged));
    }
    SetOutput(In(0));
    return Status::Ok();
  }

  Status InferFlatten() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 1, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
    const Shape& x = In(0);
    std::size_t axis = 0;
    BACKPLANE_RETURN_IF_ERROR(Axis("axis", 1, x.size(), 1, &axis));
    const std::span<const int64_t> dims(x);
    SetOutput({Product(dims.first(axis)), Product(dims.subspan(axis))});
    return Status::Ok();
  }

  Status InferReshape() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(2, 2, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({0}, kAnyType));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({1}, {DataType::kInt64}));
    if (In(1).size() != 1)
      return Error(StatusCode::kInvalidArgument,
                   "shape input '" + node_.inputs[1] + "' must be 1-D, is " + ShapeText(In(1)));
    int64_t allow_zero = 0;
    BACKPLANE_RETURN_IF_ERROR(Int("allowzero", 0, &allow_zero));
    const Shape& x = In(0);
    // The shape is a constant, or computed from input shapes only (Shape -> Gather -> Concat, as
    // exporters write it) and folded here; before the input shapes are known only its length is.
    const auto known = IntValues(1);
    if (!known) {
      BACKPLANE_RETURN_IF_ERROR(RequireValue(1, "shape"));
      SetOutput(Shape(static_cast<std::size_t>(In(1)[0]), kDynamic), inputs_[0]->type);
      return Status::Ok();
    }
    const std::vector<int64_t>& requested = *known;
    Shape out;
    std::optional<std::size_t> inferred;
    bool has_zero = false;
    for (std::size_t i = 0; i < requested.size(); ++i) {
      const int64_t dim = requested[i];
      if (dim == -1) {
        if (inferred)
          return Error(StatusCode::kInvalidArgument, "shape has more than one -1");
        inferred = i;
        out.push_back(kDynamic);
      } else if (dim == 0 && allow_zero == 0) {
        if (i >= x.size())
          return Mismatch("shape element " + std::to_string(i) +
                          " is 0 (copy the input dimension) but the input " + ShapeText(x) +
                          " has rank " + std::to_string(x.size()));
        out.push_back(x[i]);
      } else if (dim < 0) {
        return Error(StatusCode::kInvalidArgument,
                     "shape element " + std::to_string(i) + " is " + std::to_string(dim));
      } else {
        has_zero = has_zero || dim == 0;
        out.push_back(dim);
      }
    }
    if (inferred && has_zero)
      return Error(StatusCode::kInvalidArgument, "allowzero=1 forbids a 0 beside a -1 in shape");
    // The requested dimensions come from the model and may multiply past int64 ([2^62+1, 4]
    // wraps to 4 and would pass as a reshape of 4 elements): bounded before any count is taken.
    BACKPLANE_RETURN_IF_ERROR(
        CheckBound(out, "the requested shape (input '" + node_.inputs[1] + "')"));
    const int64_t input_count = Product(x);
    if (inferred) {
      // Dimensions copied with 0 appear on both sides and cancel, so that [0,-1] resolves the
      // -1 even when the copied batch dimension is dynamic.
      Shape input_rest;
      Shape output_rest;
      for (std::size_t i = 0; i < x.size(); ++i) {
        if (!(i < requested.size() && requested[i] == 0 && allow_zero == 0))
          input_rest.push_back(x[i]);
      }
      for (std::size_t i = 0; i < out.size(); ++i) {
        if (i != *inferred && !(requested[i] == 0 && allow_zero == 0))
          output_rest.push_back(out[i]);
      }
      const int64_t numerator = Product(input_rest);
      const int64_t denominator = Product(output_rest);
      if (Known(numerator) && Known(denominator)) {
        if (denominator == 0 || numerator % denominator != 0)
          return Mismatch("cannot reshape " + ShapeText(x) + " to " + ShapeText(out) +
                          " (element counts differ)");
        out[*inferred] = numerator / denominator;
      }
    } else {
      const int64_t output_count = Product(out);
      if (Known(input_count) && Known(output_count) && input_count != output_count)
        return Mismatch("cannot reshape " + ShapeText(x) + " (" + std::to_string(input_count) +
                        " elements) to " + ShapeText(out) + " (" + std::to_string(output_count) +
                        " elements)");
    }
    SetOutput(std::move(out), inputs_[0]->type);
    return Status::Ok();
  }

  Status InferTranspose() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 1, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({0}, kAnyType));
    const Shape& x = In(0);
    std::vector<int64_t> reversed(x.size());
    std::iota(reversed.rbegin(), reversed.rend(), 0);
    std::vector<int64_t> perm;
    BACKPLANE_RETURN_IF_ERROR(Ints("perm", reversed, &perm));
    if (perm.size() != x.size())
      return Error(StatusCode::kInvalidArgument, "perm has " + std::to_string(perm.size()) +
                                                     " values for input rank " +
                                                     std::to_string(x.size()));
    std::vector<bool> seen(x.size(), false);
    Shape out;
    for (int64_t axis : perm) {
      if (axis < 0 || axis >= static_cast<int64_t>(x.size()) || seen[axis])
        return Error(StatusCode::kInvalidArgument, "perm is not a permutation of the axes");
      seen[axis] = true;
      out.push_back(x[axis]);
    }
    SetOutput(std::move(out), inputs_[0]->type);
    return Status::Ok();
  }

  Status InferConcat() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, SIZE_MAX, 1));
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      if (inputs_[i] == nullptr)
        return Error(StatusCode::kInvalidArgument, "input " + std::to_string(i) + " is omitted");
    }
    std::vector<std::size_t> all(inputs_.size());
    std::iota(all.begin(), all.end(), 0);
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn(all, kAnyType));
    if (!HasAttr("axis"))
      return Error(StatusCode::kInvalidArgument, "attribute 'axis' is required");
    const Shape& first = In(0);
    std::size_t axis = 0;
    BACKPLANE_RETURN_IF_ERROR(Axis("axis", 0, first.size(), 0, &axis));
    Shape out = first;
    for (std::size_t i = 1; i < inputs_.size(); ++i) {
      const Shape& shape = In(i);
      if (shape.size() != first.size())
        return Mismatch("input " + std::to_string(i) + " " + ShapeText(shape) +
                        " has another rank than input 0 " + ShapeText(first));
      for (std::size_t d = 0; d < shape.size(); ++d) {
        if (d == axis) {
          if (Known(out[d]) && Known(shape[d])) {
            // Each input is within the bound, but enough of them can add up past int64.
            const auto sum = BoundedAdd(out[d], shape[d]);
            if (!sum)
              return Overflow("the concatenated axis " + std::to_string(axis) +
                              " (the sum of the inputs' dimensions)");
            out[d] = *sum;
          } else {
            out[d] = kDynamic;
          }
        } else if (Known(out[d]) && Known(shape[d]) && out[d] != shape[d]) {
          return Mismatch("input " + std::to_string(i) + " " + ShapeText(shape) +
                          " differs from input 0 " + ShapeText(first) + " outside axis " +
                          std::to_string(axis));
        } else if (!Known(out[d])) {
          out[d] = shape[d];
        }
      }
    }
    SetOutput(std::move(out), inputs_[0]->type);
    return Status::Ok();
  }

  Status InferPad() {
    // Pad-2 took pads as an attribute; import rewrites it into an input below opset 11
    // (opset_upgrade.cpp). From 11 on an attribute of that name would be silently ignored.
    if (HasAttr("pads") || HasAttr("value"))
      return Error(StatusCode::kInvalidArgument,
                   "attributes 'pads' and 'value' are Pad-2's; from opset 11 they are inputs 1 "
                   "and 2");
    std::string mode_text;
    BACKPLANE_RETURN_IF_ERROR(String("mode", "constant", &mode_text));
    const auto mode = op_rules::ParsePadMode(mode_text);
    if (!mode)
      return Error(StatusCode::kInvalidArgument,
                   "unknown mode '" + mode_text + "' (ONNX has constant, reflect, edge and wrap)");
    if (*mode != op_rules::PadMode::kConstant)
      return Error(StatusCode::kUnimplemented,
                   "mode '" + mode_text + "' is not supported (only 'constant')");
    if (Has(3))
      return Error(StatusCode::kUnimplemented, "the axes input 3 ('" + node_.inputs[3] +
                                                   "') is not supported: give pads for every axis");
    BACKPLANE_RETURN_IF_ERROR(CheckArity(2, 4, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes(/*int64_input=*/1));
    auto value = ScalarConstant(2, "constant_value", DataType::kFloat32);
    if (!value.ok())
      return value.error();
    auto pads = constants_.find(node_.inputs[1]);
    if (pads == constants_.end())
      return Error(StatusCode::kUnimplemented,
                   "pads input 1 ('" + node_.inputs[1] +
                       "') must be a constant (an initializer or a Constant node)");
    if (pads->second.info().shape.size() != 1)
      return Error(StatusCode::kInvalidArgument, "pads input 1 ('" + node_.inputs[1] +
                                                     "') must be 1-D, is " +
                                                     ShapeText(pads->second.info().shape));
    auto shape = op_rules::PaddedShape(In(0), pads->second.Elements<int64_t>());
    if (!shape.ok())
      return Error(shape.error().code(), shape.error().message());
    SetOutput(std::move(shape).value());
    return Status::Ok();
  }

  // QuantizeLinear: FP32 x to the zero point's type (UINT8 when it is omitted);
  // DequantizeLinear: UINT8, INT8 or INT32 x to FP32, its zero point of x's type. The scale and
  // zero point are one value for the whole tensor (a scalar, or a 1-D tensor of one element, as
  // ONNX's reference broadcasts it) or one per index of `axis` (a 1-D tensor of that length).
  Status InferQuantization() {
    const bool quantize = node_.op_type == "QuantizeLinear";
    // Opset 21 added blocked quantization and 21/23 an output_dtype: neither is implemented, and
    // an attribute ignored here would be a wrong answer.
    int64_t block_size = 0;
    BACKPLANE_RETURN_IF_ERROR(Int("block_size", 0, &block_size));
    if (block_size != 0)
      return Error(
          StatusCode::kUnimplemented,
          "blocked quantization (block_size " + std::to_string(block_size) + ") is not supported");
    if (HasAttr("output_dtype"))
      return Error(StatusCode::kUnimplemented,
                   "attribute 'output_dtype' is not supported: give a zero point of the type "
                   "wanted");
    BACKPLANE_RETURN_IF_ERROR(CheckArity(2, 3, 1));
    const DataType x_type = inputs_[0]->type;
    if (quantize
            ? x_type != DataType::kFloat32
            : x_type != DataType::kUint8 && x_type != DataType::kInt8 && x_type != DataType::kInt32)
      return Error(StatusCode::kUnimplemented,
                   "unsupported data type " + std::string(ToString(x_type)) + " for input 0 ('" +
                       node_.inputs[0] + "'), expected " +
                       (quantize ? "FP32" : "UINT8, INT8 or INT32"));
    if (inputs_[1]->type != DataType::kFloat32)
      return Error(StatusCode::kUnimplemented,
                   "unsupported data type " + std::string(ToString(inputs_[1]->type)) +
                       " for the scale, input 1 ('" + node_.inputs[1] + "'), expected FP32");
    DataType output_type = quantize ? DataType::kUint8 : DataType::kFloat32;
    if (Has(2)) {
      const DataType zero_type = inputs_[2]->type;
      const bool allowed = quantize ? zero_type == DataType::kUint8 || zero_type == DataType::kInt8
                                    : zero_type == x_type;
      if (!allowed)
        return Error(StatusCode::kInvalidArgument,
                     "the zero point, input 2 ('" + node_.inputs[2] + "'), is " +
                         std::string(ToString(zero_type)) + ", expected " +
                         (quantize ? std::string("UINT8 or INT8")
                                   : std::string(ToString(x_type)) + " as input 0"));
      if (quantize)
        output_type = zero_type;
      if (In(2) != In(1))
        return Mismatch("the zero point, input 2 ('" + node_.inputs[2] + "') " + ShapeText(In(2)) +
                        ", and the scale, input 1 ('" + node_.inputs[1] + "') " + ShapeText(In(1)) +
                        ", must have the same shape");
    }
    const Shape& scale = In(1);
    if (scale.size() > 1)
      return Error(StatusCode::kUnimplemented,
                   "the scale, input 1 ('" + node_.inputs[1] + "'), has shape " + ShapeText(scale) +
                       ": only a scalar (per tensor) or a 1-D tensor (per axis) is supported");
    const bool per_axis = scale.size() == 1 && scale[0] != 1;
    if (per_axis) {
      // Before opset 13 the operators had no axis: a scale had to be a scalar.
      if (opset_ < 13)
        return Error(StatusCode::kInvalidArgument,
                     "a 1-D scale " + ShapeText(scale) +
                         " (per axis) needs opset 13, the model's is " + std::to_string(opset_));
      std::size_t axis = 0;
      BACKPLANE_RETURN_IF_ERROR(Axis("axis", 1, In(0).size(), 0, &axis));
      int64_t merged = 0;
      BACKPLANE_RETURN_IF_ERROR(MergeDim(scale[0], In(0)[axis],
                                         "per-axis scale and zero point length vs dimension " +
                                             std::to_string(axis) + " of input 0 ('" +
                                             node_.inputs[0] + "') " + ShapeText(In(0)),
                                         &merged));
    }
    BACKPLANE_RETURN_IF_ERROR(CheckConstantScale());
    SetOutput(In(0), output_type);
    return Status::Ok();
  }

  // A scale known at load must be a finite positive number: x / 0 has no quantized value, and a
  // negative or NaN scale is a broken model, not a choice. A scale computed at run time is the
  // model's own business, as it is for ONNX Runtime.
  Status CheckConstantScale() const {
    auto constant = constants_.find(node_.inputs[1]);
    if (constant == constants_.end())
      return Status::Ok();
    const auto values = constant->second.Elements<float>();
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (!(std::isfinite(values[i]) && values[i] > 0))
        return Error(StatusCode::kInvalidArgument,
                     "the scale, input 1 ('" + node_.inputs[1] + "'), is " +
                         std::to_string(values[i]) +
                         (values.size() > 1 ? " at index " + std::to_string(i) : "") +
                         ": a scale must be finite and greater than zero");
    }
    return Status::Ok();
  }

  // --- types and values for the encoder operators ---------------------------------------------

  static constexpr std::initializer_list<DataType> kAnyType = {DataType::kFloat32, DataType::kInt64,
                                                               DataType::kInt32,   DataType::kBool,
                                                               DataType::kUint8,   DataType::kInt8};
  static constexpr std::initializer_list<DataType> kNumberTypes = {
      DataType::kFloat32, DataType::kInt64, DataType::kInt32};
  static constexpr std::initializer_list<DataType> kSignedTypes = kNumberTypes;
  static constexpr std::initializer_list<DataType> kIndexTypes = {DataType::kInt64,
                                                                  DataType::kInt32};

  static std::string TypeList(std::initializer_list<DataType> types) {
    std::string text;
    for (DataType type : types)
      text += (text.empty() ? "" : ", ") + std::string(ToString(type));
    return text;
  }

  // Inputs `indices` (all given) have one type, one of `types`.
  Status CheckSameTypeIn(std::initializer_list<std::size_t> indices,
                         std::initializer_list<DataType> types) const {
    return CheckSameTypeIn(std::vector<std::size_t>(indices), types);
  }
  Status CheckSameTypeIn(const std::vector<std::size_t>& indices,
                         std::initializer_list<DataType> types) const {
    const DataType first = inputs_[indices.front()]->type;
    for (std::size_t i : indices) {
      const DataType type = inputs_[i]->type;
      if (std::find(types.begin(), types.end(), type) == types.end())
        return Error(StatusCode::kUnimplemented, "unsupported data type " +
                                                     std::string(ToString(type)) + " for input " +
                                                     std::to_string(i) + " ('" + node_.inputs[i] +
                                                     "'), expected " + TypeList(types));
      if (type != first)
        return Error(StatusCode::kInvalidArgument,
                     "input " + std::to_string(i) + " ('" + node_.inputs[i] + "') is " +
                         std::string(ToString(type)) + ", input " +
                         std::to_string(indices.front()) + " is " + std::string(ToString(first)) +
                         ": they must have one type");
    }
    return Status::Ok();
  }

  // The data of input `i` when it is a constant or was folded from shapes; null otherwise.
  const Tensor* ValueOf(std::size_t i) const {
    if (!Has(i))
      return nullptr;
    if (auto it = constants_.find(node_.inputs[i]); it != constants_.end())
      return &it->second;
    if (folded_ != nullptr) {
      if (auto it = folded_->find(node_.inputs[i]); it != folded_->end())
        return &it->second;
    }
    return nullptr;
  }
  // Input `i`'s integer values (INT64 or INT32) when known.
  std::optional<std::vector<int64_t>> IntValues(std::size_t i) const {
    const Tensor* value = ValueOf(i);
    if (value == nullptr)
      return std::nullopt;
    if (value->info().type == DataType::kInt64) {
      const auto data = value->Elements<int64_t>();
      return std::vector<int64_t>(data.begin(), data.end());
    }
    if (value->info().type == DataType::kInt32) {
      const auto data = value->Elements<int32_t>();
      return std::vector<int64_t>(data.begin(), data.end());
    }
    return std::nullopt;
  }
  // An input whose value decides the output's shape and is not known: fine while input shapes
  // are dynamic (the dimensions stay unknown until a request fixes them), refused once they are
  // all known, for then it is computed from data at run time.
  Status RequireValue(std::size_t i, std::string_view role) const {
    if (!concrete_)
      return Status::Ok();
    return Error(StatusCode::kUnimplemented,
                 std::string(role) + " input " + std::to_string(i) + " ('" + node_.inputs[i] +
                     "') is computed from the values of the graph's inputs, not only from their "
                     "shapes: the output's shape would be known only at run time (not "
                     "supported; a constant or a value computed from shapes is)");
  }
  // An input the node reads as a whole at load (Unsqueeze's axes): a constant or a folded value.
  Result<std::vector<int64_t>> RequireIntValues(std::size_t i, std::string_view role) const {
    auto values = IntValues(i);
    if (!values)
      return Error(StatusCode::kUnimplemented,
                   std::string(role) + " input " + std::to_string(i) + " ('" + node_.inputs[i] +
                       "') must be a constant (an initializer or a Constant node) or computed "
                       "from input shapes");
    return std::move(values).value();
  }
  // Axes given as values, each in [-rank, rank), normalised, without repeats.
  Result<std::vector<std::size_t>> NormalizeAxes(const std::vector<int64_t>& axes, std::size_t rank,
                                                 std::string_view what) const {
    std::vector<std::size_t> out;
    const auto r = static_cast<int64_t>(rank);
    for (int64_t axis : axes) {
      if (axis < -r || axis >= r)
        return Error(StatusCode::kInvalidArgument,
                     std::string(what) + " " + ToString(axes) + ": " + std::to_string(axis) +
                         " is out of range for rank " + std::to_string(rank));
      const auto normal = static_cast<std::size_t>(axis < 0 ? axis + r : axis);
      if (std::find(out.begin(), out.end(), normal) != out.end())
        return Error(StatusCode::kInvalidArgument,
                     std::string(what) + " " + ToString(axes) + " names an axis twice");
      out.push_back(normal);
    }
    return out;
  }
  // A scalar input: rank 0, or one element.
  Status RequireScalar(std::size_t i, std::string_view role) const {
    if (Product(In(i)) != 1 && !(In(i).size() == 1 && !Known(In(i)[0])))
      return Error(StatusCode::kInvalidArgument,
                   std::string(role) + " input " + std::to_string(i) + " ('" + node_.inputs[i] +
                       "') must be a scalar, has shape " + ShapeText(In(i)));
    return Status::Ok();
  }
  // Opset-13 forms only: the attribute that older opsets used instead of input `input`.
  Status RefuseAttributeForm(std::string_view key, std::size_t input) const {
    if (!HasAttr(key))
      return Status::Ok();
    return Error(StatusCode::kUnimplemented,
                 "attribute '" + std::string(key) + "' is the form of opsets before 13: give " +
                     std::string(key) + " as input " + std::to_string(input));
  }

  // --- the encoder operators --------------------------------------------------------------------

  // Unary operators of any of `types`, the output of the input's type.
  Status InferTyped(std::initializer_list<DataType> types) {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 1, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({0}, types));
    SetOutput(In(0), inputs_[0]->type);
    return Status::Ok();
  }

  Status InferGather() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(2, 2, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({0}, kAnyType));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({1}, kIndexTypes));
    const Shape& data = In(0);
    if (data.empty())
      return Mismatch("data input 0 ('" + node_.inputs[0] + "') must have rank >= 1");
    std::size_t axis = 0;
    BACKPLANE_RETURN_IF_ERROR(Axis("axis", 0, data.size(), 0, &axis));
    // Indices known now are checked now; the others by the backend, per request.
    if (auto indices = IntValues(1); indices && Known(data[axis])) {
      for (int64_t index : *indices) {
        if (index < -data[axis] || index >= data[axis])
          return Error(StatusCode::kInvalidArgument,
                       "index " + std::to_string(index) + " (input 1, '" + node_.inputs[1] +
                           "') is out of range for dimension " + std::to_string(axis) + " of " +
                           ShapeText(data));
      }
    }
    Shape out(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(axis));
    out.insert(out.end(), In(1).begin(), In(1).end());
    out.insert(out.end(), data.begin() + static_cast<std::ptrdiff_t>(axis) + 1, data.end());
    SetOutput(std::move(out), inputs_[0]->type);
    return Status::Ok();
  }

  // Shape-15's start and end, clamped to [0, rank] after adding rank to a negative one.
  static std::pair<int64_t, int64_t> ShapeRange(int64_t start, int64_t end, int64_t rank) {
    auto clamp = [rank](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
    return {clamp(start), clamp(end)};
  }

  Status InferShapeOp() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 1, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({0}, kAnyType));
    const auto rank = static_cast<int64_t>(In(0).size());
    int64_t start = 0;
    int64_t end = rank;
    BACKPLANE_RETURN_IF_ERROR(Int("start", 0, &start));
    BACKPLANE_RETURN_IF_ERROR(Int("end", rank, &end));
    const auto [from, to] = ShapeRange(start, end, rank);
    SetOutput({std::max<int64_t>(to - from, 0)}, DataType::kInt64);
    return Status::Ok();
  }

  Status InferUnsqueeze() {
    BACKPLANE_RETURN_IF_ERROR(RefuseAttributeForm("axes", 1));
    BACKPLANE_RETURN_IF_ERROR(CheckArity(2, 2, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({0}, kAnyType));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({1}, {DataType::kInt64}));
    auto axes = RequireIntValues(1, "axes");
    if (!axes.ok())
      return axes.error();
    const std::size_t rank = In(0).size() + axes->size();
    auto normal = NormalizeAxes(*axes, rank, "axes");
    if (!normal.ok())
      return normal.error();
    Shape out;
    std::size_t next = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      const bool inserted = std::find(normal->begin(), normal->end(), d) != normal->end();
      out.push_back(inserted ? 1 : In(0)[next++]);
    }
    SetOutput(std::move(out), inputs_[0]->type);
    return Status::Ok();
  }

  Status InferSqueeze() {
    BACKPLANE_RETURN_IF_ERROR(RefuseAttributeForm("axes", 1));
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 2, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({0}, kAnyType));
    const Shape& x = In(0);
    std::vector<std::size_t> squeezed;
    if (Has(1)) {
      BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({1}, {DataType::kInt64}));
      auto axes = RequireIntValues(1, "axes");
      if (!axes.ok())
        return axes.error();
      auto normal = NormalizeAxes(*axes, x.size(), "axes");
      if (!normal.ok())
        return normal.error();
      for (std::size_t axis : *normal) {
        if (Known(x[axis]) && x[axis] != 1)
          return Mismatch("axis " + std::to_string(axis) + " of input 0 " + ShapeText(x) +
                          " is not 1 and cannot be squeezed");
      }
      squeezed = std::move(normal).value();
    } else {
      for (std::size_t d = 0; d < x.size(); ++d) {
        if (!Known(x[d]))
          return Error(StatusCode::kUnimplemented,
                       "without axes, which dimensions of input 0 " + ShapeText(x) +
                           " are squeezed depends on its unknown dimensions: give axes");
        if (x[d] == 1)
          squeezed.push_back(d);
      }
    }
    Shape out;
    for (std::size_t d = 0; d < x.size(); ++d) {
      if (std::find(squeezed.begin(), squeezed.end(), d) == squeezed.end())
        out.push_back(x[d]);
    }
    SetOutput(std::move(out), inputs_[0]->type);
    return Status::Ok();
  }

  Status InferSlice() {
    for (std::string_view key : {"starts", "ends", "axes"})
      BACKPLANE_RETURN_IF_ERROR(RefuseAttributeForm(key, key == "starts" ? 1 : 2));
    BACKPLANE_RETURN_IF_ERROR(CheckArity(3, 5, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({0}, kAnyType));
    std::vector<std::size_t> index_inputs = {1, 2};
    for (std::size_t i = 3; i < 5; ++i) {
      if (Has(i))
        index_inputs.push_back(i);
    }
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn(index_inputs, kIndexTypes));
    for (std::size_t i : index_inputs) {
      if (In(i).size() != 1)
        return Mismatch("input " + std::to_string(i) + " ('" + node_.inputs[i] +
                        "') must be 1-D, is " + ShapeText(In(i)));
    }
    const Shape& x = In(0);
    Shape out = x;
    auto starts = IntValues(1);
    auto ends = IntValues(2);
    std::optional<std::vector<int64_t>> axes;
    if (Has(3)) {
      axes = IntValues(3);
    } else {
      axes.emplace(std::min<std::size_t>(x.size(), Known(In(1)[0]) ? In(1)[0] : x.size()));
      std::iota(axes->begin(), axes->end(), 0);
    }
    std::optional<std::vector<int64_t>> steps;
    if (Has(4))
      steps = IntValues(4);
    if (!axes) {
      BACKPLANE_RETURN_IF_ERROR(RequireValue(3, "axes"));
      SetOutput(Shape(x.size(), kDynamic), inputs_[0]->type);
      return Status::Ok();
    }
    auto normal = NormalizeAxes(*axes, x.size(), "axes");
    if (!normal.ok())
      return normal.error();
    const bool known = starts && ends && (!Has(4) || steps);
    if (!known) {
      for (std::size_t i = 1; i < 5; ++i) {
        if (Has(i) && !IntValues(i))
          BACKPLANE_RETURN_IF_ERROR(RequireValue(i, i == 1 ? "starts" : i == 2 ? "ends" : "steps"));
      }
      for (std::size_t axis : *normal)
        out[axis] = kDynamic;
      SetOutput(std::move(out), inputs_[0]->type);
      return Status::Ok();
    }
    if (starts->size() != normal->size() || ends->size() != normal->size() ||
        (steps && steps->size() != normal->size()))
      return Mismatch("starts, ends, axes and steps must have one length, are " +
                      std::to_string(starts->size()) + ", " + std::to_string(ends->size()) + ", " +
                      std::to_string(normal->size()) +
                      (steps ? ", " + std::to_string(steps->size()) : std::string()));
    for (std::size_t i = 0; i < normal->size(); ++i) {
      const int64_t step = steps ? (*steps)[i] : 1;
      if (step == 0)
        return Error(StatusCode::kInvalidArgument, "steps must not be 0");
      const std::size_t axis = (*normal)[i];
      if (Known(x[axis]))
        out[axis] = op_rules::SliceLength((*starts)[i], (*ends)[i], step, x[axis]);
    }
    SetOutput(std::move(out), inputs_[0]->type);
    return Status::Ok();
  }

  Status InferCast() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 1, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn(
        {0}, {DataType::kFloat32, DataType::kInt64, DataType::kInt32, DataType::kBool}));
    if (!HasAttr("to"))
      return Error(StatusCode::kInvalidArgument, "attribute 'to' is required");
    int64_t to = 0;
    BACKPLANE_RETURN_IF_ERROR(Int("to", 0, &to));
    const auto type = static_cast<DataType>(to);
    if (type != DataType::kFloat32 && type != DataType::kInt64 && type != DataType::kInt32 &&
        type != DataType::kBool)
      return Error(StatusCode::kUnimplemented,
                   "attribute 'to' = " + std::to_string(to) +
                       " is not supported (FLOAT 1, INT32 6, INT64 7 and BOOL 9 are)");
    int64_t saturate = 1;
    BACKPLANE_RETURN_IF_ERROR(Int("saturate", 1, &saturate));
    SetOutput(In(0), type);
    return Status::Ok();
  }

  Status InferEqual() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(2, 2, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn(
        {0, 1}, {DataType::kFloat32, DataType::kInt64, DataType::kInt32, DataType::kBool}));
    Shape shape;
    BACKPLANE_RETURN_IF_ERROR(Broadcast(In(0), In(1), &shape));
    SetOutput(std::move(shape), DataType::kBool);
    return Status::Ok();
  }

  Status InferWhere() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(3, 3, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({0}, {DataType::kBool}));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({1, 2}, kAnyType));
    Shape first;
    Shape shape;
    BACKPLANE_RETURN_IF_ERROR(Broadcast(In(0), In(1), &first));
    BACKPLANE_RETURN_IF_ERROR(Broadcast(first, In(2), &shape));
    SetOutput(std::move(shape), inputs_[1]->type);
    return Status::Ok();
  }

  // Expand's and ConstantOfShape's shape input: INT64, 1-D of a known length.
  Status CheckShapeInput(std::size_t i) const {
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({i}, {DataType::kInt64}));
    if (In(i).size() != 1 || !Known(In(i)[0]))
      return Mismatch("shape input " + std::to_string(i) + " ('" + node_.inputs[i] +
                      "') must be 1-D of a known length, is " + ShapeText(In(i)));
    return Status::Ok();
  }

  Status InferExpand() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(2, 2, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({0}, kAnyType));
    BACKPLANE_RETURN_IF_ERROR(CheckShapeInput(1));
    auto shape = IntValues(1);
    if (!shape) {
      BACKPLANE_RETURN_IF_ERROR(RequireValue(1, "shape"));
      SetOutput(Shape(std::max<std::size_t>(In(0).size(), In(1)[0]), kDynamic), inputs_[0]->type);
      return Status::Ok();
    }
    for (int64_t dim : *shape) {
      if (dim < 0)
        return Error(StatusCode::kInvalidArgument,
                     "shape " + ToString(*shape) + " has a negative dimension");
    }
    Shape out;
    BACKPLANE_RETURN_IF_ERROR(Broadcast(In(0), *shape, &out));
    SetOutput(std::move(out), inputs_[0]->type);
    return Status::Ok();
  }

  Status InferConstantOfShape() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 1, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckShapeInput(0));
    // Import turns the TENSOR attribute 'value' into 'value' (FLOAT or INT) and 'dtype'.
    int64_t dtype = static_cast<int64_t>(DataType::kFloat32);
    BACKPLANE_RETURN_IF_ERROR(Int("dtype", dtype, &dtype));
    const auto type = static_cast<DataType>(dtype);
    if (type != DataType::kFloat32 && type != DataType::kInt64 && type != DataType::kInt32 &&
        type != DataType::kBool)
      return Error(StatusCode::kUnimplemented,
                   "a value of " + std::string(ToString(type)) +
                       " is not supported (FP32, INT64, INT32 and BOOL are)");
    if (HasAttr("value")) {
      if (type == DataType::kFloat32) {
        float value = 0;
        BACKPLANE_RETURN_IF_ERROR(Float("value", 0, &value));
      } else {
        int64_t value = 0;
        BACKPLANE_RETURN_IF_ERROR(Int("value", 0, &value));
      }
    }
    auto shape = IntValues(0);
    if (!shape) {
      BACKPLANE_RETURN_IF_ERROR(RequireValue(0, "shape"));
      SetOutput(Shape(static_cast<std::size_t>(In(0)[0]), kDynamic), type);
      return Status::Ok();
    }
    for (int64_t dim : *shape) {
      if (dim < 0)
        return Error(StatusCode::kInvalidArgument,
                     "shape " + ToString(*shape) + " has a negative dimension");
    }
    SetOutput(std::move(shape).value(), type);
    return Status::Ok();
  }

  Status InferRange() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(3, 3, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({0, 1, 2}, kNumberTypes));
    static constexpr std::string_view kRoles[] = {"start", "limit", "delta"};
    for (std::size_t i = 0; i < 3; ++i)
      BACKPLANE_RETURN_IF_ERROR(RequireScalar(i, kRoles[i]));
    const DataType type = inputs_[0]->type;
    double bounds[3] = {};
    bool known = true;
    for (std::size_t i = 0; i < 3; ++i) {
      const Tensor* value = ValueOf(i);
      if (value == nullptr) {
        known = false;
        BACKPLANE_RETURN_IF_ERROR(RequireValue(i, kRoles[i]));
        continue;
      }
      bounds[i] = type == DataType::kFloat32 ? value->Elements<float>()[0]
                  : type == DataType::kInt64 ? static_cast<double>(value->Elements<int64_t>()[0])
                                             : value->Elements<int32_t>()[0];
    }
    if (!known) {
      SetOutput({kDynamic}, type);
      return Status::Ok();
    }
    auto length = RangeLength(bounds[0], bounds[1], bounds[2]);
    if (!length)
      return Error(StatusCode::kInvalidArgument,
                   "delta is 0, or the range from " + std::to_string(bounds[0]) + " to " +
                       std::to_string(bounds[1]) + " has too many elements");
    SetOutput({*length}, type);
    return Status::Ok();
  }

  Status InferReduce() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 2, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({0}, {DataType::kFloat32}));
    int64_t keepdims = 1;
    int64_t noop = 0;
    BACKPLANE_RETURN_IF_ERROR(Int("keepdims", 1, &keepdims));
    BACKPLANE_RETURN_IF_ERROR(Int("noop_with_empty_axes", 0, &noop));
    if (keepdims != 0 && keepdims != 1)
      return Error(StatusCode::kInvalidArgument, "attribute 'keepdims' must be 0 or 1");
    std::vector<int64_t> axes;
    if (HasAttr("axes") && Has(1))
      return Error(StatusCode::kInvalidArgument,
                   "axes are given both as an attribute and as input 1");
    if (HasAttr("axes")) {
      BACKPLANE_RETURN_IF_ERROR(Ints("axes", {}, &axes));
    } else if (Has(1)) {
      BACKPLANE_RETURN_IF_ERROR(CheckSameTypeIn({1}, {DataType::kInt64}));
      auto given = RequireIntValues(1, "axes");
      if (!given.ok())
        return given.error();
      axes = std::move(given).value();
    }
    const Shape& x = In(0);
    if (axes.empty() && noop != 0) {
      SetOutput(x);
      return Status::Ok();
    }
    auto normal = NormalizeAxes(axes, x.size(), "axes");
    if (!normal.ok())
      return normal.error();
    Shape out;
    for (std::size_t d = 0; d < x.size(); ++d) {
      const bool reduced =
          axes.empty() || std::find(normal->begin(), normal->end(), d) != normal->end();
      if (!reduced)
        out.push_back(x[d]);
      else if (keepdims != 0)
        out.push_back(1);
    }
    SetOutput(std::move(out));
    return Status::Ok();
  }

  Status InferPow() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(2, 2, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
    Shape shape;
    BACKPLANE_RETURN_IF_ERROR(Broadcast(In(0), In(1), &shape));
    SetOutput(std::move(shape));
    return Status::Ok();
  }

  Status InferLayerNormalization() {
    // Mean and InvStdDev (outputs 1 and 2) are training outputs: refused by CheckArity.
    BACKPLANE_RETURN_IF_ERROR(CheckArity(2, 3, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
    const Shape& x = In(0);
    if (x.empty())
      return Mismatch("input 0 ('" + node_.inputs[0] + "') must have rank >= 1");
    std::size_t axis = 0;
    BACKPLANE_RETURN_IF_ERROR(Axis("axis", -1, x.size(), 0, &axis));
    float epsilon = 0;
    BACKPLANE_RETURN_IF_ERROR(Float("epsilon", 1e-5f, &epsilon));
    if (!(epsilon >= 0))
      return Error(StatusCode::kInvalidArgument, "epsilon must be >= 0");
    int64_t stash_type = 1;
    BACKPLANE_RETURN_IF_ERROR(Int("stash_type", 1, &stash_type));
    if (stash_type != 1)
      return Error(StatusCode::kUnimplemented,
                   "stash_type " + std::to_string(stash_type) + " is not supported (only 1, FP32)");
    // Scale and B broadcast to the normalized dimensions x[axis:] (one way).
    const Shape normalized(x.begin() + static_cast<std::ptrdiff_t>(axis), x.end());
    for (std::size_t i = 1; i < 3; ++i) {
      if (!Has(i))
        continue;
      const Shape& p = In(i);
      bool fits = p.size() <= normalized.size();
      for (std::size_t d = 0; fits && d < p.size(); ++d) {
        const int64_t want = normalized[normalized.size() - p.size() + d];
        fits = !Known(p[d]) || p[d] == 1 || !Known(want) || p[d] == want;
      }
      if (!fits)
        return Mismatch(std::string(i == 1 ? "scale" : "B") + " " + ShapeText(p) +
                        " does not broadcast to the normalized dimensions " +
                        ShapeText(normalized) + " of input 0 " + ShapeText(x));
    }
    SetOutput(x);
    return Status::Ok();
  }

  const Node& node_;
  const int64_t opset_;
  const std::span<const TensorInfo* const> inputs_;
  const TensorMap& constants_;
  const TensorMap* const folded_;  // values computed from shapes, or null
  const bool concrete_;            // every graph input's shape is known
  std::vector<TensorInfo> outputs_;
};

}  // namespace

std::string ShapeText(const Shape& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      text += ',';
    text += DimText(shape[i]);
  }
  return text + "]";
}

bool IsSupportedOp(std::string_view op_type) {
  return std::find(std::begin(kSupportedOps), std::end(kSupportedOps), op_type) !=
         std::end(kSupportedOps);
}

std::string DescribeNode(const Node& node) {
  return "node '" + node.name + "' (" + node.op_type + ")";
}

Result<std::vector<TensorInfo>> InferNodeOutputs(const Node& node, int64_t opset,
                                                 std::span<const TensorInfo* const> inputs,
                                                 const TensorMap& constants,
                                                 const TensorMap* folded, bool concrete) {
  return NodeInference(node, opset, inputs, constants, folded, concrete).Run();
}

Result<ValueInfoMap> InferAllValues(const Network& network, std::span<const TensorInfo> inputs) {
  ValueInfoMap values;
  // Constants and inputs may come from a caller rather than from import (bound inputs, a request,
  // a hand-built Network): each node also checks its inputs, but here they are named as what
  // they are.
  for (const auto& [name, tensor] : network.constants) {
    BACKPLANE_RETURN_IF_ERROR(
        CheckKnownElementCount(tensor.info().shape, "constant '" + name + "'"));
    values[name] = tensor.info();
  }
  for (std::size_t i = 0; i < network.inputs.size() && i < inputs.size(); ++i) {
    BACKPLANE_RETURN_IF_ERROR(
        CheckKnownElementCount(inputs[i].shape, "input '" + network.inputs[i].name + "'"));
    values[network.inputs[i].name] = inputs[i];
  }
  // Shapes known for every input: a value that decides a shape is then known too, or never will
  // be before the run.
  bool concrete = true;
  for (const TensorInfo& input : inputs) {
    for (int64_t dim : input.shape)
      concrete = concrete && dim >= 0;
  }
  TensorMap folded;  // values computed from shapes: a Reshape's target, an Unsqueeze's axes
  std::vector<const TensorInfo*> node_inputs;
  std::vector<const Tensor*> node_values;
  for (const Node& node : network.nodes) {
    node_inputs.clear();
    node_values.clear();
    for (const std::string& input : node.inputs) {
      if (input.empty()) {
        node_inputs.push_back(nullptr);
        node_values.push_back(nullptr);
        continue;
      }
      auto it = values.find(input);
      if (it == values.end())
        return Internal(DescribeNode(node) + ": input '" + input + "' has no inferred info");
      node_inputs.push_back(&it->second);
      const Tensor* value = nullptr;
      if (auto constant = network.constants.find(input); constant != network.constants.end())
        value = &constant->second;
      else if (auto computed = folded.find(input); computed != folded.end())
        value = &computed->second;
      node_values.push_back(value);
    }
    auto outputs =
        InferNodeOutputs(node, network.opset, node_inputs, network.constants, &folded, concrete);
    if (!outputs.ok())
      return std::move(outputs).error();
    std::vector<Tensor> computed = FoldNode(node, node_inputs, node_values, *outputs);
    for (std::size_t i = 0; i < node.outputs.size(); ++i) {
      if (node.outputs[i].empty())
        continue;
      if (i < computed.size())
        folded.insert_or_assign(node.outputs[i], std::move(computed[i]));
      values[node.outputs[i]] = std::move((*outputs)[i]);
    }
  }
  return values;
}

Result<ValueInfoMap> InferShapes(const Network& network, std::span<const TensorInfo> inputs) {
  if (inputs.size() != network.inputs.size())
    return InvalidArgument("network " + network.name + " takes " +
                           std::to_string(network.inputs.size()) + " inputs, got " +
                           std::to_string(inputs.size()));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const ValueInfo& declared = network.inputs[i];
    const TensorInfo& given = inputs[i];
    if (given.type != declared.info.type)
      return InvalidArgument("input '" + declared.name + "' must be " +
                             std::string(ToString(declared.info.type)) + ", got " +
                             std::string(ToString(given.type)));
    bool matches = given.shape.size() == declared.info.shape.size();
    for (std::size_t d = 0; matches && d < given.shape.size(); ++d) {
      const int64_t want = declared.info.shape[d];
      matches = given.shape[d] >= 0 && (want < 0 || want == given.shape[d]);
    }
    if (!matches)
      return InvalidArgument("input '" + declared.name + "' has shape " + ToString(given.shape) +
                             ", the network expects " + ShapeText(declared.info.shape));
  }
  return InferAllValues(network, inputs);
}

}  // namespace backplane
