// Add, Sub, Mul, Div (FP32, INT64, INT32), Pow, Sqrt, Erf, Relu, LeakyRelu, Sigmoid, HardSigmoid,
// HardSwish, Tanh, Clip, Dropout (inference), Softmax, BatchNormalization (inference).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernel_support.hpp"

namespace backplane::cpu_ref {
namespace {

// ---- Add, Sub, Mul, Div: multidirectional (numpy) broadcasting --------------------------------

// FP32 as IEEE computes it; integers (shape arithmetic) wrap around on overflow as two's
// complement, computed unsigned so that it is defined.
template <typename T>
T Wrapped(uint64_t value) {
  return static_cast<T>(value);
}
struct Plus {
  static float Apply(float a, float b) { return a + b; }
  template <typename T>
  static T ApplyInt(T a, T b) {
    return Wrapped<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }
};
struct Minus {
  static float Apply(float a, float b) { return a - b; }
  template <typename T>
  static T ApplyInt(T a, T b) {
    return Wrapped<T>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
  }
};
struct Times {
  static float Apply(float a, float b) { return a * b; }
  template <typename T>
  static T ApplyInt(T a, T b) {
    return Wrapped<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  }
};
struct Quotient {
  // IEEE division: x / 0 is ±inf, 0 / 0 is NaN, as ONNX Runtime gives for floats.
  static float Apply(float a, float b) { return a / b; }
  // Truncating, as C++ and ONNX Runtime divide integers; the caller refuses a zero divisor, and
  // the one quotient that overflows (the minimum over -1) wraps to the minimum.
  template <typename T>
  static T ApplyInt(T a, T b) {
    if (b == -1)
      return Wrapped<T>(uint64_t{0} - static_cast<uint64_t>(a));
    return a / b;
  }
};
struct Power {
  static float Apply(float a, float b) {
    return static_cast<float>(std::pow(static_cast<double>(a), static_cast<double>(b)));
  }
};

template <typename Operation>
class BinaryWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    // Pow is FP32 only; the others take INT64 and INT32 too, as shape computations use them.
    constexpr bool kIntegers = !std::is_same_v<Operation, Power>;
    BACKPLANE_RETURN_IF_ERROR(
        CheckSignature(op, {.min_inputs = 2, .max_inputs = 2, .typed = kIntegers}));
    if (kIntegers) {
      BACKPLANE_RETURN_IF_ERROR(
          CheckTypeIn(op, 0, {DataType::kFloat32, DataType::kInt64, DataType::kInt32}));
      if (op.inputs[1].type != op.inputs[0].type || op.outputs[0].type != op.inputs[0].type)
        return NodeInvalid(op, "inputs and output must have one type, are " +
                                   std::string(ToString(op.inputs[0].type)) + ", " +
                                   std::string(ToString(op.inputs[1].type)) + " and " +
                                   std::string(ToString(op.outputs[0].type)));
    }
    const Shape& a = op.inputs[0].shape;
    const Shape& b = op.inputs[1].shape;
    if (auto out = op_rules::Broadcast(a, b); !out.ok())
      return NodeError(op, out.error());
    return Params{NodeLabel(op)};
  }

