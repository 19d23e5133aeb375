// Add, Mul, Relu, Sigmoid, Tanh, Softmax, BatchNormalization (inference).
#include <algorithm>
#include <cmath>

#include "kernel_support.hpp"

namespace backplane::cpu_ref {
namespace {

// ---- Add, Mul: multidirectional (numpy) broadcasting ------------------------------------------

struct Plus {
  static float Apply(float a, float b) { return a + b; }
};
struct Times {
  static float Apply(float a, float b) { return a * b; }
};

template <typename Operation>
class BinaryWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.min_inputs = 2, .max_inputs = 2}));
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
    const auto a = inputs[0].Elements<float>();
    const auto b = inputs[1].Elements<float>();
    const auto out = outputs[0].Elements<float>();
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto flat = static_cast<int64_t>(i);
      out[i] = Operation::Apply(a[op_rules::BroadcastOffset(flat, out_shape.value(), a_shape)],
                                b[op_rules::BroadcastOffset(flat, out_shape.value(), b_shape)]);
    }
    return Status::Ok();
  }
};

// ---- Relu, Sigmoid, Tanh ----------------------------------------------------------------------

struct ReluFunction {
  static float Apply(float x) { return x > 0.0f ? x : 0.0f; }
};
struct SigmoidFunction {
  // Written so that exp never overflows: exp of a non-positive number only.
  static float Apply(float x) {
    if (x >= 0.0f)
      return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x))));
    const double e = std::exp(static_cast<double>(x));
    return static_cast<float>(e / (1.0 + e));
  }
};
struct TanhFunction {
  static float Apply(float x) { return std::tanh(x); }
};

template <typename Function>
class UnaryWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {}));
    return Params{NodeLabel(op)};
  }

  explicit UnaryWorkload(Params params) : WorkloadBase(std::move(params.label), 1, 1, 1) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], inputs[0].info.shape));
    const auto in = inputs[0].Elements<float>();
    const auto out = outputs[0].Elements<float>();
    for (std::size_t i = 0; i < in.size(); ++i)
      out[i] = Function::Apply(in[i]);
    return Status::Ok();
  }
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

constexpr KernelEntry kElementwiseKernels[] = {
    {"Add", CheckKernel<BinaryWorkload<Plus>>, CreateKernel<BinaryWorkload<Plus>>},
    {"Mul", CheckKernel<BinaryWorkload<Times>>, CreateKernel<BinaryWorkload<Times>>},
    {"Relu", CheckKernel<UnaryWorkload<ReluFunction>>, CreateKernel<UnaryWorkload<ReluFunction>>},
    {"Sigmoid", CheckKernel<UnaryWorkload<SigmoidFunction>>,
     CreateKernel<UnaryWorkload<SigmoidFunction>>},
    {"Tanh", CheckKernel<UnaryWorkload<TanhFunction>>, CreateKernel<UnaryWorkload<TanhFunction>>},
    {"Softmax", CheckKernel<SoftmaxWorkload>, CreateKernel<SoftmaxWorkload>},
    {"BatchNormalization", CheckKernel<BatchNormalizationWorkload>,
     CreateKernel<BatchNormalizationWorkload>},
};

}  // namespace

std::span<const KernelEntry> ElementwiseKernels() {
  return kElementwiseKernels;
}

}  // namespace backplane::cpu_ref
