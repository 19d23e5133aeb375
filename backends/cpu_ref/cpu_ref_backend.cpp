// CpuRef: plain, obviously-correct reference kernels. Every other backend is checked against it,
// so clarity beats speed here: single-threaded loops, sums accumulated in double.
//
// Ops (ONNX semantics, opsets 13-25, FP32 unless said): Add, Sub, Mul, Div (and INT64, INT32),
// Pow, Sqrt, Erf, Relu, LeakyRelu, Sigmoid, HardSigmoid, HardSwish, Tanh, Clip, Dropout
// (inference), Softmax, Gemm, MatMul, Conv, MaxPool, AveragePool, GlobalAveragePool,
// GlobalMaxPool, BatchNormalization, ReduceMean, ReduceSum, LayerNormalization, Flatten; Reshape
// (to a constant or a computed shape), Transpose, Concat, Identity, Gather, Shape, Unsqueeze,
// Squeeze, Slice, Expand, Where on every type; ConstantOfShape, Range, Equal, Cast (FP32, INT64,
// INT32, BOOL), Neg, Not (BOOL); Pad (constant mode); and QuantizeLinear (FP32 to UINT8/INT8) and
// DequantizeLinear (UINT8/INT8/INT32 to FP32), per tensor and per axis. Constant is not a backend
// op (the host folds it).
//
// The contract with the host:
//  - IsSupported(op) is OK, or kUnimplemented naming the node, the op and the reason (an
//    unsupported attribute or attribute value, a tensor of a type the op does not take, MaxPool's
//    Indices output, BatchNormalization training_mode=1, Pad's pads, Clip's bounds or Dropout's
//    training_mode that are not constants, Dropout's BOOL mask, a Pad mode but constant), or
//    kInvalidArgument when the description is inconsistent (counts of inputs/outputs, shapes that
//    cannot broadcast or multiply, attribute values ONNX forbids). An attribute the kernel does
//    not know is kUnimplemented "unsupported attribute 'x'": never silently ignored. It only
//    reads the description; no allocation beyond messages.
//  - CreateWorkload(op) validates exactly as IsSupported does and captures the attributes (and
//    copies of the constants it reads: Reshape's shape, Pad's pads and value, Clip's bounds).
//    op.inputs/op.outputs may have negative (dynamic) dims; those pass every check they could fail
//    later.
//  - An omitted optional input (Conv's B, Gemm's C) is either absent from op.inputs or present
//    with DataType::kUndefined; the workload then expects the same number of views at Execute.
//  - IWorkload::Execute(inputs, outputs) gets views with fully resolved shapes and outputs
//    allocated by the host with the shapes its ONNX shape inference gave. Kernels compute from
//    the shapes of the views (never from creation time) and answer kInvalidArgument, writing
//    nothing, when an output was allocated with another shape than the inputs imply. Reshape,
//    Flatten and Identity copy bytes.
//  - Workloads are thread-safe: immutable after creation, per-request state on the stack. Errors
//    are returned as Status; an exception inside a kernel becomes kInternal (WorkloadBase).
#include <cmath>
#include <string>

#include "kernel_support.hpp"

namespace backplane::cpu_ref {
namespace {

constexpr std::string_view kId = "CpuRef";

const KernelEntry* FindKernel(std::string_view op_type) {
  for (auto family : {ElementwiseKernels(), MatrixKernels(), WindowKernels(), LayoutKernels(),
                      QuantizeKernels(), IndexKernels(), ReduceKernels()}) {
    for (const KernelEntry& entry : family) {
      if (entry.op_type == op_type)
        return &entry;
    }
  }
  return nullptr;
}

Status NotImplemented(const OperatorDesc& op) {
  if (op.op_type == "Constant") {
    return NodeUnimplemented(op,
                             "Constant is not a backend op: the host folds it into a constant "
                             "tensor");
  }
  return Unimplemented("CpuRef does not implement op " + op.op_type + " (node '" + op.name + "')");
}

constexpr std::string_view kCheckFinite = "check_finite";

// check_finite as `options` give it, else `otherwise`.
bool CheckFiniteIn(const BackendOptions& options, bool otherwise) {
  const auto it = options.find(kCheckFinite);
  const bool* check = it != options.end() ? std::get_if<bool>(&it->second) : nullptr;
  return check != nullptr ? *check : otherwise;
}

// Option check_finite (SDK 1.4, may be given per call): after the kernel, every FP32 output
// element is looked at, and a NaN or an infinity fails the request naming the node and the
// output, so that whoever asks on a request learns which layer first made it non-finite (a
// reference backend is where one goes to find out). Off by default: it reads every output once
// more. The prepared value (the network's, else the instance's) is what a call without values of
// its own runs with; a call's value comes with ExecuteWithOptions, never from the instance, since
// concurrent calls may differ.
//
// Thread-safe like the kernel it wraps.
class FiniteCheckedWorkload final : public IWorkload {
 public:
  FiniteCheckedWorkload(std::unique_ptr<IWorkload> kernel, std::string node, bool check)
      : kernel_(std::move(kernel)), node_(std::move(node)), check_(check) {}

