// Conv, MaxPool, AveragePool (N-D sliding windows) and GlobalAveragePool, GlobalMaxPool.
//
// One geometry serves all of them: per spatial dim, the output size and the padding at each end
// are the SDK's window rule (backplane/sdk/op_rules.hpp, which shape inference and CpuAcc use
// too); this file walks the windows it gives. Everything is computed per request from the input
// views: dynamic spatial dims are fine.
#include <algorithm>
#include <array>
#include <cmath>

#include "kernel_support.hpp"

namespace backplane::cpu_ref {
namespace {

// Scratch arrays live on the stack (Execute is concurrent), so the spatial rank has a cap.
constexpr std::size_t kMaxSpatialRank = 8;

// The window attributes (op_rules.hpp) for `spatial_rank` spatial dims, refused in the node's
// name.
Result<op_rules::WindowAttributes> ParseWindowAttributes(const OperatorDesc& op,
                                                         std::size_t spatial_rank,
                                                         op_rules::WindowOp kind) {
  auto window = op_rules::ReadWindowAttributes(op.attributes, spatial_rank, kind);
  if (!window.ok())
    return NodeError(op, window.error());
  return window;
}

// The resolved sliding window of one request.
struct WindowGeometry {
  std::size_t rank = 0;
  std::array<int64_t, kMaxSpatialRank> in{}, out{}, kernel{}, stride{}, dilation{}, pad_begin{},
      pad_end{};
  int64_t in_count = 1, out_count = 1, kernel_count = 1;