  explicit BinaryWorkload(Params params) : WorkloadBase(std::move(params.label), 2, 2, 1) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& a_shape = inputs[0].info.shape;
    const Shape& b_shape = inputs[1].info.shape;
    const auto out_shape = op_rules::Broadcast(a_shape, b_shape);
    if (!out_shape.ok())
      return Invalid(out_shape.error().message());
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], out_shape.value()));
    if (inputs[0].info.type != inputs[1].info.type || outputs[0].info.type != inputs[0].info.type)
      return Invalid("inputs and output must have one type");
    switch (inputs[0].info.type) {
      case DataType::kFloat32:
        return Compute<float>(inputs, outputs[0], out_shape.value());
      case DataType::kInt64:
        return Compute<int64_t>(inputs, outputs[0], out_shape.value());
      case DataType::kInt32:
        return Compute<int32_t>(inputs, outputs[0], out_shape.value());
      default:
        return Invalid("unsupported type " + std::string(ToString(inputs[0].info.type)));
    }
  }

  template <typename T>
  Status Compute(std::span<const ConstTensorView> inputs, const TensorView& output,
                 const Shape& out_shape) const {
    const Shape& a_shape = inputs[0].info.shape;
    const Shape& b_shape = inputs[1].info.shape;
    const auto a = inputs[0].Elements<T>();
    const auto b = inputs[1].Elements<T>();
    const auto out = output.Elements<T>();
    if constexpr (!std::is_same_v<T, float>) {
      if constexpr (std::is_same_v<Operation, Quotient>) {
        if (std::find(b.begin(), b.end(), T{0}) != b.end())
          return Invalid("integer division by zero");
      }
    }
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto flat = static_cast<int64_t>(i);
      const T x = a[op_rules::BroadcastOffset(flat, out_shape, a_shape)];
      const T y = b[op_rules::BroadcastOffset(flat, out_shape, b_shape)];
      if constexpr (std::is_same_v<T, float>)
        out[i] = Operation::Apply(x, y);
      else if constexpr (!std::is_same_v<Operation, Power>)
        out[i] = Operation::template ApplyInt<T>(x, y);
    }
    return Status::Ok();
  }
};

// ---- Relu, LeakyRelu, Sigmoid, HardSigmoid, HardSwish, Tanh ----------------------------------

// Each function reads its attributes once, in Parse (which also checks the node's signature),
// and is then applied per element.
struct ReluFunction {
  static constexpr std::size_t kMaxInputs = 1;
  static Result<ReluFunction> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {}));
    return ReluFunction{};
  }
  float Apply(float x) const { return x > 0.0f ? x : 0.0f; }
};
struct LeakyReluFunction {
  static constexpr std::size_t kMaxInputs = 1;
  static Result<LeakyReluFunction> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.attributes = {"alpha"}}));
    auto alpha = FloatAttribute(op, "alpha", 0.01f);
    if (!alpha.ok())
      return alpha.error();
    return LeakyReluFunction{alpha.value()};
  }
  float Apply(float x) const { return x >= 0.0f ? x : alpha * x; }
  float alpha;
};
struct SigmoidFunction {
  static constexpr std::size_t kMaxInputs = 1;
  static Result<SigmoidFunction> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {}));
    return SigmoidFunction{};
  }
  // Written so that exp never overflows: exp of a non-positive number only.
  float Apply(float x) const {
    if (x >= 0.0f)
      return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x))));
    const double e = std::exp(static_cast<double>(x));
    return static_cast<float>(e / (1.0 + e));
  }
};
// max(0, min(1, alpha * x + beta)); HardSwish is x times it with alpha = 1/6, beta = 0.5.
float HardSigmoid(float x, float alpha, float beta) {
  return std::max(0.0f, std::min(1.0f, alpha * x + beta));
}
struct HardSigmoidFunction {
  static constexpr std::size_t kMaxInputs = 1;
  static Result<HardSigmoidFunction> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.attributes = {"alpha", "beta"}}));
    auto alpha = FloatAttribute(op, "alpha", 0.2f);
    if (!alpha.ok())
      return alpha.error();
    auto beta = FloatAttribute(op, "beta", 0.5f);
    if (!beta.ok())
      return beta.error();
    return HardSigmoidFunction{alpha.value(), beta.value()};
  }
  float Apply(float x) const { return HardSigmoid(x, alpha, beta); }
  float alpha;
  float beta;
};
struct HardSwishFunction {
  static constexpr std::size_t kMaxInputs = 1;
  static Result<HardSwishFunction> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {}));
    return HardSwishFunction{};
  }
  float Apply(float x) const { return x * HardSigmoid(x, 1.0f / 6.0f, 0.5f); }
};
struct SqrtFunction {
  static constexpr std::size_t kMaxInputs = 1;
  static Result<SqrtFunction> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {}));
    return SqrtFunction{};
  }
  float Apply(float x) const { return std::sqrt(x); }  // NaN below zero, as IEEE says
};
struct ErfFunction {
  static constexpr std::size_t kMaxInputs = 1;
  static Result<ErfFunction> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {}));
    return ErfFunction{};
  }
  float Apply(float x) const { return static_cast<float>(std::erf(static_cast<double>(x))); }
};
struct TanhFunction {
  static constexpr std::size_t kMaxInputs = 1;
  static Result<TanhFunction> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {}));
    return TanhFunction{};
  }
  float Apply(float x) const { return std::tanh(x); }
};

