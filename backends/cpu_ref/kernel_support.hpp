// What every CpuRef kernel shares: validation of an OperatorDesc (counts, types, attributes),
// typed attribute readers, shape arithmetic, and the workload base class that keeps exceptions
// inside the backend.
//
// Every kernel family (elementwise_kernels.cpp, …) describes its ops with KernelEntry rows; the
// backend (cpu_ref_backend.cpp) dispatches on op_type through them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "backplane/sdk/backend.hpp"
#include "backplane/sdk/op_rules.hpp"  // window geometry and broadcasting, as ONNX defines them

namespace backplane::cpu_ref {

// One op: `check` answers IsSupported (validation only, no allocation of workload state);
// `create` validates the same way and captures what the workload needs.
struct KernelEntry {
  std::string_view op_type;
  Status (*check)(const OperatorDesc&);
  Result<std::unique_ptr<IWorkload>> (*create)(const OperatorDesc&);
};

// Add Sub Mul Div Pow Sqrt Erf Relu LeakyRelu Sigmoid HardSigmoid HardSwish Tanh Clip Dropout
// Softmax BatchNormalization
std::span<const KernelEntry> ElementwiseKernels();
std::span<const KernelEntry> MatrixKernels();    // Gemm MatMul
std::span<const KernelEntry> WindowKernels();    // Conv MaxPool AveragePool Global*Pool
std::span<const KernelEntry> LayoutKernels();    // Identity Flatten Reshape Transpose Concat Pad
std::span<const KernelEntry> QuantizeKernels();  // QuantizeLinear DequantizeLinear
// Shape Gather Unsqueeze Squeeze Slice Expand ConstantOfShape Range Where Equal Cast Neg Not
std::span<const KernelEntry> IndexKernels();
std::span<const KernelEntry> ReduceKernels();  // ReduceMean ReduceSum LayerNormalization

// Every kernel is a class W with
//   struct Params;                                   // attributes and constants, immutable
//   static Result<Params> Parse(const OperatorDesc&);
//   explicit W(Params);
// and these two adapters turn it into a KernelEntry.
template <typename W>
Status CheckKernel(const OperatorDesc& op) {
  auto params = W::Parse(op);
  return params.ok() ? Status::Ok() : params.error();
}

template <typename W>
Result<std::unique_ptr<IWorkload>> CreateKernel(const OperatorDesc& op) {
  auto params = W::Parse(op);
  if (!params.ok())
    return params.error();
  return std::unique_ptr<IWorkload>(std::make_unique<W>(std::move(params).value()));
}

// The status of a result whose value is not needed.
template <typename T>
Status StatusOf(const Result<T>& result) {
  return result.ok() ? Status::Ok() : result.error();
}

// ---- messages -------------------------------------------------------------------------------

// "Conv node 'conv1'", the start of every message about one node.
std::string NodeLabel(const OperatorDesc& op);
Status NodeUnimplemented(const OperatorDesc& op, const std::string& reason);
Status NodeInvalid(const OperatorDesc& op, const std::string& reason);
// `status` (its code kept) with the node named in front of its message.
Status NodeError(const OperatorDesc& op, const Status& status);

// ---- validation of a description ------------------------------------------------------------

struct Signature {
  std::size_t min_inputs = 1;
  std::size_t max_inputs = 1;
  std::size_t outputs = 1;
  std::initializer_list<std::string_view> attributes = {};
  // Inputs with an index below this must be FP32 (Reshape's shape input is INT64).
  std::size_t float_inputs = SIZE_MAX;
  // The kernel checks element types itself (CheckTypeIn): nothing is held to FP32 here.
  bool typed = false;
};

// Input/output counts (kInvalidArgument), shapes within core's bound on element counts
// (kInvalidArgument), FP32 data (kUnimplemented), known attribute names (kUnimplemented: an
// attribute is never silently ignored).
Status CheckSignature(const OperatorDesc& op, const Signature& signature);

// The element types the kernels that move or pick bytes take (every type CpuRef has).
inline constexpr std::initializer_list<DataType> kAnyType = {DataType::kFloat32, DataType::kInt64,
                                                             DataType::kInt32,   DataType::kBool,
                                                             DataType::kUint8,   DataType::kInt8};

// kUnimplemented naming the node unless input `index` is of one of `types`.
Status CheckTypeIn(const OperatorDesc& op, std::size_t index,
                   std::initializer_list<DataType> types);

// core's VisitElementType over the types CpuRef has (float; int64_t; int32_t; uint8_t for BOOL
// and UINT8; int8_t), returning what `visit` returns; `otherwise()` for any other type.
template <typename Visit, typename Otherwise>
auto VisitElementType(DataType type, Visit&& visit, Otherwise&& otherwise) {
  return ::backplane::VisitElementType(type, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, double> || std::is_same_v<T, std::byte>)
      return otherwise();
    else
      return visit(tag);
  });
}

