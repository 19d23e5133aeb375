// Lowers a run of ONNX layers (static shapes) onto oneDNN primitives: one Program.
//
// The same compiler serves CreateWorkload (a run of one layer) and CompileSubgraph. Inside a run
// it fuses (Conv + BatchNormalization folded into the weights + constant Add folded into the bias
// + a residual Add of another value as a sum post-op + Relu/LeakyRelu/Sigmoid/Tanh/HardSigmoid/
// HardSwish/Clip as post-ops; Gemm/MatMul + constant Add as bias + activation post-ops), folds a
// zero spatial Pad into the next Conv's padding, keeps oneDNN's blocked layouts between
// convolutions, pools and element-wise layers (activations, BatchNormalization, a binary op of
// two operands of the output's shape, Identity, Dropout), turns Identity/Dropout/Flatten/Reshape
// into views of the same bytes, and reorders only where a primitive needs another layout (always
// plain row-major at the run's boundary). Quantized (QDQ) convolutions, matrix products and
// residual Adds run as oneDNN int8 primitives on UINT8/INT8 values, the pairs around them fused
// (QuantizedStep, compiler.cpp); other QuantizeLinear/DequantizeLinear are reorders. Each
// layer's primitives are created for, and run with, 1 or `threads` OpenMP threads by its work
// (the two-thread policy, compiler.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backplane/sdk/backend.hpp"
#include "constant_cache.hpp"
#include "oneapi/dnnl/dnnl.hpp"
#include "program.hpp"

namespace backplane::cpu_acc {

// IsSupported: the `check` of the op's row in the op table (compiler.cpp), which the lowering
// uses too; kUnimplemented naming the op when CpuAcc has no row for it.
Status CheckOp(const OperatorDesc& op);

struct CompileResult {
  std::shared_ptr<const Program> program;
  std::vector<std::string> layer_notes;  // per layer
};

struct CompileOptions {
  bool fuse = true;  // false: one primitive per layer
  // Time the candidate implementations of convolutions and matrix products' weight layouts and
  // keep the fastest (milliseconds per layer); false: oneDNN's first choice, for a compile on a
  // request's path (a layer met at a new shape).
  bool tune = true;
};

// kUnimplemented when oneDNN has no primitive for a layer as described (the message names it),
// kInvalidArgument for an inconsistent description. Every shape must be static. The network's
// constants are laid out through `constants`, shared with the backend instance's other programs.
Result<CompileResult> Compile(const SubgraphDesc& subgraph, const dnnl::engine& engine,
                              ConstantCache& constants, int threads, CompileOptions options = {});

// `op` as a run of one layer: its non-constant inputs in order are the boundary inputs (their
// indices in op.inputs in `input_indices`), all its outputs the boundary outputs.
SubgraphDesc SingleLayer(const OperatorDesc& op, std::vector<std::size_t>* input_indices);

}  // namespace backplane::cpu_acc