  // Calls tap(kernel_index, input_index, in_padded_extent) for every kernel position of output
  // position `out_index` (flat over the spatial dims); input_index is -1 in the padding.
  template <typename Tap>
  void ForEachTap(int64_t out_index, Tap&& tap) const {
    std::array<int64_t, kMaxSpatialRank> start{};
    for (std::size_t d = rank; d-- > 0;) {
      start[d] = (out_index % out[d]) * stride[d] - pad_begin[d];
      out_index /= out[d];
    }
    for (int64_t k = 0; k < kernel_count; ++k) {
      std::array<int64_t, kMaxSpatialRank> position{};
      int64_t rest = k;
      for (std::size_t d = rank; d-- > 0;) {
        position[d] = start[d] + (rest % kernel[d]) * dilation[d];
        rest /= kernel[d];
      }
      bool inside = true, in_padded = true;
      int64_t input_index = 0;
      for (std::size_t d = 0; d < rank; ++d) {
        inside = inside && position[d] >= 0 && position[d] < in[d];
        in_padded = in_padded && position[d] >= -pad_begin[d] && position[d] < in[d] + pad_end[d];
        input_index = input_index * in[d] + position[d];
      }
      tap(k, inside ? input_index : -1, in_padded);
    }
  }
};

// `spatial_in` and `kernel` are the resolved spatial dims of the input and of the kernel.
Status ComputeGeometry(const op_rules::WindowAttributes& attributes,
                       std::span<const int64_t> spatial_in, std::span<const int64_t> kernel,
                       WindowGeometry* g) {
  auto window = op_rules::ResolveWindow(attributes, spatial_in, kernel);
  if (!window.ok())
    return window.error();
  g->rank = spatial_in.size();
  g->in_count = g->out_count = g->kernel_count = 1;
  for (std::size_t d = 0; d < g->rank; ++d) {
    const op_rules::WindowDim& dim = window.value()[d];
    g->in[d] = spatial_in[d];
    g->out[d] = dim.out;
    g->kernel[d] = dim.kernel;
    g->stride[d] = dim.stride;
    g->dilation[d] = dim.dilation;
    g->pad_begin[d] = dim.pad_begin;
    g->pad_end[d] = dim.pad_end;
    // The loops below index by these products: each bounded before it is taken.
    const auto in_count = BoundedMul(g->in_count, spatial_in[d]);
    const auto out_count = BoundedMul(g->out_count, dim.out);
    const auto kernel_count = BoundedMul(g->kernel_count, dim.kernel);
    if (!in_count || !out_count || !kernel_count) {
      return InvalidArgument(
          "the window's input, output or kernel positions overflow the limit of 2^40 in spatial "
          "dim " +
          std::to_string(d));
    }
    g->in_count = *in_count;
    g->out_count = *out_count;
    g->kernel_count = *kernel_count;
  }
  return Status::Ok();
}

Status CheckSpatialRank(const OperatorDesc& op, const Shape& x) {
  if (x.size() < 3)
    return NodeInvalid(op, "X must be N x C x D1 x ... (rank >= 3), is " + ToString(x));
  if (x.size() - 2 > kMaxSpatialRank) {
    return NodeUnimplemented(op, "CpuRef supports up to " + std::to_string(kMaxSpatialRank) +
                                     " spatial dims, X is " + ToString(x));
  }
  return Status::Ok();
}

// ---- Conv ---------------------------------------------------------------------------------

// What the shapes of X, W and B must agree on; dynamic dims pass. `kernel_shape` may be empty.
std::optional<std::string> ConvShapeError(const Shape& x, const Shape& w, const Shape* b,
                                          int64_t group, const std::vector<int64_t>& kernel_shape) {
  if (w.size() != x.size())
    return "W " + ToString(w) + " must have the rank of X " + ToString(x);
  const int64_t channels = x[1];
  const int64_t maps = w[0];
  if (channels >= 0 && channels % group != 0)
    return "X's " + std::to_string(channels) +
           " channels do not split into group=" + std::to_string(group);
  if (maps >= 0 && maps % group != 0)
    return "W's " + std::to_string(maps) +
           " feature maps do not split into group=" + std::to_string(group);
  if (channels >= 0 && DimsConflict(w[1], channels / group)) {
    return "W " + ToString(w) + " needs C/group = " + std::to_string(channels / group) +
           " input channels, X is " + ToString(x);
  }
  for (std::size_t d = 0; d < kernel_shape.size(); ++d) {
    if (DimsConflict(kernel_shape[d], w[d + 2]))
      return "kernel_shape does not match W " + ToString(w);
  }
  if (b != nullptr && (b->size() != 1 || DimsConflict((*b)[0], maps)))
    return "B must have shape [M] = [" + std::to_string(maps) + "], is " + ToString(*b);
  return std::nullopt;
}

class ConvWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    op_rules::WindowAttributes window;
    int64_t group;
    bool has_bias;
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(
        op, {.min_inputs = 2,
             .max_inputs = 3,
             .attributes = {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}}));
    const Shape& x = op.inputs[0].shape;
    BACKPLANE_RETURN_IF_ERROR(CheckSpatialRank(op, x));
    auto window = ParseWindowAttributes(op, x.size() - 2, op_rules::WindowOp::kConv);
    if (!window.ok())
      return window.error();
    auto group = IntAttribute(op, "group", 1);
    if (!group.ok())
      return group.error();
    if (group.value() < 1)
      return NodeInvalid(op, "attribute 'group' must be >= 1, is " + std::to_string(group.value()));
    const bool has_bias = HasInput(op, 2);
    if (auto error = ConvShapeError(x, op.inputs[1].shape, has_bias ? &op.inputs[2].shape : nullptr,
                                    group.value(), window.value().kernel_shape)) {
      return NodeInvalid(op, *error);
    }
    return Params{NodeLabel(op), std::move(window).value(), group.value(), has_bias};
  }

  explicit ConvWorkload(Params params)
      : WorkloadBase(params.label, 2, 3, 1), params_(std::move(params)) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    if (params_.has_bias && inputs.size() != 3)
      return Invalid("input B is missing");
    const Shape& x_shape = inputs[0].info.shape;
    const Shape& w_shape = inputs[1].info.shape;
    if (x_shape.size() < 3 || x_shape.size() - 2 > kMaxSpatialRank)
      return Invalid("X has an unsupported shape " + ToString(x_shape));
    if (auto error =
            ConvShapeError(x_shape, w_shape, params_.has_bias ? &inputs[2].info.shape : nullptr,
                           params_.group, params_.window.kernel_shape)) {
      return Invalid(*error);
    }
    WindowGeometry g;
    const std::span<const int64_t> spatial(x_shape.begin() + 2, x_shape.end());
    const std::span<const int64_t> kernel(w_shape.begin() + 2, w_shape.end());
    if (Status status = ComputeGeometry(params_.window, spatial, kernel, &g); !status.ok())
      return Invalid(status.message());
    const int64_t batch = x_shape[0], channels = x_shape[1], maps = w_shape[0];
    Shape y_shape{batch, maps};
    y_shape.insert(y_shape.end(), g.out.begin(), g.out.begin() + g.rank);
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], y_shape));

    const auto x = inputs[0].Elements<float>();
    const auto w = inputs[1].Elements<float>();
    const auto y = outputs[0].Elements<float>();
    const int64_t group_channels = channels / params_.group;
    const int64_t group_maps = maps / params_.group;
    for (int64_t n = 0; n < batch; ++n) {
      for (int64_t m = 0; m < maps; ++m) {
        const int64_t first_channel = (m / group_maps) * group_channels;
        const double bias = params_.has_bias ? inputs[2].Elements<float>()[m] : 0.0;
        for (int64_t o = 0; o < g.out_count; ++o) {
          double sum = bias;
          for (int64_t c = 0; c < group_channels; ++c) {
            const int64_t x_base = (n * channels + first_channel + c) * g.in_count;
            const int64_t w_base = (m * group_channels + c) * g.kernel_count;
            g.ForEachTap(o, [&](int64_t k, int64_t input_index, bool) {
              if (input_index >= 0)
                sum += static_cast<double>(x[x_base + input_index]) * w[w_base + k];
            });
          }
          y[(n * maps + m) * g.out_count + o] = static_cast<float>(sum);
        }
      }
    }
    return Status::Ok();
  }

  const Params params_;
};

