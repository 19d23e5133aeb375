// Shape inference with ONNX semantics for the supported operators. A negative dimension is
// dynamic: it propagates as -1 wherever the result cannot be resolved without it, and checks that
// need it are left to the per-request pass, when it is known.
#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
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
                                              "DequantizeLinear"};

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

// Checks one node and computes its outputs. Each Infer* method fills `outputs_` or returns an
// error built with Error(), so that every message names the node.
class NodeInference {
 public:
  NodeInference(const Node& node, int64_t opset, std::span<const TensorInfo* const> inputs,
                const std::map<std::string, Tensor, std::less<>>& constants)
      : node_(node), opset_(opset), inputs_(inputs), constants_(constants) {}

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
    if (op == "Relu" || op == "Sigmoid" || op == "Tanh" || op == "Identity" || op == "HardSwish")
      return InferUnary();
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

  Status InferBroadcast() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(2, 2, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
    Shape shape;
    BACKPLANE_RETURN_IF_ERROR(Broadcast(In(0), In(1), &shape));
    SetOutput(std::move(shape));
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
    BACKPLANE_RETURN_IF_ERROR(CheckTypes(/*int64_input=*/1));
    auto constant = constants_.find(node_.inputs[1]);
    if (constant == constants_.end())
      return Error(StatusCode::kUnimplemented,
                   "shape input '" + node_.inputs[1] +
                       "' must be a constant (an initializer or a Constant node)");
    const Tensor& shape_tensor = constant->second;
    if (shape_tensor.info().shape.size() != 1)
      return Error(StatusCode::kInvalidArgument, "shape input '" + node_.inputs[1] +
                                                     "' must be 1-D, is " +
                                                     ShapeText(shape_tensor.info().shape));
    int64_t allow_zero = 0;
    BACKPLANE_RETURN_IF_ERROR(Int("allowzero", 0, &allow_zero));
    const Shape& x = In(0);
    const auto requested = shape_tensor.Elements<int64_t>();
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
    SetOutput(std::move(out));
    return Status::Ok();
  }

  Status InferTranspose() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, 1, 1));
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
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
    SetOutput(std::move(out));
    return Status::Ok();
  }

  Status InferConcat() {
    BACKPLANE_RETURN_IF_ERROR(CheckArity(1, SIZE_MAX, 1));
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      if (inputs_[i] == nullptr)
        return Error(StatusCode::kInvalidArgument, "input " + std::to_string(i) + " is omitted");
    }
    BACKPLANE_RETURN_IF_ERROR(CheckTypes());
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
    SetOutput(std::move(out));
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

  const Node& node_;
  const int64_t opset_;
  const std::span<const TensorInfo* const> inputs_;
  const std::map<std::string, Tensor, std::less<>>& constants_;
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

Result<std::vector<TensorInfo>> InferNodeOutputs(
    const Node& node, int64_t opset, std::span<const TensorInfo* const> inputs,
    const std::map<std::string, Tensor, std::less<>>& constants) {
  return NodeInference(node, opset, inputs, constants).Run();
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
  std::vector<const TensorInfo*> node_inputs;
  for (const Node& node : network.nodes) {
    node_inputs.clear();
    for (const std::string& input : node.inputs) {
      if (input.empty()) {
        node_inputs.push_back(nullptr);
        continue;
      }
      auto it = values.find(input);
      if (it == values.end())
        return Internal(DescribeNode(node) + ": input '" + input + "' has no inferred info");
      node_inputs.push_back(&it->second);
    }
    auto outputs = InferNodeOutputs(node, network.opset, node_inputs, network.constants);
    if (!outputs.ok())
      return std::move(outputs).error();
    for (std::size_t i = 0; i < node.outputs.size(); ++i) {
      if (!node.outputs[i].empty())
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