template <typename Function>
class UnaryWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    Function function;
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    auto function = Function::Parse(op);
    if (!function.ok())
      return function.error();
    return Params{NodeLabel(op), function.value()};
  }

  // Inputs past the first (Clip's bounds, Dropout's ratio and training_mode) are constants the
  // function read in Parse; at run time they are passed and ignored.
  explicit UnaryWorkload(Params params)
      : WorkloadBase(std::move(params.label), 1, Function::kMaxInputs, 1),
        function_(params.function) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], inputs[0].info.shape));
    const auto in = inputs[0].Elements<float>();
    const auto out = outputs[0].Elements<float>();
    for (std::size_t i = 0; i < in.size(); ++i)
      out[i] = function_.Apply(in[i]);
    return Status::Ok();
  }

  const Function function_;
};

// ---- Clip (opset >= 11: min and max are inputs 1 and 2, both optional) -------------------------

// One bound of Clip: an omitted input is `fallback` (an infinity, which clips nothing); a given
// one must be a constant FP32 scalar, read here once.
Result<float> ClipBound(const OperatorDesc& op, std::size_t index, std::string_view role,
                        float fallback) {
  if (!HasInput(op, index))
    return fallback;
  const std::string what = std::string(role) + " (input " + std::to_string(index) + ")";
  if (index >= op.constant_inputs.size() || op.constant_inputs[index] == nullptr) {
    return NodeUnimplemented(
        op, what + " must be a constant: CpuRef reads the bounds once, when the network loads");
  }
  const Shape& shape = op.inputs[index].shape;
  if (!std::all_of(shape.begin(), shape.end(), [](int64_t dim) { return dim == 1; }))
    return NodeInvalid(op, what + " must be a scalar, has shape " + ToString(shape));
  return *static_cast<const float*>(op.constant_inputs[index]);
}

struct ClipFunction {
  static constexpr std::size_t kMaxInputs = 3;
  static Result<ClipFunction> Parse(const OperatorDesc& op) {
    // Clip-6's attribute form would otherwise be refused as "unsupported attribute": this says
    // what the attribute is.
    for (std::string_view key : {"min", "max"}) {
      if (op.attributes.contains(key)) {
        return NodeUnimplemented(op, "attribute '" + std::string(key) +
                                         "' is Clip-6's; from opset 11 the bounds are inputs");
      }
    }
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.min_inputs = 1, .max_inputs = 3}));
    auto min = ClipBound(op, 1, "min", -std::numeric_limits<float>::infinity());
    if (!min.ok())
      return min.error();
    auto max = ClipBound(op, 2, "max", std::numeric_limits<float>::infinity());
    if (!max.ok())
      return max.error();
    return ClipFunction{min.value(), max.value()};
  }
  // min first, then max: when min > max every element becomes max, as ONNX specifies. A NaN
  // fails both comparisons and stays NaN.
  float Apply(float x) const {
    if (x < min)
      x = min;
    if (x > max)
      x = max;
    return x;
  }
  float min;
  float max;
};

// ---- Dropout (inference: the identity) --------------------------------------------------------