// ---- MaxPool, AveragePool -------------------------------------------------------------------

enum class PoolKind { kMax, kAverage };

template <PoolKind kKind>
class PoolWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    op_rules::WindowAttributes window;
    bool count_include_pad;
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    if constexpr (kKind == PoolKind::kMax) {
      if (op.outputs.size() == 2) {
        return NodeUnimplemented(
            op, "the optional second output Indices is not supported (CpuRef computes Y only)");
      }
    }
    if constexpr (kKind == PoolKind::kMax) {
      BACKPLANE_RETURN_IF_ERROR(
          CheckSignature(op, {.attributes = {"auto_pad", "ceil_mode", "dilations", "kernel_shape",
                                             "pads", "storage_order", "strides"}}));
    } else {
      BACKPLANE_RETURN_IF_ERROR(
          CheckSignature(op, {.attributes = {"auto_pad", "ceil_mode", "count_include_pad",
                                             "dilations", "kernel_shape", "pads", "strides"}}));
    }
    const Shape& x = op.inputs[0].shape;
    BACKPLANE_RETURN_IF_ERROR(CheckSpatialRank(op, x));
    auto window = ParseWindowAttributes(op, x.size() - 2, op_rules::WindowOp::kPool);
    if (!window.ok())
      return window.error();
    bool count_include_pad = false;
    if constexpr (kKind == PoolKind::kMax) {
      // storage_order only orders Indices, which is refused above.
      BACKPLANE_RETURN_IF_ERROR(StatusOf(FlagAttribute(op, "storage_order", false)));
    } else {
      auto include = FlagAttribute(op, "count_include_pad", false);
      if (!include.ok())
        return include.error();
      count_include_pad = include.value();
    }
    return Params{NodeLabel(op), std::move(window).value(), count_include_pad};
  }

  explicit PoolWorkload(Params params)
      : WorkloadBase(params.label, 1, 1, 1), params_(std::move(params)) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& x_shape = inputs[0].info.shape;
    if (x_shape.size() != params_.window.kernel_shape.size() + 2)
      return Invalid("X " + ToString(x_shape) + " does not match kernel_shape");
    WindowGeometry g;
    const std::span<const int64_t> spatial(x_shape.begin() + 2, x_shape.end());
    if (Status status = ComputeGeometry(params_.window, spatial, params_.window.kernel_shape, &g);
        !status.ok()) {
      return Invalid(status.message());
    }
    Shape y_shape{x_shape[0], x_shape[1]};
    y_shape.insert(y_shape.end(), g.out.begin(), g.out.begin() + g.rank);
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], y_shape));

    const auto x = inputs[0].Elements<float>();
    const auto y = outputs[0].Elements<float>();
    const int64_t planes = x_shape[0] * x_shape[1];
    for (int64_t plane = 0; plane < planes; ++plane) {
      const int64_t x_base = plane * g.in_count;
      for (int64_t o = 0; o < g.out_count; ++o) {
        float max = -INFINITY;  // a window wholly in the padding (only with huge pads) stays -inf
        double sum = 0.0;
        int64_t count = 0;
        g.ForEachTap(o, [&](int64_t, int64_t input_index, bool in_padded) {
          if (input_index >= 0) {
            max = std::max(max, x[x_base + input_index]);
            sum += x[x_base + input_index];
          }
          // count_include_pad counts the explicit/auto padding, never the extra positions a
          // ceil_mode window reaches beyond it.
          if (params_.count_include_pad ? in_padded : input_index >= 0)
            ++count;
        });
        if constexpr (kKind == PoolKind::kMax) {
          y[plane * g.out_count + o] = max;
        } else {
          y[plane * g.out_count + o] = static_cast<float>(sum / static_cast<double>(count));
        }
      }
    }
    return Status::Ok();
  }

  const Params params_;
};