// An INT64 or INT32 view's elements widened to int64 (shapes, axes, indices given as values).
std::vector<int64_t> IndexValues(const ConstTensorView& view);

// kInvalidArgument naming the node and the input or output when the known dimensions of one
// multiply past kMaxElementCount: every kernel's shape arithmetic (rows x columns, strides,
// outer x inner) relies on that bound, so a description that breaks it is never parsed further.
Status CheckShapeBounds(const OperatorDesc& op);

// True when optional input `index` is given: present and not DataType::kUndefined.
bool HasInput(const OperatorDesc& op, std::size_t index);

// Typed attribute readers: the default when absent, kInvalidArgument when of another type.
Result<int64_t> IntAttribute(const OperatorDesc& op, std::string_view key, int64_t fallback);
Result<float> FloatAttribute(const OperatorDesc& op, std::string_view key, float fallback);
Result<std::string> StringAttribute(const OperatorDesc& op, std::string_view key,
                                    std::string fallback);
// std::nullopt when absent.
Result<std::optional<std::vector<int64_t>>> IntsAttribute(const OperatorDesc& op,
                                                          std::string_view key);

// A boolean-like int attribute: 0 or 1, else kInvalidArgument.
Result<bool> FlagAttribute(const OperatorDesc& op, std::string_view key, bool fallback);

// `axis` in [-rank, rank + extra) normalised to [0, rank + extra), else kInvalidArgument.
Result<int64_t> NormalizeAxis(const OperatorDesc& op, int64_t axis, int64_t rank,
                              int64_t extra = 0);

// ---- shapes ---------------------------------------------------------------------------------

// Row-major strides, in elements.
std::vector<int64_t> Strides(const Shape& shape);

// Both dims known and different.
inline bool DimsConflict(int64_t a, int64_t b) {
  return a >= 0 && b >= 0 && a != b;
}

// ---- execution ------------------------------------------------------------------------------

// The base of every CpuRef workload: checks the tensor counts, then runs Run() inside a try so
// that no exception leaves the backend (Execute must return errors as Status).
//
// Thread-safe: subclasses keep only immutable members; everything per request is on the stack.
class WorkloadBase : public IWorkload {
 public:
  WorkloadBase(std::string label, std::size_t min_inputs, std::size_t max_inputs,
               std::size_t outputs)
      : label_(std::move(label)),
        min_inputs_(min_inputs),
        max_inputs_(max_inputs),
        outputs_(outputs) {}

  Status Execute(std::span<const ConstTensorView> inputs,
                 std::span<const TensorView> outputs) final;

 protected:
  virtual Status Run(std::span<const ConstTensorView> inputs,
                     std::span<const TensorView> outputs) const = 0;

  // kInvalidArgument unless the host allocated `output` with shape `expected` (what this kernel
  // computes from the input views).
  Status CheckOutputShape(const TensorView& output, const Shape& expected) const;
  Status Invalid(const std::string& reason) const;
  const std::string& label() const { return label_; }

 private:
  const std::string label_;
  const std::size_t min_inputs_;
  const std::size_t max_inputs_;
  const std::size_t outputs_;
};

}  // namespace backplane::cpu_ref
