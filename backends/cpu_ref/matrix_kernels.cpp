// Gemm and MatMul: the textbook triple loop, accumulated in double.
#include "kernel_support.hpp"

namespace backplane::cpu_ref {
namespace {

// ---- Gemm: Y = alpha * A' * B' + beta * C -----------------------------------------------------

struct GemmDims {
  int64_t m, k, n;
};

// The problem size and a check of C against [M,N] (unidirectional broadcasting: scalar, [N],
// [1,N], [M,1], [M,N], or any shape whose dims are 1 or equal). Dynamic dims pass.
std::optional<std::string> GemmShapeError(const Shape& a, const Shape& b, const Shape* c,
                                          bool trans_a, bool trans_b, GemmDims* dims) {
  if (a.size() != 2 || b.size() != 2)
    return "A and B must be 2-D, are " + ToString(a) + " and " + ToString(b);
  const int64_t m = trans_a ? a[1] : a[0];
  const int64_t k = trans_a ? a[0] : a[1];
  const int64_t k_b = trans_b ? b[1] : b[0];
  const int64_t n = trans_b ? b[0] : b[1];
  if (DimsConflict(k, k_b)) {
    return "inner dimensions differ: A" + std::string(trans_a ? "'" : "") + " " + ToString(a) +
           " and B" + std::string(trans_b ? "'" : "") + " " + ToString(b);
  }
  if (c != nullptr) {
    const Shape target{m, n};
    bool ok = c->size() <= 2;
    for (std::size_t i = 0; ok && i < c->size(); ++i) {
      const int64_t dim = (*c)[i];
      const int64_t want = target[2 - c->size() + i];
      ok = dim == 1 || !DimsConflict(dim, want);
    }
    if (!ok)
      return "C " + ToString(*c) + " does not broadcast to [M,N] = " + ToString(target);
  }
  *dims = {m, k, n};
  return std::nullopt;
}

class GemmWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
    float alpha, beta;
    bool trans_a, trans_b;
    bool has_c;
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(
        op,
        {.min_inputs = 2, .max_inputs = 3, .attributes = {"alpha", "beta", "transA", "transB"}}));
    auto alpha = FloatAttribute(op, "alpha", 1.0f);
    auto beta = FloatAttribute(op, "beta", 1.0f);
    auto trans_a = FlagAttribute(op, "transA", false);
    auto trans_b = FlagAttribute(op, "transB", false);
    for (const Status& status :
         {StatusOf(alpha), StatusOf(beta), StatusOf(trans_a), StatusOf(trans_b)}) {
      BACKPLANE_RETURN_IF_ERROR(status);
    }
    const bool has_c = HasInput(op, 2);
    GemmDims dims;
    if (auto error = GemmShapeError(op.inputs[0].shape, op.inputs[1].shape,
                                    has_c ? &op.inputs[2].shape : nullptr, trans_a.value(),
                                    trans_b.value(), &dims)) {
      return NodeInvalid(op, *error);
    }
    return Params{NodeLabel(op),   alpha.value(),   beta.value(),
                  trans_a.value(), trans_b.value(), has_c};
  }

  explicit GemmWorkload(Params params)
      : WorkloadBase(params.label, 2, 3, 1), params_(std::move(params)) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    const bool has_c = params_.has_c;
    if (has_c && inputs.size() != 3)
      return Invalid("input C is missing");
    const Shape* c_shape = has_c ? &inputs[2].info.shape : nullptr;
    GemmDims dims;
    if (auto error = GemmShapeError(inputs[0].info.shape, inputs[1].info.shape, c_shape,
                                    params_.trans_a, params_.trans_b, &dims)) {
      return Invalid(*error);
    }
    const auto [m_size, k_size, n_size] = dims;
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], {m_size, n_size}));
    const auto a = inputs[0].Elements<float>();
    const auto b = inputs[1].Elements<float>();
    const auto y = outputs[0].Elements<float>();
    for (int64_t m = 0; m < m_size; ++m) {
      for (int64_t n = 0; n < n_size; ++n) {
        double sum = 0.0;
        for (int64_t k = 0; k < k_size; ++k) {
          const float a_mk = params_.trans_a ? a[k * m_size + m] : a[m * k_size + k];
          const float b_kn = params_.trans_b ? b[n * k_size + k] : b[k * n_size + n];
          sum += static_cast<double>(a_mk) * b_kn;
        }
        double value = static_cast<double>(params_.alpha) * sum;
        if (has_c) {
          // C broadcast to [M,N]: its trailing dims line up with [M,N]; a dim of 1 repeats.
          const Shape& c = *c_shape;
          int64_t offset = 0;
          if (c.size() == 1) {
            offset = c[0] == 1 ? 0 : n;
          } else if (c.size() == 2) {
            offset = (c[0] == 1 ? 0 : m) * c[1] + (c[1] == 1 ? 0 : n);
          }
          value += static_cast<double>(params_.beta) * inputs[2].Elements<float>()[offset];
        }
        y[m * n_size + n] = static_cast<float>(value);
      }
    }
    return Status::Ok();
  }

  const Params params_;
};