  Status Execute(std::span<const ConstTensorView> inputs,
                 std::span<const TensorView> outputs) override {
    return Run(inputs, outputs, check_);
  }
  Status ExecuteWithOptions(std::span<const ConstTensorView> inputs,
                            std::span<const TensorView> outputs,
                            const BackendOptions& options) override {
    return Run(inputs, outputs, CheckFiniteIn(options, check_));
  }

 private:
  Status Run(std::span<const ConstTensorView> inputs, std::span<const TensorView> outputs,
             bool check) {
    BACKPLANE_RETURN_IF_ERROR(kernel_->Execute(inputs, outputs));
    if (!check)
      return Status::Ok();
    for (std::size_t o = 0; o < outputs.size(); ++o) {
      if (outputs[o].info.type != DataType::kFloat32 || outputs[o].data == nullptr)
        continue;
      const auto values = outputs[o].Elements<float>();
      for (std::size_t i = 0; i < values.size(); ++i) {
        if (!std::isfinite(values[i])) {
          return InvalidArgument("CpuRef check_finite: node '" + node_ + "' output " +
                                 std::to_string(o) + " element " + std::to_string(i) + " is " +
                                 std::to_string(values[i]));
        }
      }
    }
    return Status::Ok();
  }

  const std::unique_ptr<IWorkload> kernel_;
  const std::string node_;
  const bool check_;  // as prepared
};

// Thread-safe: no mutable state besides the option set, which locks.
class CpuRefBackend final : public IBackend {
 public:
  std::string_view GetId() const override { return kId; }

  Status IsSupported(const OperatorDesc& op) const override {
    const KernelEntry* kernel = FindKernel(op.op_type);
    return kernel != nullptr ? kernel->check(op) : NotImplemented(op);
  }

  Result<std::unique_ptr<IWorkload>> CreateWorkload(const OperatorDesc& op) override {
    return Prepare(op, options_.GetAs<bool>(kCheckFinite));
  }
  // SDK 1.3: check_finite as this network runs with it.
  Result<std::unique_ptr<IWorkload>> CreateWorkloadWithOptions(
      const OperatorDesc& op, const BackendOptions& options) override {
    return Prepare(op, CheckFiniteIn(options, options_.GetAs<bool>(kCheckFinite)));
  }
  // SDK 1.4.
  std::vector<std::string> DescribeCallOptions() const override {
    return {std::string(kCheckFinite)};
  }

  std::vector<OptionDescriptor> DescribeOptions() const override { return options_.descriptors(); }
  Status UpdateOptions(const BackendOptions& changes) override { return options_.Update(changes); }
  Result<OptionValue> GetOption(std::string_view key) const override { return options_.Get(key); }

 private:
  Result<std::unique_ptr<IWorkload>> Prepare(const OperatorDesc& op, bool check_finite) {
    const KernelEntry* kernel = FindKernel(op.op_type);
    if (kernel == nullptr)
      return NotImplemented(op);
    auto created = kernel->create(op);
    if (!created.ok())
      return std::move(created).error();
    return std::unique_ptr<IWorkload>(
        new FiniteCheckedWorkload(std::move(created).value(), op.name, check_finite));
  }

  OptionSet options_{std::string(kId),
                     {{"deterministic", OptionType::kBool, true,
                       "run kernels single-threaded in a fixed order (CpuRef always does; kept "
                       "for option compatibility with optimised backends)"},
                      {std::string(kCheckFinite), OptionType::kBool, false,
                       "fail the request naming the first node whose FP32 output holds a NaN or "
                       "an infinity (reads every output once more); may be given per call"}}};
};

}  // namespace
}  // namespace backplane::cpu_ref

BACKPLANE_DEFINE_BACKEND(backplane::cpu_ref::CpuRefBackend, "CpuRef")
