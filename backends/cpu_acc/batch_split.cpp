#include "batch_split.hpp"

#include <algorithm>
#include <string_view>

#include "op_support.hpp"

namespace backplane::cpu_acc {
namespace {

// Ops that compute each sample from that sample alone whatever their attributes, with the batch
// in input 0 only (their other inputs, when present, must be constants: weights, bounds).
// constexpr, not a std::set: a backend's namespace-scope object with a constructor runs at every
// dlopen and its destructor at every dlclose, writing into pages a later generation reuses.
constexpr std::string_view kPerSample[] = {
    "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Relu", "LeakyRelu",
    "HardSigmoid", "HardSwish", "Clip", "Sigmoid", "Tanh", "Dropout", "Identity",
    "BatchNormalization",
    // Views: with the first dimension B on both sides, sample i is the i-th contiguous block of
    // elements before and after (the output's first dimension is checked with every layer's).
    "Flatten", "Reshape"};

bool IsBinary(std::string_view type) {
  return type == "Add" || type == "Sub" || type == "Mul" || type == "Div";
}

// Per input of `op`: whether it carries the batch (true) or must be a constant or absent (false).
// nullopt when the op or its attributes combine samples (an axis 0, a transposed batch, a
// reduction over it) or CpuAcc's split has no rule for the op.
std::optional<std::vector<bool>> BatchInputs(const OperatorDesc& op) {
  const std::size_t count = op.inputs.size();
  const auto rank = static_cast<int64_t>(op.inputs.empty() ? 0 : op.inputs[0].shape.size());
  std::vector<bool> carries(count, false);
  if (count == 0)
    return std::nullopt;
  carries[0] = true;
  const std::string_view type = op.op_type;
  if (std::ranges::find(kPerSample, type) != std::end(kPerSample))
    return carries;
  if (type == "Softmax" || type == "Concat") {
    const auto axis = NormalizedAxis(IntAttr(op, "axis", type == "Softmax" ? -1 : 0), rank);
    if (!axis || *axis == 0)
      return std::nullopt;
    std::fill(carries.begin(), carries.end(), type == "Concat");
    carries[0] = true;
    return carries;
  }
  if (type == "Transpose") {
    const auto perm = IntsAttr(op, "perm");  // none: the dims reversed, the batch last
    if (perm.empty() || perm[0] != 0)
      return std::nullopt;
    return carries;
  }
  if (type == "Pad") {
    if (!IsConstant(op, 1))
      return std::nullopt;
    const auto* pads = static_cast<const int64_t*>(op.constant_inputs[1]);
    if (op.inputs[1].shape.size() != 1 || op.inputs[1].shape[0] != 2 * rank || pads[0] != 0 ||
        pads[rank] != 0) {
      return std::nullopt;  // padding along the batch adds samples
    }
    return carries;
  }
  if (type == "Gemm") {
    if (IntAttr(op, "transA", 0) != 0)
      return std::nullopt;  // the batch would be A's columns
    if (IsConstant(op, 2) && op.inputs[2].shape.size() == 2 && op.inputs[2].shape[0] != 1)
      return std::nullopt;  // C [M, N]: a bias per sample
    return carries;
  }
  if (type == "MatMul") {
    // A [B, ..., K] times constant weights shared by every sample: [K, N] or [K].
    if (rank < 2 || count != 2 || op.inputs[1].shape.size() > 2)
      return std::nullopt;
    return carries;
  }
  if (IsBinary(type)) {
    const std::size_t out_rank = op.outputs.empty() ? 0 : op.outputs[0].shape.size();
    for (std::size_t k = 0; k < count; ++k) {
      if (!IsConstant(op, k)) {
        carries[k] = true;  // checked below: rank and first dimension of the output
        if (op.inputs[k].shape.size() != out_rank)
          return std::nullopt;  // broadcast along the batch from fewer dims
      } else {
        carries[k] = false;
        const Shape& shape = op.inputs[k].shape;
        if (shape.size() == out_rank && !shape.empty() && shape[0] != 1)
          return std::nullopt;  // a constant per sample
      }
    }
    return carries;
  }
  return std::nullopt;
}

// The FLOPs of the run's convolutions and matrix products (the work a split shares out).
double RunFlops(const SubgraphDesc& run) {
  double flops = 0;
  for (const OperatorDesc& op : run.layers) {
    if (op.outputs.empty() || op.inputs.size() < 2)
      continue;
    const auto out = static_cast<double>(ElementCount(op.outputs[0].shape));
    if (op.op_type == "Conv") {
      const Shape& w = op.inputs[1].shape;
      flops += 2.0 * out * static_cast<double>(ElementCount(w) / std::max<int64_t>(w[0], 1));
    } else if (op.op_type == "Gemm" || op.op_type == "MatMul") {
      const Shape& a = op.inputs[0].shape;
      const bool ta = op.op_type == "Gemm" && IntAttr(op, "transA", 0) != 0;
      flops += 2.0 * out * static_cast<double>(a.empty() ? 1 : (ta ? a.front() : a.back()));
    }
  }
  return flops;
}

// The elements of their constant weights.
double RunWeights(const SubgraphDesc& run) {
  double weights = 0;
  for (const OperatorDesc& op : run.layers) {
    const bool product = op.op_type == "Conv" || op.op_type == "Gemm" || op.op_type == "MatMul";
    if (product && op.inputs.size() >= 2 && IsConstant(op, 1))
      weights += static_cast<double>(ElementCount(op.inputs[1].shape));
  }
  return weights;
}

}  // namespace

std::optional<int64_t> SplittableBatch(const SubgraphDesc& run) {
  if (run.input_infos.empty() || run.input_infos[0].shape.empty())
    return std::nullopt;
  const int64_t batch = run.input_infos[0].shape[0];
  if (batch < 2)
    return std::nullopt;
  auto batched = [&](const TensorInfo& info) {
    return info.type == DataType::kFloat32 && !info.shape.empty() && info.shape[0] == batch;
  };
  if (!std::all_of(run.input_infos.begin(), run.input_infos.end(), batched) ||
      !std::all_of(run.output_infos.begin(), run.output_infos.end(), batched)) {
    return std::nullopt;
  }
  for (const OperatorDesc& op : run.layers) {
    const auto carries = BatchInputs(op);
    if (!carries)
      return std::nullopt;
    for (std::size_t k = 0; k < op.inputs.size(); ++k) {
      if ((*carries)[k] ? !(batched(op.inputs[k]) && !IsConstant(op, k))
                        : HasInput(op, k) && !IsConstant(op, k)) {
        return std::nullopt;
      }
    }
    if (!std::all_of(op.outputs.begin(), op.outputs.end(), batched))
      return std::nullopt;
  }
  return batch;
}

bool SplitPays(const SubgraphDesc& run, int64_t parts) {
  const double flops = RunFlops(run);
  return flops >= kBatchSplitMinFlops &&
         flops / static_cast<double>(parts) >= kBatchSplitMinFlopsPerWeight * RunWeights(run);
}

SubgraphDesc WithBatch(const SubgraphDesc& run, int64_t rows) {
  SubgraphDesc part = run;
  auto resize = [rows](TensorInfo& info) {
    if (!info.shape.empty())
      info.shape[0] = rows;
  };
  for (OperatorDesc& op : part.layers) {
    for (std::size_t k = 0; k < op.inputs.size(); ++k) {
      if (HasInput(op, k) && !IsConstant(op, k))
        resize(op.inputs[k]);
    }
    std::for_each(op.outputs.begin(), op.outputs.end(), resize);
  }
  std::for_each(part.input_infos.begin(), part.input_infos.end(), resize);
  std::for_each(part.output_infos.begin(), part.output_infos.end(), resize);
  return part;
}

std::vector<int64_t> PartRows(int64_t batch, int64_t parts) {
  parts = std::clamp<int64_t>(parts, 1, std::max<int64_t>(batch, 1));
  std::vector<int64_t> rows(static_cast<std::size_t>(parts), batch / parts);
  for (int64_t p = 0; p < batch % parts; ++p)
    ++rows[static_cast<std::size_t>(p)];
  return rows;
}

}  // namespace backplane::cpu_acc