// ---- GlobalAveragePool, GlobalMaxPool -----------------------------------------------------

template <PoolKind kKind>
class GlobalPoolWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {}));
    if (op.inputs[0].shape.size() < 2)
      return NodeInvalid(op, "X must be N x C x ..., is " + ToString(op.inputs[0].shape));
    return Params{NodeLabel(op)};
  }

  explicit GlobalPoolWorkload(Params params) : WorkloadBase(std::move(params.label), 1, 1, 1) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const Shape& x_shape = inputs[0].info.shape;
    if (x_shape.size() < 2)
      return Invalid("X must be N x C x ..., is " + ToString(x_shape));
    Shape y_shape(x_shape.size(), 1);
    y_shape[0] = x_shape[0];
    y_shape[1] = x_shape[1];
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], y_shape));
    const int64_t planes = x_shape[0] * x_shape[1];
    const int64_t size = ElementCount(x_shape) / std::max<int64_t>(planes, 1);
    const auto x = inputs[0].Elements<float>();
    const auto y = outputs[0].Elements<float>();
    for (int64_t plane = 0; plane < planes; ++plane) {
      float max = -INFINITY;
      double sum = 0.0;
      for (int64_t i = 0; i < size; ++i) {
        max = std::max(max, x[plane * size + i]);
        sum += x[plane * size + i];
      }
      y[plane] =
          kKind == PoolKind::kMax ? max : static_cast<float>(sum / static_cast<double>(size));
    }
    return Status::Ok();
  }
};

constexpr KernelEntry kWindowKernels[] = {
    {"Conv", CheckKernel<ConvWorkload>, CreateKernel<ConvWorkload>},
    {"MaxPool", CheckKernel<PoolWorkload<PoolKind::kMax>>,
     CreateKernel<PoolWorkload<PoolKind::kMax>>},
    {"AveragePool", CheckKernel<PoolWorkload<PoolKind::kAverage>>,
     CreateKernel<PoolWorkload<PoolKind::kAverage>>},
    {"GlobalAveragePool", CheckKernel<GlobalPoolWorkload<PoolKind::kAverage>>,
     CreateKernel<GlobalPoolWorkload<PoolKind::kAverage>>},
    {"GlobalMaxPool", CheckKernel<GlobalPoolWorkload<PoolKind::kMax>>,
     CreateKernel<GlobalPoolWorkload<PoolKind::kMax>>},
};

}  // namespace

std::span<const KernelEntry> WindowKernels() {
  return kWindowKernels;
}

}  // namespace backplane::cpu_ref
