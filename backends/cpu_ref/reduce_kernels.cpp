// ReduceMean, ReduceSum (axes as an attribute, or as input 1 from ReduceSum-13) and
// LayerNormalization (opset 17, inference: Y only). FP32, sums accumulated in double.
#include <algorithm>
#include <cmath>

#include "kernel_support.hpp"

namespace backplane::cpu_ref {
namespace {

// Which axes of a rank-`rank` input are reduced: `axes` normalised, or every axis when empty.
Result<std::vector<bool>> ReducedAxes(const std::vector<int64_t>& axes, int64_t rank) {
  std::vector<bool> reduced(static_cast<std::size_t>(rank), axes.empty());
  for (int64_t axis : axes) {
    if (axis < -rank || axis >= rank)
      return InvalidArgument("axis " + std::to_string(axis) + " is out of range for rank " +
                             std::to_string(rank));
    const int64_t normal = axis < 0 ? axis + rank : axis;
    if (reduced[normal])
      return InvalidArgument("axes " + ToString(axes) + " name an axis twice");
    reduced[normal] = true;
  }
  return reduced;
}

class ReduceWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    bool mean;
    bool keepdims;
    bool noop_with_empty_axes;
    std::optional<std::vector<int64_t>> axes;  // the attribute; else input 1 at run time
  };
  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(
        CheckSignature(op, {.min_inputs = 1,
                            .max_inputs = 2,
                            .attributes = {"axes", "keepdims", "noop_with_empty_axes"},
                            .float_inputs = 1}));
    Params params{NodeLabel(op), op.op_type == "ReduceMean", true, false, std::nullopt};
    auto keepdims = FlagAttribute(op, "keepdims", true);
    if (!keepdims.ok())
      return keepdims.error();
    auto noop = FlagAttribute(op, "noop_with_empty_axes", false);
    if (!noop.ok())
      return noop.error();
    auto axes = IntsAttribute(op, "axes");
    if (!axes.ok())
      return axes.error();
    if (axes.value() && HasInput(op, 1))
      return NodeInvalid(op, "axes are given both as an attribute and as input 1");
    if (HasInput(op, 1))
      BACKPLANE_RETURN_IF_ERROR(CheckTypeIn(op, 1, {DataType::kInt64}));
    params.keepdims = keepdims.value();
    params.noop_with_empty_axes = noop.value();
    params.axes = axes.value();
    if (params.axes) {
      auto reduced = ReducedAxes(*params.axes, static_cast<int64_t>(op.inputs[0].shape.size()));
      if (!reduced.ok())
        return NodeError(op, reduced.error());
    }
    return params;
  }
  explicit ReduceWorkload(Params params)
      : WorkloadBase(params.label, 1, 2, 1), params_(std::move(params)) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& in = inputs[0].info.shape;
    const bool axes_input = inputs.size() > 1 && inputs[1].info.type != DataType::kUndefined;
    const std::vector<int64_t> axes = params_.axes ? *params_.axes
                                      : axes_input ? IndexValues(inputs[1])
                                                   : std::vector<int64_t>{};
    const auto x = inputs[0].Elements<float>();
    if (axes.empty() && params_.noop_with_empty_axes) {
      BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], in));
      std::ranges::copy(x, outputs[0].Elements<float>().begin());
      return Status::Ok();
    }
    auto reduced = ReducedAxes(axes, static_cast<int64_t>(in.size()));
    if (!reduced.ok())
      return Invalid(reduced.error().message());
    Shape out;        // as allocated
    Shape kept = in;  // the output with every reduced axis kept as 1
    for (std::size_t d = 0; d < in.size(); ++d) {
      if ((*reduced)[d])
        kept[d] = 1;
      if (!(*reduced)[d] || params_.keepdims)
        out.push_back(kept[d]);
    }
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], out));
    std::vector<double> sums(static_cast<std::size_t>(ElementCount(kept)), 0.0);
    for (std::size_t flat = 0; flat < x.size(); ++flat) {
      // The kept-shape index of this element: its coordinates with the reduced ones at 0.
      auto rest = static_cast<int64_t>(flat);
      int64_t target = 0;
      int64_t stride = 1;
      for (std::size_t d = in.size(); d-- > 0;) {
        const int64_t coordinate = rest % in[d];
        rest /= in[d];
        if (!(*reduced)[d])
          target += coordinate * stride;
        stride *= kept[d];
      }
      sums[target] += x[flat];
    }
    const int64_t count = ElementCount(in) / std::max<int64_t>(ElementCount(kept), 1);
    const auto y = outputs[0].Elements<float>();
    for (std::size_t i = 0; i < y.size(); ++i) {
      // The mean of nothing is NaN, as numpy's is; the sum of nothing is 0.
      y[i] = static_cast<float>(params_.mean ? sums[i] / static_cast<double>(count) : sums[i]);
    }
    return Status::Ok();
  }
  const Params params_;
};