struct DropoutFunction {
  static constexpr std::size_t kMaxInputs = 3;
  static Result<DropoutFunction> Parse(const OperatorDesc& op) {
    // Training and the mask are checked before the signature, so that a training graph hears
    // why it is refused rather than "wrong number of outputs" or "input 2 is BOOL".
    if (HasInput(op, 2)) {
      const TensorInfo& training = op.inputs[2];
      if (training.type != DataType::kBool || op.constant_inputs.size() < 3 ||
          op.constant_inputs[2] == nullptr || ElementCount(training.shape) != 1) {
        return NodeUnimplemented(op,
                                 "training_mode (input 2) must be absent or a constant BOOL "
                                 "scalar: CpuRef runs inference only");
      }
      if (*static_cast<const uint8_t*>(op.constant_inputs[2]) != 0)
        return NodeUnimplemented(op, "training_mode is true: CpuRef runs inference only");
    }
    if (op.outputs.size() > 1) {
      return NodeUnimplemented(op,
                               "the mask output (output 1) is a BOOL tensor, which CpuRef does "
                               "not produce");
    }
    // seed only matters when training: accepted and unused, as is the ratio input.
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(
        op, {.min_inputs = 1, .max_inputs = 3, .attributes = {"seed"}, .float_inputs = 2}));
    return DropoutFunction{};
  }
  float Apply(float x) const { return x; }
};

// ---- Softmax (opset >= 13: normalises over the one axis) -----------------------------------

class SoftmaxWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    int64_t axis;  // as given, possibly negative: the rank comes from the request
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.attributes = {"axis"}}));
    auto axis = IntAttribute(op, "axis", -1);
    if (!axis.ok())
      return axis.error();
    const auto rank = static_cast<int64_t>(op.inputs[0].shape.size());
    if (rank == 0)
      return NodeInvalid(op, "input must have rank >= 1");
    BACKPLANE_RETURN_IF_ERROR(StatusOf(NormalizeAxis(op, axis.value(), rank)));
    return Params{NodeLabel(op), axis.value()};
  }

  explicit SoftmaxWorkload(Params params)
      : WorkloadBase(std::move(params.label), 1, 1, 1), axis_(params.axis) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& shape = inputs[0].info.shape;
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], shape));
    const auto rank = static_cast<int64_t>(shape.size());
    if (axis_ < -rank || axis_ >= rank)
      return Invalid("axis " + std::to_string(axis_) + " is out of range for rank " +
                     std::to_string(rank));
    const int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < axis; ++i)
      outer *= shape[i];
    for (int64_t i = axis + 1; i < rank; ++i)
      inner *= shape[i];
    const int64_t n = shape[axis];
    const auto in = inputs[0].Elements<float>();
    const auto out = outputs[0].Elements<float>();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t base = o * n * inner + i;
        // Subtracting the maximum keeps exp() in range for large inputs.
        float max = -INFINITY;
        for (int64_t k = 0; k < n; ++k)
          max = std::max(max, in[base + k * inner]);
        double sum = 0.0;
        for (int64_t k = 0; k < n; ++k)
          sum += std::exp(static_cast<double>(in[base + k * inner]) - max);
        for (int64_t k = 0; k < n; ++k) {
          out[base + k * inner] =
              static_cast<float>(std::exp(static_cast<double>(in[base + k * inner]) - max) / sum);
        }
      }
    }
    return Status::Ok();
  }

  const int64_t axis_;
};

// ---- BatchNormalization (inference) -----------------------------------------------------------

class BatchNormalizationWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    float epsilon;
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    // Checked before the output count: a training-mode node has 3 outputs, and the honest answer
    // is "training is not supported", not "wrong number of outputs".
    auto training = IntAttribute(op, "training_mode", 0);
    if (!training.ok())
      return training.error();
    if (training.value() != 0) {
      return NodeUnimplemented(op, "training_mode=" + std::to_string(training.value()) +
                                       " is not supported (CpuRef runs inference only)");
    }
    BACKPLANE_RETURN_IF_ERROR(
        CheckSignature(op, {.min_inputs = 5,
                            .max_inputs = 5,
                            // momentum only matters when training: accepted and unused.
                            .attributes = {"epsilon", "momentum", "training_mode"}}));
    auto epsilon = FloatAttribute(op, "epsilon", 1e-5f);
    if (!epsilon.ok())
      return epsilon.error();
    BACKPLANE_RETURN_IF_ERROR(StatusOf(FloatAttribute(op, "momentum", 0.9f)));
    const Shape& x = op.inputs[0].shape;
    if (x.size() < 2)
      return NodeInvalid(op, "X must have rank >= 2 (N x C x ...), is " + ToString(x));
    static constexpr const char* kNames[] = {"X", "scale", "B", "input_mean", "input_var"};
    for (std::size_t i = 1; i < 5; ++i) {
      const Shape& shape = op.inputs[i].shape;
      if (shape.size() != 1 || DimsConflict(shape[0], x[1])) {
        return NodeInvalid(op, std::string(kNames[i]) + " must have shape [C] = [" +
                                   std::to_string(x[1]) + "], is " + ToString(shape));
      }
    }
    return Params{NodeLabel(op), epsilon.value()};
  }

  explicit BatchNormalizationWorkload(Params params)
      : WorkloadBase(std::move(params.label), 5, 5, 1), epsilon_(params.epsilon) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& shape = inputs[0].info.shape;
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], shape));
    if (shape.size() < 2)
      return Invalid("X must have rank >= 2, is " + ToString(shape));
    const int64_t batch = shape[0];
    const int64_t channels = shape[1];
    for (std::size_t i = 1; i < 5; ++i) {
      if (inputs[i].info.shape != Shape{channels})
        return Invalid("input " + std::to_string(i) + " must have shape [" +
                       std::to_string(channels) + "], is " + ToString(inputs[i].info.shape));
    }
    int64_t spatial = 1;
    for (std::size_t i = 2; i < shape.size(); ++i)
      spatial *= shape[i];
    const auto x = inputs[0].Elements<float>();
    const auto scale = inputs[1].Elements<float>();
    const auto bias = inputs[2].Elements<float>();
    const auto mean = inputs[3].Elements<float>();
    const auto var = inputs[4].Elements<float>();
    const auto y = outputs[0].Elements<float>();
    for (int64_t n = 0; n < batch; ++n) {
      for (int64_t c = 0; c < channels; ++c) {
        const double inv_std = 1.0 / std::sqrt(static_cast<double>(var[c]) + epsilon_);
        const int64_t base = (n * channels + c) * spatial;
        for (int64_t s = 0; s < spatial; ++s) {
          y[base + s] = static_cast<float>(
              (x[base + s] - static_cast<double>(mean[c])) * inv_std * scale[c] + bias[c]);
        }
      }
    }
    return Status::Ok();
  }

  const float epsilon_;
};

template <typename W>
constexpr KernelEntry ElementwiseEntry(std::string_view op_type) {
  return {op_type, CheckKernel<W>, CreateKernel<W>};
}

constexpr KernelEntry kElementwiseKernels[] = {
    ElementwiseEntry<BinaryWorkload<Plus>>("Add"),
    ElementwiseEntry<BinaryWorkload<Minus>>("Sub"),
    ElementwiseEntry<BinaryWorkload<Times>>("Mul"),
    ElementwiseEntry<BinaryWorkload<Quotient>>("Div"),
    ElementwiseEntry<UnaryWorkload<ReluFunction>>("Relu"),
    ElementwiseEntry<UnaryWorkload<LeakyReluFunction>>("LeakyRelu"),
    ElementwiseEntry<UnaryWorkload<SigmoidFunction>>("Sigmoid"),
    ElementwiseEntry<UnaryWorkload<HardSigmoidFunction>>("HardSigmoid"),
    ElementwiseEntry<UnaryWorkload<HardSwishFunction>>("HardSwish"),
    ElementwiseEntry<UnaryWorkload<TanhFunction>>("Tanh"),
    ElementwiseEntry<UnaryWorkload<SqrtFunction>>("Sqrt"),
    ElementwiseEntry<UnaryWorkload<ErfFunction>>("Erf"),
    ElementwiseEntry<BinaryWorkload<Power>>("Pow"),
    ElementwiseEntry<UnaryWorkload<ClipFunction>>("Clip"),
    ElementwiseEntry<UnaryWorkload<DropoutFunction>>("Dropout"),
    ElementwiseEntry<SoftmaxWorkload>("Softmax"),
    ElementwiseEntry<BatchNormalizationWorkload>("BatchNormalization"),
};

}  // namespace

std::span<const KernelEntry> ElementwiseKernels() {
  return kElementwiseKernels;
}

}  // namespace backplane::cpu_ref