// ---- MatMul: numpy.matmul -----------------------------------------------------------------

struct MatMulGeometry {
  Shape a_batch, b_batch, batch;  // batch dims of each operand and of the result
  int64_t m, k, n;
  Shape output;  // without the dims a 1-D operand does not contribute
};

// A 1-D A is a row [1,K] whose M is dropped from the result; a 1-D B is a column [K,1] whose N
// is dropped. Batch dims broadcast.
std::optional<std::string> MatMulShapeError(const Shape& a, const Shape& b, MatMulGeometry* g) {
  if (a.empty() || b.empty())
    return "operands must have rank >= 1, are " + ToString(a) + " and " + ToString(b);
  const Shape a2 = a.size() == 1 ? Shape{1, a[0]} : a;
  const Shape b2 = b.size() == 1 ? Shape{b[0], 1} : b;
  g->a_batch.assign(a2.begin(), a2.end() - 2);
  g->b_batch.assign(b2.begin(), b2.end() - 2);
  g->m = a2[a2.size() - 2];
  g->k = a2[a2.size() - 1];
  g->n = b2[b2.size() - 1];
  if (DimsConflict(g->k, b2[b2.size() - 2])) {
    return "inner dimensions differ: " + ToString(a) + " and " + ToString(b);
  }
  auto batch = op_rules::Broadcast(g->a_batch, g->b_batch);
  if (!batch.ok())
    return "batch dimensions of " + ToString(a) + " and " + ToString(b) + " do not broadcast";
  g->batch = std::move(batch).value();
  g->output = g->batch;
  if (a.size() > 1)
    g->output.push_back(g->m);
  if (b.size() > 1)
    g->output.push_back(g->n);
  return std::nullopt;
}

class MatMulWorkload final : public WorkloadBase {
 public:
  struct Params {
    std::string label;
  };

  static Result<Params> Parse(const OperatorDesc& op) {
    BACKPLANE_RETURN_IF_ERROR(CheckSignature(op, {.min_inputs = 2, .max_inputs = 2}));
    MatMulGeometry geometry;
    if (auto error = MatMulShapeError(op.inputs[0].shape, op.inputs[1].shape, &geometry))
      return NodeInvalid(op, *error);
    return Params{NodeLabel(op)};
  }

  explicit MatMulWorkload(Params params) : WorkloadBase(std::move(params.label), 2, 2, 1) {}

 private:
  Status Run(std::span<const ConstTensorView> inputs,
             std::span<const TensorView> outputs) const override {
    MatMulGeometry g;
    if (auto error = MatMulShapeError(inputs[0].info.shape, inputs[1].info.shape, &g))
      return Invalid(*error);
    BACKPLANE_RETURN_IF_ERROR(CheckOutputShape(outputs[0], g.output));
    const auto a = inputs[0].Elements<float>();
    const auto b = inputs[1].Elements<float>();
    const auto y = outputs[0].Elements<float>();
    const int64_t batches = ElementCount(g.batch);
    for (int64_t batch = 0; batch < batches; ++batch) {
      // Dropping a 1-D operand's dim does not move any element: y is [batch, M, N] row-major.
      const int64_t a_base = op_rules::BroadcastOffset(batch, g.batch, g.a_batch) * g.m * g.k;
      const int64_t b_base = op_rules::BroadcastOffset(batch, g.batch, g.b_batch) * g.k * g.n;
      const int64_t y_base = batch * g.m * g.n;
      for (int64_t m = 0; m < g.m; ++m) {
        for (int64_t n = 0; n < g.n; ++n) {
          double sum = 0.0;
          for (int64_t k = 0; k < g.k; ++k)
            sum += static_cast<double>(a[a_base + m * g.k + k]) * b[b_base + k * g.n + n];
          y[y_base + m * g.n + n] = static_cast<float>(sum);
        }
      }
    }
    return Status::Ok();
  }
};

constexpr KernelEntry kMatrixKernels[] = {
    {"Gemm", CheckKernel<GemmWorkload>, CreateKernel<GemmWorkload>},
    {"MatMul", CheckKernel<MatMulWorkload>, CreateKernel<MatMulWorkload>},
};

}  // namespace

std::span<const KernelEntry> MatrixKernels() {
  return kMatrixKernels;
}

}  // namespace backplane::cpu_ref