// Y = (X - mean) / sqrt(var + epsilon) * Scale + B over the dimensions from `axis` on, with
// Scale and B broadcast to them.
class LayerNormalizationWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    int64_t axis;  // as given
    float epsilon;
  };
  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(
        op, {.min_inputs = 2, .max_inputs = 3, .attributes = {"axis", "epsilon", "stash_type"}}));
    auto axis = IntAttribute(op, "axis", -1);
    if (!axis.ok())
      return axis.error();
    auto epsilon = FloatAttribute(op, "epsilon", 1e-5f);
    if (!epsilon.ok())
      return epsilon.error();
    auto stash = IntAttribute(op, "stash_type", 1);
    if (!stash.ok())
      return stash.error();
    if (stash.value() != 1)
      return NodeUnimplemented(
          op, "stash_type " + std::to_string(stash.value()) + " is not supported (only 1, FP32)");
    const auto rank = static_cast<int64_t>(op.inputs[0].shape.size());
    if (rank == 0)
      return NodeInvalid(op, "X must have rank >= 1");
    BACKPLANE_RETURN_IF_ERROR(StatusOf(NormalizeAxis(op, axis.value(), rank)));
    return Params{NodeLabel(op), axis.value(), epsilon.value()};
  }
  explicit LayerNormalizationWorkload(Params params)
      : WorkloadBase(params.label, 2, 3, 1), params_(std::move(params)) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& shape = inputs[0].info.shape;
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], shape));
    const auto rank = static_cast<int64_t>(shape.size());
    if (params_.axis < -rank || params_.axis >= rank)
      return Invalid("axis " + std::to_string(params_.axis) + " is out of range for rank " +
                     std::to_string(rank));
    const int64_t axis = params_.axis < 0 ? params_.axis + rank : params_.axis;
    const Shape normalized(shape.begin() + axis, shape.end());
    const bool has_bias = inputs.size() > 2 && inputs[2].info.type != DataType::kUndefined;
    for (std::size_t i = 1; i < (has_bias ? 3u : 2u); ++i) {
      auto to = op_rules::Broadcast(normalized, inputs[i].info.shape);
      if (!to.ok() || to.value() != normalized)
        return Invalid(std::string(i == 1 ? "Scale " : "B ") + ToString(inputs[i].info.shape) +
                       " does not broadcast to the normalized dimensions " + ToString(normalized));
    }
    const int64_t size = ElementCount(normalized);
    const int64_t rows = size == 0 ? 0 : ElementCount(shape) / size;
    const auto x = inputs[0].Elements<float>();
    const auto scale = inputs[1].Elements<float>();
    const auto y = outputs[0].Elements<float>();
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t base = row * size;
      double sum = 0.0;
      for (int64_t i = 0; i < size; ++i)
        sum += x[base + i];
      const double mean = sum / static_cast<double>(size);
      double squares = 0.0;
      for (int64_t i = 0; i < size; ++i)
        squares += (x[base + i] - mean) * (x[base + i] - mean);
      const double inv_std = 1.0 / std::sqrt(squares / static_cast<double>(size) + params_.epsilon);
      for (int64_t i = 0; i < size; ++i) {
        double value = (x[base + i] - mean) * inv_std *
                       scale[op_rules::BroadcastOffset(i, normalized, inputs[1].info.shape)];
        if (has_bias)
          value += inputs[2].Elements<float>()[op_rules::BroadcastOffset(i, normalized,
                                                                         inputs[2].info.shape)];
        y[base + i] = static_cast<float>(value);
      }
    }
    return Status::Ok();
  }
  const Params params_;
};

template <typename W>
constexpr KernelEntry Entry(std::string_view op_type) {
  return {op_type, CheckKernel<W>, CreateKernel<W>};
}

constexpr KernelEntry kReduceKernels[] = {
    Entry<ReduceWorkload>("ReduceMean"),
    Entry<ReduceWorkload>("ReduceSum"),
    Entry<LayerNormalizationWorkload>("LayerNormalization"),
};

}  // namespace

std::span<const KernelEntry> ReduceKernels() {
  return kReduceKernels;
}

}  // namespace backplane::cpu_ref
