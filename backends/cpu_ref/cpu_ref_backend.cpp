// CpuRef: plain, obviously-correct reference kernels. Every other backend is checked against it,
// so clarity beats speed here: single-threaded loops, sums accumulated in double.
//
// Ops (ONNX semantics, opsets 13-25, FP32 only): Add, Sub, Mul, Div, Relu, LeakyRelu, Sigmoid,
// HardSigmoid, HardSwish, Tanh, Clip, Dropout (inference), Softmax, Gemm, MatMul, Conv, MaxPool,
// AveragePool, GlobalAveragePool, GlobalMaxPool, BatchNormalization, Flatten, Reshape, Transpose,
// Concat, Pad (constant mode), Identity; and QuantizeLinear (FP32 to UINT8/INT8) and
// DequantizeLinear (UINT8/INT8/INT32 to FP32), per tensor and per axis. Constant is not a backend
// op (the host folds it).
//
// The contract with the host:
//  - IsSupported(op) is OK, or kUnimplemented naming the node, the op and the reason (an
//    unsupported attribute or attribute value, a non-FP32 tensor, MaxPool's Indices output,
//    BatchNormalization training_mode=1, a Reshape shape, Pad's pads, Clip's bounds or Dropout's
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
#include <string>

#include "kernel_support.hpp"

namespace backplane::cpu_ref {
namespace {

constexpr std::string_view kId = "CpuRef";

const KernelEntry* FindKernel(std::string_view op_type) {
  for (auto family : {ElementwiseKernels(), MatrixKernels(), WindowKernels(), LayoutKernels(),
                      QuantizeKernels()}) {
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

// Thread-safe: no mutable state besides the option set, which locks.
class CpuRefBackend final : public IBackend {
 public:
  std::string_view GetId() const override { return kId; }

  Status IsSupported(const OperatorDesc& op) const override {
    const KernelEntry* kernel = FindKernel(op.op_type);
    return kernel != nullptr ? kernel->check(op) : NotImplemented(op);
  }

  Result<std::unique_ptr<IWorkload>> CreateWorkload(const OperatorDesc& op) override {
    const KernelEntry* kernel = FindKernel(op.op_type);
    if (kernel == nullptr)
      return NotImplemented(op);
    return kernel->create(op);
  }

  std::vector<OptionDescriptor> DescribeOptions() const override { return options_.descriptors(); }
  Status UpdateOptions(const BackendOptions& changes) override { return options_.Update(changes); }
  Result<OptionValue> GetOption(std::string_view key) const override { return options_.Get(key); }

 private:
  OptionSet options_{std::string(kId),
                     {{"deterministic", OptionType::kBool, true,
                       "run kernels single-threaded in a fixed order (CpuRef always does; kept "
                       "for option compatibility with optimised backends)"}}};
};

}  // namespace
}  // namespace backplane::cpu_ref

BACKPLANE_DEFINE_BACKEND(backplane::cpu_ref::CpuRefBackend, "CpuRef")
