#include "compiler.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

#include "op_support.hpp"

namespace backplane::cpu_acc {
namespace {

using dnnl::algorithm;
using dnnl::memory;
using Md = dnnl::memory::desc;

// A compile-time failure that is not oneDNN's: carried out of the lowering as a Status.
struct CompileError {
  Status status;
};

memory::dims Dims(const Shape& shape) {
  if (shape.empty())
    return {1};  // a scalar is a one-element tensor to oneDNN
  return memory::dims(shape.begin(), shape.end());
}

memory::dims RowMajorStrides(const memory::dims& dims) {
  memory::dims strides(dims.size(), 1);
  for (std::size_t i = dims.size(); i-- > 1;)
    strides[i - 1] = strides[i] * dims[i];
  return strides;
}

// `value` exactly ("%a"), for the recipes that key derived constants (constant_cache.hpp).
std::string HexFloat(float value) {
  char text[32];
  std::snprintf(text, sizeof text, "%a", static_cast<double>(value));
  return text;
}

// Dense row-major; an ONNX scalar (no dims) is [1]. (Shape and memory::dims are one type.)
Md PlainMd(const Shape& shape, memory::data_type type = memory::data_type::f32) {
  const memory::dims dims = Dims(shape);
  return Md(dims, type, RowMajorStrides(dims));
}

bool IsPlain(const Md& md) {
  return md == PlainMd(md.dims(), md.data_type());
}

// A Conv's geometry as oneDNN takes it (float and int8 lowerings alike), from its attributes and
// shapes, checked against the output shape inference gave: a disagreement is a CompileError
// naming the node.
struct ConvGeometry {
  int64_t maps;          // output channels
  Shape output;          // [N, maps, spatial...]
  memory::dims weights;  // the weights' dims, [group, maps / group, ...] when grouped
  memory::dims strides, dilates, pad_l, pad_r;  // dilates as oneDNN counts them (0: none)

  // The forward-inference descriptor; with a bias when `bias` is given.
  dnnl::convolution_forward::desc Desc(const Md& src, const Md& weights_md, const Md* bias,
                                       const Md& dst) const {
    return bias != nullptr
               ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                 algorithm::convolution_direct, src, weights_md,
                                                 *bias, dst, strides, dilates, pad_l, pad_r)
               : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                 algorithm::convolution_direct, src, weights_md,
                                                 dst, strides, dilates, pad_l, pad_r);
  }
};

ConvGeometry ConvGeometryOf(const OperatorDesc& op) {
  const Shape& x = op.inputs[0].shape;
  const Shape& w = op.inputs[1].shape;
  const int64_t group = IntAttr(op, "group", 1);
  auto resolved = ResolveWindow(op, std::span(x).subspan(2), std::span(w).subspan(2),
                                op_rules::WindowOp::kConv);
  if (!resolved.ok())
    throw CompileError{resolved.error()};
  const Window& window = resolved.value();
  ConvGeometry geometry{.maps = w[0], .output = {x[0], w[0]}};
  geometry.output.insert(geometry.output.end(), window.out.begin(), window.out.end());
  if (geometry.output != op.outputs[0].shape) {
    throw CompileError{NodeInvalid(op, "output " + ToString(op.outputs[0].shape) +
                                           ", the window gives " + ToString(geometry.output))};
  }
  geometry.weights = Dims(w);
  if (group > 1) {
    geometry.weights = {group, geometry.maps / group};
    geometry.weights.insert(geometry.weights.end(), w.begin() + 1, w.end());
  }
  geometry.strides.assign(window.strides.begin(), window.strides.end());
  for (int64_t d : window.dilations)
    geometry.dilates.push_back(d - 1);
  geometry.pad_l.assign(window.pad_begin.begin(), window.pad_begin.end());
  geometry.pad_r.assign(window.pad_end.begin(), window.pad_end.end());
  return geometry;
}

// oneDNN's type for a tensor type CpuAcc holds (FP32; UINT8, INT8 between quantized layers).
memory::data_type DnnlType(DataType type) {
  switch (type) {
    case DataType::kUint8:
      return memory::data_type::u8;
    case DataType::kInt8:
      return memory::data_type::s8;
    case DataType::kInt32:
      return memory::data_type::s32;
    default:
      return memory::data_type::f32;
  }
}

const char* TypeName(memory::data_type type) {
  switch (type) {
    case memory::data_type::u8:
      return "u8";
    case memory::data_type::s8:
      return "s8";
    case memory::data_type::s32:
      return "s32";
    default:
      return "f32";
  }
}

// `md`'s layout with elements of `type` (strides and blocks count elements, not bytes).
Md WithType(const Md& md, memory::data_type type) {
  dnnl_memory_desc_t data = md.data;
  data.data_type = static_cast<dnnl_data_type_t>(type);
  data.extra = {};
  return Md(data);
}

// `md` with its first (batch) dim set to `batch`, the layout otherwise the same; nullopt unless
// the batch is the outermost, unblocked dim (plain, channels-last, channel-blocked: every layout a
// convolution here produces), where the other strides stay valid.
std::optional<Md> WithBatch(const Md& md, int64_t batch) {
  dnnl_memory_desc_t data = md.data;
  if (data.format_kind != dnnl_blocked || data.ndims < 1 || data.offset0 != 0)
    return std::nullopt;
  const auto& blocking = data.format_desc.blocking;
  for (int b = 0; b < blocking.inner_nblks; ++b) {
    if (blocking.inner_idxs[b] == 0)
      return std::nullopt;
  }
  for (int d = 1; d < data.ndims; ++d) {
    if (blocking.strides[d] > blocking.strides[0])
      return std::nullopt;
  }
  data.dims[0] = data.padded_dims[0] = batch;
  return Md(data);
}

// Dense channels-last (NHWC and its 3-D and 5-D kin), for ranks 3 to 5; nullopt otherwise.
std::optional<Md> ChannelsLastMd(const Shape& shape) {
  using tag = memory::format_tag;
  static constexpr tag kTags[] = {tag::acb, tag::acdb, tag::acdeb};
  if (shape.size() < 3 || shape.size() > 5)
    return std::nullopt;
  return Md(Dims(shape), memory::data_type::f32, kTags[shape.size() - 3]);
}

// `md` when it is a channel-blocked layout (nChw8c, nChw16c and their 3-D and 5-D kin: one inner
// block, over dim 1, outer dims in plain order), as the format tag that gives it for other dims;
// nullopt otherwise.
std::optional<memory::format_tag> ChannelBlockedTag(const Md& md) {
  using tag = memory::format_tag;
  const int rank = md.data.ndims;
  if (rank < 3 || rank > 5)
    return std::nullopt;
  // Rows: 8- and 16-channel blocks; columns: ranks 3, 4, 5.
  static constexpr tag kTags[2][3] = {{tag::aBc8b, tag::aBcd8b, tag::aBcde8b},
                                      {tag::aBc16b, tag::aBcd16b, tag::aBcde16b}};
  for (const auto& by_rank : kTags) {
    if (md == Md(md.dims(), memory::data_type::f32, by_rank[rank - 3]))
      return by_rank[rank - 3];
  }
  return std::nullopt;
}

// A oneDNN implementation that is its scalar reference code ("ref:any", "simple_nchw:any", ...).
bool IsReferenceImpl(const std::string& name) {
  return name.starts_with("ref") || name.starts_with("simple");
}

// Pads `shape` with leading 1s to `rank`.
Shape PadTo(const Shape& shape, std::size_t rank) {
  Shape padded(rank - shape.size(), 1);
  padded.insert(padded.end(), shape.begin(), shape.end());
  return padded;
}

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

std::string ImplName(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str());
}

// One oneDNN eltwise function: a standalone primitive or a post-op.
struct Eltwise {
  algorithm kind;
  float alpha = 0.0f, beta = 0.0f;
};

// An activation layer as the oneDNN eltwise functions that compute it, applied in order (the
// same list serves a standalone layer and a fused post-op chain); empty for other ops. oneDNN 2.6
// has no hardsigmoid: it is linear then clip.
std::vector<Eltwise> EltwiseSteps(const OperatorDesc& op) {
  const std::string& type = op.op_type;
  if (type == "Relu")
    return {{algorithm::eltwise_relu}};
  if (type == "LeakyRelu")  // x >= 0 ? x : alpha * x, as eltwise_relu with a negative slope
    return {{algorithm::eltwise_relu, FloatAttr(op, "alpha", 0.01f)}};
  if (type == "Sigmoid")
    return {{algorithm::eltwise_logistic}};
  if (type == "Tanh")
    return {{algorithm::eltwise_tanh}};
  if (type == "HardSigmoid") {
    return {{algorithm::eltwise_linear, FloatAttr(op, "alpha", 0.2f), FloatAttr(op, "beta", 0.5f)},
            {algorithm::eltwise_clip, 0.0f, 1.0f}};
  }
  if (type == "HardSwish")  // x * relu6(x + 3) / 6: ONNX's x * hardsigmoid(x, 1/6, 1/2)
    return {{algorithm::eltwise_hardswish}};
  if (type == "Clip") {
    const auto [min, max] = ClipBounds(op);
    return {{algorithm::eltwise_clip, min, max}};
  }
  return {};
}

// Layers whose work is at least these run with intra_op_threads OpenMP threads, smaller ones
// with one: below them a second thread costs more (waking the team, the split, the barrier, and
// the input's cache lines moving to the other core) than it saves. bench/cpu_acc_threads_bench.cpp
// times one layer alone, with warm caches on both cores; inside a model a second thread costs
// more than that bench shows (a small convolution made the whole request slower), while a matrix
// product whose weights fill a core's cache gains from the second core's cache even below the
// convolutions' break-even. Hence three thresholds, each above where the bench broke even (the
// numbers are in docs/performance.md).
constexpr double kParallelMinConvFlops = 1e6;
constexpr double kParallelMinMatMulFlops = 0.5e6;
constexpr double kParallelMinElements = 64e3;

// A bias being folded: values and the shape they broadcast from (numpy rules) to the output.
struct Bias {
  Shape shape;  // empty with no values: no bias yet
  std::vector<float> values;
  bool present = false;

  // this + scale * (data of `add_shape`), broadcast to a common shape.
  void Add(const float* data, const Shape& add_shape, float scale) {
    const Shape current = present ? shape : Shape{};
    // The fusion only folds constants whose shapes broadcast (checked with the layer).
    const Shape target = op_rules::Broadcast(current, add_shape).value();
    std::vector<float> result(static_cast<std::size_t>(ElementCount(target)), 0.0f);
    auto offset = [&](std::size_t flat, const Shape& of) {
      return op_rules::BroadcastOffset(static_cast<int64_t>(flat), target, of);
    };
    for (std::size_t i = 0; i < result.size(); ++i) {
      float value = present ? values[offset(i, current)] : 0.0f;
      result[i] = value + scale * data[offset(i, add_shape)];
    }
    shape = target;
    values = std::move(result);
    present = true;
  }
};

// A quantized convolution or matrix product as ONNX Runtime's QDQ format writes it, run as one
// oneDNN int8 primitive: DequantizeLinear(x: UINT8/INT8, per tensor) and DequantizeLinear(W:
// constant INT8, zero point 0, per tensor or per output channel) [and DequantizeLinear(B:
// constant INT32) or a FP32 constant B] -> Conv/MatMul/Gemm -> [Relu|Clip]... ->
// QuantizeLinear(per tensor). x stays quantized: the primitive reads the DequantizeLinear's
// input and writes the QuantizeLinear's output; W is laid out once (the constant cache).
//
// The arithmetic (ONNX's is in float; oneDNN's accumulates exactly in int32):
//   y_q = saturate(round_half_even(post_ops(os[c] * (acc + bias[c]))) + zy)
//   acc = sum (x_q - zx) * w_q,  os[c] = sx * sw[c] / sy,  bias[c] = B[c] * sb[c] / (sx * sw[c])
// with Relu as relu and Clip(lo, hi) as clip(lo / sy, hi / sy). Where ONNX's float sum lands
// within a rounding error of an x.5 the two may round apart: one quantization step at most.
//
// A residual Add of two such values, DequantizeLinear(a) + DequantizeLinear(b) -> [Relu|Clip]
// -> QuantizeLinear, is one too: an int8 binary primitive, scales sa/sy and sb/sy on its
// operands, the zero points (zy with them) one eltwise_linear shift, the epilogue as clips moved
// by zy (second_dq and second say b; weights are unused).
struct QuantizedStep {
  std::size_t head = 0, src_dq = 0, weights_dq = 0, second_dq = 0, quantize = 0;
  std::optional<std::size_t> bias_dq;  // DequantizeLinear of an INT32 constant
  const float* float_bias = nullptr;   // or a FP32 constant bias
  std::vector<std::size_t> epilogue;   // Relu/Clip layers, in order
  // false: no QuantizeLinear follows (a float layer reads the result); the step writes FP32, and
  // `quantize` names its last layer (MatchEpilogue).
  bool quantized_output = true;
  QuantParams src, weights, bias, second, dst;
};

class Compiler;

// One row per op CpuAcc runs: its support check (op_support.cpp) and its lowering onto oneDNN (a
// Compiler member that returns the next layer). IsSupported (CheckOp) and the lowering both look
// the op up here, so they cannot disagree on what CpuAcc runs: adding an op is adding its row.
struct OpRow {
  std::string_view op_type;
  Status (*check)(const OperatorDesc& op);
  std::size_t (Compiler::*lower)(std::size_t layer);
};

// The row of `op_type`, or null.
const OpRow* FindOpRow(std::string_view op_type);

class Compiler {
 public:
  Compiler(const SubgraphDesc& graph, const dnnl::engine& engine, ConstantCache& constants,
           int threads, CompileOptions options)
      : g_(graph),
        layers_(graph.layers),
        layer_inputs_(graph.layer_inputs),
        engine_(engine),
        constants_(constants),
        stream_(engine),
        program_(std::make_shared<Program>(engine, threads)),
        threads_(threads),
        options_(options) {}

  Result<CompileResult> Run() {
    notes_.assign(layers_.size(), "");
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      for (std::size_t k = 0; k < layer_inputs_[i].size(); ++k) {
        if (!IsConstant(layers_[i], k) && !layer_inputs_[i][k].empty()) {
          ++uses_[layer_inputs_[i][k]];
          last_use_[layer_inputs_[i][k]] = i;
        }
      }
    }
    for (std::size_t i = 0; i < g_.outputs.size(); ++i)
      output_index_[g_.outputs[i]] = i;
    std::vector<TensorInfo> input_infos, output_infos;
    for (std::size_t i = 0; i < g_.inputs.size(); ++i) {
      const Shape& shape = g_.input_infos[i].shape;
      input_infos.push_back(g_.input_infos[i]);
      types_[g_.inputs[i]] = DnnlType(g_.input_infos[i].type);
      shapes_[g_.inputs[i]] = shape;
      reps_[g_.inputs[i]].push_back(
          program_->AddValue(LogicalMd(g_.inputs[i]), {ValueStorage::Kind::kInput, i}));
    }
    for (const auto& info : g_.output_infos)
      output_infos.push_back(info);
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      for (std::size_t k = 0; k < layers_[i].outputs.size(); ++k) {
        producer_[g_.layer_outputs[i][k]] = i;
        types_[g_.layer_outputs[i][k]] = DnnlType(layers_[i].outputs[k].type);
      }
      for (std::size_t k = 0; k < layer_inputs_[i].size(); ++k) {
        if (!IsConstant(layers_[i], k) && !layer_inputs_[i][k].empty())
          consumers_[layer_inputs_[i][k]].push_back(i);
      }
    }
    lowered_.assign(layers_.size(), false);
    if (options_.fuse) {
      for (std::size_t i = 0; i < layers_.size(); ++i) {
        if (auto step = MatchQuantizedStep(i))
          quantized_steps_.emplace(i, std::move(*step));
      }
    }
    for (std::size_t i = 0; i < layers_.size();) {
      const OperatorDesc& op = layers_[i];
      for (std::size_t k = 0; k < op.outputs.size(); ++k)
        shapes_[g_.layer_outputs[i][k]] = op.outputs[k].shape;
      if (lowered_[i]) {  // fused into an int8 step lowered earlier
        ++i;
        continue;
      }
      std::size_t next = i + 1;
      try {
        // Primitives are created with the team size they run with (ProgramStep::threads).
        step_threads_ = StepThreads(op, quantized_steps_.contains(i));
        ScopedOmpThreads scoped(step_threads_);
        next = Lower(i);
      } catch (const dnnl::error& error) {
        return Unimplemented("CpuAcc: " + NodeLabel(op) + ": oneDNN has no primitive for it (" +
                             error.what() + ")");
      } catch (const CompileError& error) {
        return error.status;
      }
      i = next;
    }
    try {
      for (std::size_t i = 0; i < g_.outputs.size(); ++i) {
        OperatorDesc reorder;
        reorder.outputs.push_back(g_.output_infos[i]);
        step_threads_ = StepThreads(reorder);
        ScopedOmpThreads scoped(step_threads_);
        WriteOutput(i);
      }
      program_->SetBoundary(std::move(input_infos), std::move(output_infos));
      program_->Finish();
    } catch (const dnnl::error& error) {
      return Internal(std::string("CpuAcc: oneDNN failed at the run's boundary: ") + error.what());
    } catch (const CompileError& error) {
      return error.status;
    }
    return CompileResult{program_, std::move(notes_)};
  }

 private:
  // ---- values -------------------------------------------------------------------------------

  const Shape& ShapeOf(const std::string& name) {
    auto it = shapes_.find(name);
    if (it == shapes_.end())
      throw CompileError{Internal("CpuAcc: value '" + name + "' is used before it is produced")};
    return it->second;
  }

  const std::vector<int>& Reps(const std::string& name) {
    auto it = reps_.find(name);
    if (it == reps_.end() || it->second.empty())
      throw CompileError{Internal("CpuAcc: value '" + name + "' is used before it is produced")};
    return it->second;
  }

  // A value over the same bytes as `value`, with another plain md (a view).
  int View(int value, const Md& md) {
    const ProgramValue& base = program_->value(value);
    if (base.md == md)
      return value;
    if (base.storage.kind == ValueStorage::Kind::kConstant) {
      return program_->AddConstant(
          memory(md, engine_, const_cast<void*>(base.constant.get_data_handle())));
    }
    return program_->AddValue(md, base.storage);
  }

  // The value `name` in layout `wanted`, reordered from its current layout when needed.
  int Get(const std::string& name, const Md& wanted) {
    const auto& reps = Reps(name);
    for (int rep : reps) {
      if (program_->value(rep).md == wanted)
        return rep;
    }
    const int from = reps.front();
    const int to = program_->AddTemporary(wanted);
    Reorder(from, to);
    reps_[name].push_back(to);
    return to;
  }

  int GetPlain(const std::string& name) { return Get(name, LogicalMd(name)); }

  memory::data_type TypeOf(const std::string& name) const {
    auto it = types_.find(name);
    return it == types_.end() ? memory::data_type::f32 : it->second;
  }

  // `name` dense row-major, of its own type.
  Md LogicalMd(const std::string& name) { return PlainMd(ShapeOf(name), TypeOf(name)); }

  void Reorder(int from, int to) {
    const Md& src = program_->value(from).md;
    const Md& dst = program_->value(to).md;
    if (src == dst && IsPlain(src)) {
      program_->AddCopy(from, to);
      return;
    }
    dnnl::reorder::primitive_desc pd(engine_, src, engine_, dst, UserScratchpad());
    AddStep(dnnl::reorder(pd), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}}, pd.scratchpad_desc());
  }

  // Where a layer writes `name`, laid out as `md` (whose dims may differ from the ONNX shape only
  // when md is plain: the same bytes). A boundary output in plain layout is written in place.
  int Define(const std::string& name, const Md& md) {
    const Md logical = LogicalMd(name);
    int value;
    auto out = output_index_.find(name);
    if (out != output_index_.end() && IsPlain(md) && md.get_size() == logical.get_size()) {
      value = program_->AddValue(md, {ValueStorage::Kind::kOutput, out->second});
    } else {
      if (md.dims() != logical.dims() && !IsPlain(md))
        throw CompileError{Internal("CpuAcc: blocked layout with other dims for '" + name + "'")};
      value = program_->AddTemporary(md);
    }
    reps_[name].push_back(md.dims() == logical.dims() ? value : View(value, logical));
    return value;
  }

  // A layer's constant input as a plain value over the network's data (no copy).
  int ConstantValue(const OperatorDesc& op, std::size_t index, const Md& md) {
    return program_->AddConstant(memory(md, engine_, const_cast<void*>(op.constant_inputs[index])));
  }

  // Owned constant memory, filled from `values` laid out as plain `md`, then reordered into
  // `wanted` (e.g. oneDNN's blocked weights) once, now. For small values computed here (a folded
  // bias); weights go through NetworkConstant or DerivedConstant.
  int OwnedConstant(const float* values, const Md& md, const Md& wanted) {
    return program_->AddConstant(LaidOut(values, md, wanted));
  }

  // The network's own constant `values` (laid out as plain `md`) in layout `wanted`, shared with
  // every other program of this backend instance that wants them so (constant_cache.hpp).
  int NetworkConstant(const float* values, const Md& md, const Md& wanted) {
    return program_->AddSharedConstant(
        constants_.Get({{values}, ""}, md, wanted, [&] { return LaidOut(values, md, wanted); }));
  }

  // A constant computed by `compute` (plain `md`) from the network's constants as `origin` says,
  // in layout `wanted`, shared like NetworkConstant's: computed only when no program has it.
  int DerivedConstant(const ConstantOrigin& origin, const Md& md, const Md& wanted,
                      const std::function<std::vector<float>()>& compute) {
    return program_->AddSharedConstant(constants_.Get(origin, md, wanted, [&] {
      const std::vector<float> values = compute();
      return LaidOut(values.data(), md, wanted);
    }));
  }

  // New memory in layout `wanted` holding `values` (plain `md`): a copy, or a reorder.
  memory LaidOut(const void* values, const Md& md, const Md& wanted) {
    memory target(wanted, engine_);
    if (md == wanted) {
      std::memcpy(target.get_data_handle(), values, md.get_size());
      return target;
    }
    memory source(md, engine_, const_cast<void*>(values));
    dnnl::reorder(source, target).execute(stream_, source, target);
    stream_.wait();
    return target;
  }

  // Input `index` of layer `i`: its value name ("" when omitted).
  const std::string& InputName(std::size_t i, std::size_t index) { return layer_inputs_[i][index]; }
  const std::string& OutputName(std::size_t i) { return g_.layer_outputs[i][0]; }

  // Input `index` of layer i as it is now (any layout): a constant is plain.
  int Current(std::size_t i, std::size_t index) {
    const OperatorDesc& op = layers_[i];
    if (IsConstant(op, index))
      return ConstantValue(op, index, PlainMd(op.inputs[index].shape));
    return Reps(InputName(i, index)).front();
  }

  // Input `index` of layer i in layout `md`.
  int InputAs(std::size_t i, std::size_t index, const Md& md) {
    const OperatorDesc& op = layers_[i];
    if (IsConstant(op, index)) {
      return NetworkConstant(static_cast<const float*>(op.constant_inputs[index]),
                             PlainMd(op.inputs[index].shape), md);
    }
    return Get(InputName(i, index), md);
  }

  int InputPlain(std::size_t i, std::size_t index) {
    const OperatorDesc& op = layers_[i];
    if (IsConstant(op, index))
      return ConstantValue(op, index, PlainMd(op.inputs[index].shape));
    return GetPlain(InputName(i, index));
  }

  // The layer after `i` when it only consumes `value`, which nothing else reads (fusable).
  std::optional<std::size_t> SoleConsumer(std::size_t i, const std::string& value) {
    if (!options_.fuse || i + 1 >= layers_.size() || output_index_.contains(value))
      return std::nullopt;
    auto uses = uses_.find(value);
    if (uses == uses_.end() || uses->second != 1)
      return std::nullopt;
    const auto& inputs = layer_inputs_[i + 1];
    if (std::find(inputs.begin(), inputs.end(), value) == inputs.end())
      return std::nullopt;
    return i + 1;
  }

  void WriteOutput(std::size_t index) {
    const std::string& name = g_.outputs[index];
    for (int rep : Reps(name)) {
      const ValueStorage& storage = program_->value(rep).storage;
      if (storage.kind == ValueStorage::Kind::kOutput && storage.index == index)
        return;
    }
    const Md logical = PlainMd(g_.output_infos[index].shape, DnnlType(g_.output_infos[index].type));
    const int to = program_->AddValue(logical, {ValueStorage::Kind::kOutput, index});
    // Prefer a plain representation (a copy) over a reorder.
    int from = Reps(name).front();
    for (int rep : Reps(name)) {
      if (program_->value(rep).md == logical)
        from = rep;
    }
    Reorder(from, to);
  }

  // `given`: a oneDNN implementation's name, or (own_kernel) what CpuAcc runs itself.
  void Note(std::size_t first, std::size_t last, const std::string& given,
            bool own_kernel = false) {
    // The two-thread policy made visible in placement (and checked by the tests through it).
    std::string impl = (own_kernel ? "" : "oneDNN ") + given;
    if (threads_ > 1 && own_kernel) {
      impl += " on 1 thread";
    } else if (threads_ > 1) {
      impl += step_threads_ > 1 ? " on " + std::to_string(step_threads_) + " threads"
                                : " on 1 thread (too little work for more)";
    }
    if (first == last) {
      notes_[first] = impl;
      return;
    }
    std::string chain;
    for (std::size_t k = first; k <= last; ++k)
      chain += (k == first ? "" : "+") + layers_[k].op_type;
    notes_[first] = impl + ", fused " + chain;
    for (std::size_t k = first + 1; k <= last; ++k)
      notes_[k] = "fused into " + layers_[first].name + " (" + chain + ")";
  }

  void AddStep(dnnl::primitive primitive, std::vector<std::pair<int, int>> args,
               const Md& scratchpad) {
    program_->AddPrimitive(std::move(primitive), std::move(args), scratchpad, step_threads_);
  }

  // The two-thread policy: the program's thread count for a layer with enough work, else 1, so
  // that intra_op_threads > 1 never makes a small layer slower than one thread would.
  //
  // An int8 step's FLOPs count a quarter: its multiply-adds go four times as many to an
  // instruction as FP32's (VNNI's vpdpbusd: 64 u8 x s8 products a 512-bit register, FMA 16), so
  // the same product is less work to split, and the thresholds are FP32's.
  int StepThreads(const OperatorDesc& op, bool int8 = false) const {
    if (threads_ == 1)
      return 1;
    const double flops_weight = int8 ? 0.25 : 1.0;
    double elements = 0;
    for (const auto& output : op.outputs)
      elements = std::max(elements, static_cast<double>(ElementCount(output.shape)));
    if (op.op_type == "Conv" && op.inputs.size() >= 2) {
      const Shape& w = op.inputs[1].shape;
      const double per_output = static_cast<double>(ElementCount(w) / std::max<int64_t>(w[0], 1));
      return flops_weight * 2.0 * elements * per_output >= kParallelMinConvFlops ? threads_ : 1;
    }
    if ((op.op_type == "Gemm" || op.op_type == "MatMul") && op.inputs.size() >= 2) {
      const Shape& a = op.inputs[0].shape;
      const bool ta = op.op_type == "Gemm" && IntAttr(op, "transA", 0) != 0;
      const double k = a.empty() ? 1.0 : static_cast<double>(ta ? a.front() : a.back());
      return flops_weight * 2.0 * elements * k >= kParallelMinMatMulFlops ? threads_ : 1;
    }
    return elements >= kParallelMinElements ? threads_ : 1;
  }

  // Whether the bytes of `rep` may be overwritten by the fused layers head..last (a convolution
  // accumulating into them with a sum post-op, for the Add at `last`): a workspace temporary
  // that no value read after `last`, by the layers before `last` (the convolution's own input),
  // or a boundary output shares. Trap: views (Reshape, Identity) give other names the same
  // bytes, so every name is checked.
  bool CanOverwrite(int rep, std::size_t head, std::size_t last) const {
    const ValueStorage& storage = program_->value(rep).storage;
    if (storage.kind != ValueStorage::Kind::kTemporary)
      return false;
    for (const auto& [other, others_reps] : reps_) {
      const bool shares = std::any_of(others_reps.begin(), others_reps.end(), [&](int r) {
        const ValueStorage& s = program_->value(r).storage;
        return s.kind == storage.kind && s.index == storage.index;
      });
      if (!shares)
        continue;
      auto use = last_use_.find(other);
      if (output_index_.contains(other) || (use != last_use_.end() && use->second > last))
        return false;
      for (std::size_t k = head; k < last; ++k) {
        const auto& inputs = layer_inputs_[k];
        if (std::find(inputs.begin(), inputs.end(), other) != inputs.end())
          return false;
      }
    }
    return true;
  }

  // ---- lowering -----------------------------------------------------------------------------

  // Lowers layer i (and the layers fused into it) by its op's row; returns the next layer.
  std::size_t Lower(std::size_t i) {
    const OperatorDesc& op = layers_[i];
    const OpRow* row = FindOpRow(op.op_type);
    if (row == nullptr)
      throw CompileError{Unimplemented("CpuAcc does not implement op " + op.op_type)};
    return (this->*row->lower)(i);
  }

  // Identity, Flatten, Reshape: the same bytes under the output's dims, a view, no work.
  // Identity and Dropout (inference) keep every layout the input has, blocked ones included.
  std::size_t LowerView(std::size_t i) {
    const std::string& output = OutputName(i);
    if (!IsConstant(layers_[i], 0) && ShapeOf(InputName(i, 0)) == ShapeOf(output)) {
      reps_[output] = Reps(InputName(i, 0));
      notes_[i] = "the same bytes as its input inside the compiled run (no copy)";
      return i + 1;
    }
    const int input = InputPlain(i, 0);
    reps_[OutputName(i)].push_back(View(input, LogicalMd(OutputName(i))));
    notes_[i] = "a view of its input inside the compiled run (no copy)";
    return i + 1;
  }

  // Activations (and, with `bias`, constant Adds shaped like the bias; with `residual`, one Add
  // of another value of the output's shape, as a sum post-op) after layer `i`: appended to
  // `post_ops` / folded into `bias`. `bias_shape` says whether an Add's constant fits the bias of
  // the run's head layer, and as which shape. Returns the last fused layer; `*residual` names
  // the value the sum post-op adds (its bytes must be in the destination before the primitive
  // runs: LowerConv sees to it).
  using BiasShapeFn = std::optional<Shape> (Compiler::*)(const Shape&, std::size_t);
  std::size_t FuseEpilogue(std::size_t i, Bias* bias, BiasShapeFn bias_shape,
                           dnnl::post_ops* post_ops, std::size_t head,
                           std::optional<std::string>* residual = nullptr) {
    std::size_t last = i;
    bool activated = false;
    while (auto next = SoleConsumer(last, OutputName(last))) {
      const OperatorDesc& op = layers_[*next];
      const std::vector<Eltwise> eltwise = EltwiseSteps(op);
      const std::size_t other =
          op.inputs.size() == 2 && InputName(*next, 0) == OutputName(last) ? 1 : 0;
      if (!eltwise.empty()) {
        for (const Eltwise& function : eltwise)
          post_ops->append_eltwise(1.0f, function.kind, function.alpha, function.beta);
        activated = true;
      } else if (op.op_type == "Add" && residual != nullptr && !residual->has_value() &&
                 !activated && !IsConstant(op, other) &&
                 op.inputs[other].shape == layers_[head].outputs[0].shape &&
                 op.outputs[0].shape == layers_[head].outputs[0].shape) {
        // The residual Add of a ResNet/MobileNet block. Only before any activation: oneDNN's
        // sum then activation is the chain its convolutions implement everywhere.
        post_ops->append_sum(1.0f);
        *residual = InputName(*next, other);
      } else if (op.op_type == "Add" && !activated && bias != nullptr) {
        if (!IsConstant(op, other) || op.outputs[0].shape != layers_[head].outputs[0].shape)
          break;
        const auto shape = (this->*bias_shape)(op.inputs[other].shape, head);
        if (!shape)
          break;
        bias->Add(static_cast<const float*>(op.constant_inputs[other]), *shape, 1.0f);
      } else {
        break;
      }
      shapes_[OutputName(*next)] = op.outputs[0].shape;
      last = *next;
    }
    return last;
  }

  // Conv: a constant broadcasting along the channel axis only, as [maps] (or [1]: a scalar).
  std::optional<Shape> ConvBiasShape(const Shape& shape, std::size_t head) {
    const Shape& out = layers_[head].outputs[0].shape;
    if (shape.size() > out.size())
      return std::nullopt;
    const Shape padded = PadTo(shape, out.size());
    for (std::size_t d = 0; d < padded.size(); ++d) {
      if (padded[d] != 1 && !(d == 1 && padded[d] == out[1]))
        return std::nullopt;
    }
    return Shape{ElementCount(shape)};
  }

  // MatMul/Gemm: a constant broadcasting along the last axis only, as [N] (or [1]).
  std::optional<Shape> MatMulBiasShape(const Shape& shape, std::size_t head) {
    const Shape& out = layers_[head].outputs[0].shape;
    if (shape.size() > out.size() || out.empty())
      return std::nullopt;
    const Shape padded = PadTo(shape, out.size());
    for (std::size_t d = 0; d + 1 < padded.size(); ++d) {
      if (padded[d] != 1)
        return std::nullopt;
    }
    if (padded.back() != 1 && padded.back() != out.back())
      return std::nullopt;
    return Shape{ElementCount(shape)};
  }

  // oneDNN's first implementation is not always its fastest: on AVX-512 LeNet's convolutions ran
  // faster on jit:avx512_core (blocked layouts) than on brgconv, oneDNN's first choice.
  // Convolutions of at least this many FLOPs try each implementation once at compile time and keep
  // the fastest. Small ones too, since LeNet's small second convolution gained as well; what it
  // costs is compile time (a program is ready later after the first request, off the request
  // path). The numbers are in docs/performance.md (bench/ort_compare.sh).
  static constexpr double kTuneFlops = 1e5;
  static constexpr double kTuneMatMulFlops = 4e6;  // FasterWeightsLayout
  // Candidates are timed at the largest batch (up to the run's) whose convolution is within this
  // many FLOPs: the full batch where it is affordable, since the batch can change the winner (a
  // residual block's 3x3 convolution on AVX-512: jit:avx512_core won at batch 1 and brgconv at
  // batch 2, by enough to change the whole block's time; docs/performance.md has the numbers).
  static constexpr double kTuneProxyFlops = 32e6;

  // The fastest implementation over `descs` (the same convolution with other layouts), chosen by
  // timing `proxies` (the same descs at a smaller batch, or `descs` itself): each non-reference
  // implementation is timed on zeros, best of 3. A later desc wins a near tie
  // (within 3%): the caller puts channels-last after format any, because the pools and
  // activations that follow run faster on nhwc than on 16-channel blocks when the channels do not
  // fill the blocks (LeNet's first max pool, 6 channels, ran faster on nhwc).
  //
  // Why not always the full batch: timing at it once made a LeNet's first request at batch 64
  // cost more than a second (some candidates are slow there, and each runs 4 times). The winner is
  // then created at the full shape by its implementation name; if the full shape does not offer
  // that implementation, its first non-reference one (oneDNN's own first choice).
  //
  // `src_now`: the input's layout as it is (at the proxies' batch), when known. A candidate that
  // wants another layout is charged the reorder into it: timed alone, a blocked kernel beat a
  // channels-last one at SqueezeNet-like b4 by a few microseconds and then cost two reorders a
  // layer around it (reorders were a sixth of the request).
  dnnl::convolution_forward::primitive_desc FastestConv(
      const std::vector<dnnl::convolution_forward::desc>& descs,
      const std::vector<dnnl::convolution_forward::desc>& proxies, const dnnl::primitive_attr& attr,
      const std::optional<Md>& src_now) {
    std::size_t best_desc = 0;
    std::string best_impl;
    double best_time = 1e300;
    std::vector<std::pair<Md, double>> reorder_times;  // per wanted layout
    auto reorder_time = [&](const Md& wanted) {
      if (!src_now || wanted == *src_now)
        return 0.0;
      for (const auto& [md, time] : reorder_times) {
        if (md == wanted)
          return time;
      }
      double time = 0.0;  // no reorder between these layouts: the candidate competes on its own
      try {
        dnnl::reorder::primitive_desc pd(engine_, *src_now, engine_, wanted);
        memory from(*src_now, engine_), to(wanted, engine_);
        std::memset(from.get_data_handle(), 0, src_now->get_size());
        dnnl::reorder primitive(pd);
        time = TimeBestOf3([&] {
          primitive.execute(stream_, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
        });
      } catch (const dnnl::error&) {
      }
      reorder_times.emplace_back(wanted, time);
      return time;
    };
    for (std::size_t d = 0; d < proxies.size(); ++d) {
      dnnl::convolution_forward::primitive_desc candidate;
      try {
        candidate = dnnl::convolution_forward::primitive_desc(proxies[d], attr, engine_);
      } catch (const dnnl::error&) {
        continue;  // no implementation for these layouts
      }
      do {
        const std::string impl = ImplName(candidate);
        if (impl.find("ref") == std::string::npos) {
          const double time = TimeConv(candidate) + reorder_time(candidate.src_desc());
          if (d > best_desc ? time <= best_time * 1.03 : time < best_time) {
            best_time = time;
            best_desc = d;
            best_impl = impl;
          }
        }
      } while (candidate.next_impl());
    }
    dnnl::convolution_forward::primitive_desc chosen;
    try {
      chosen = dnnl::convolution_forward::primitive_desc(descs[best_desc], attr, engine_);
    } catch (const dnnl::error&) {
      best_desc = 0;  // the proxy had an implementation the full shape lacks: format any
      chosen = dnnl::convolution_forward::primitive_desc(descs[0], attr, engine_);
    }
    // Walk to the winner; remember the first non-reference one on the way as the fallback.
    int first_fast = -1, index = 0, winner = -1;
    do {
      const std::string impl = ImplName(chosen);
      if (first_fast < 0 && impl.find("ref") == std::string::npos)
        first_fast = index;
      if (impl == best_impl) {
        winner = index;
        break;
      }
      ++index;
    } while (chosen.next_impl());
    const int wanted = winner >= 0 ? winner : std::max(first_fast, 0);
    if (wanted == index)
      return chosen;  // stopped on it
    dnnl::convolution_forward::primitive_desc again(descs[best_desc], attr, engine_);
    for (int k = 0; k < wanted; ++k)
      again.next_impl();
    return again;
  }

  double TimeConv(const dnnl::convolution_forward::primitive_desc& pd) {
    return TimePrimitive(dnnl::convolution_forward(pd), pd);
  }

  // Seconds of one execution of `primitive` on zeros (best of 3): source, weights, bias when it
  // has one, destination and scratchpad, as `pd` lays them out, and `extra` (zero points). Only
  // for primitives with no other arguments (no binary post-ops).
  double TimePrimitive(const dnnl::primitive& primitive, const dnnl::primitive_desc_base& pd,
                       const std::unordered_map<int, memory>& extra = {}) {
    std::unordered_map<int, memory> args = extra;
    auto zeros = [&](int arg, const Md& md) {
      if (md.get_size() == 0)
        return;
      memory m(md, engine_);
      // A sum post-op reads the destination: zeros, not whatever the allocation held.
      std::memset(m.get_data_handle(), 0, md.get_size());
      args[arg] = m;
    };
    zeros(DNNL_ARG_SRC, pd.src_desc());
    zeros(DNNL_ARG_WEIGHTS, pd.weights_desc());
    zeros(DNNL_ARG_BIAS, pd.weights_desc(1));
    zeros(DNNL_ARG_DST, pd.dst_desc());
    zeros(DNNL_ARG_SCRATCHPAD, pd.scratchpad_desc());
    return TimeBestOf3([&] { primitive.execute(stream_, args); });
  }

  // Seconds of one `run` on the stream: a warm-up, then the best of 3.
  template <typename Run>
  double TimeBestOf3(Run run) {
    run();
    stream_.wait();
    double time = 1e300;
    for (int k = 0; k < 3; ++k) {
      const auto start = std::chrono::steady_clock::now();
      run();
      stream_.wait();
      time = std::min(
          time, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return time;
  }

  std::size_t LowerConv(std::size_t i) {
    if (auto step = quantized_steps_.find(i); step != quantized_steps_.end())
      return LowerQuantizedConv(step->second);
    const OperatorDesc& op = layers_[i];
    const Shape& x = op.inputs[0].shape;
    const Shape& w = op.inputs[1].shape;
    const ConvGeometry geometry = ConvGeometryOf(op);
    const Shape& expected = geometry.output;
    const int64_t maps = geometry.maps;
    const memory::dims& w_dims = geometry.weights;

    const bool w_constant = IsConstant(op, 1);
    const bool has_b = HasInput(op, 2);
    const bool b_constant = has_b && IsConstant(op, 2);
    Bias bias;
    if (b_constant)
      bias.Add(static_cast<const float*>(op.constant_inputs[2]), {maps}, 1.0f);
    std::vector<float> scale;      // per output map, from a folded BatchNormalization
    ConstantOrigin scaled_origin;  // of the weights times `scale`

    // Fusion: BatchNormalization into the weights, then constant Adds into the bias, then
    // activations as post-ops. A non-constant bias input only takes activations.
    std::size_t last = i;
    if (!has_b || b_constant) {
      if (auto next = SoleConsumer(i, OutputName(i)); next && w_constant) {
        const OperatorDesc& bn = layers_[*next];
        if (bn.op_type == "BatchNormalization" && InputName(*next, 0) == OutputName(i) &&
            IsConstant(bn, 1) && IsConstant(bn, 2) && IsConstant(bn, 3) && IsConstant(bn, 4)) {
          const float epsilon = FloatAttr(bn, "epsilon", 1e-5f);
          const auto* gamma = static_cast<const float*>(bn.constant_inputs[1]);
          const auto* beta = static_cast<const float*>(bn.constant_inputs[2]);
          const auto* mean = static_cast<const float*>(bn.constant_inputs[3]);
          const auto* var = static_cast<const float*>(bn.constant_inputs[4]);
          // y = (conv + b - mean) * s + beta, s = gamma / sqrt(var + eps): weights * s,
          // bias' = (b - mean) * s + beta.
          std::vector<float> shift(maps);
          scale.resize(maps);
          for (int64_t m = 0; m < maps; ++m) {
            const double s = gamma[m] / std::sqrt(static_cast<double>(var[m]) + epsilon);
            scale[m] = static_cast<float>(s);
            const double b = bias.present ? bias.values[m] : 0.0;
            shift[m] = static_cast<float>((b - mean[m]) * s + beta[m]);
          }
          // The scale reads gamma, var and epsilon; the weights' key names all three.
          scaled_origin = {{op.constant_inputs[1], gamma, var},
                           "x gamma/sqrt(var+eps), eps " + HexFloat(epsilon)};
          bias = Bias{};
          bias.Add(shift.data(), {maps}, 1.0f);
          shapes_[OutputName(*next)] = bn.outputs[0].shape;
          last = *next;
        }
      }
    }
    dnnl::post_ops post_ops;
    std::optional<std::string> residual;
    last = FuseEpilogue(last, (!has_b || b_constant) ? &bias : nullptr, &Compiler::ConvBiasShape,
                        &post_ops, i, &residual);

    // Descriptors: oneDNN picks the layouts of src, weights and dst (format any).
    const Md src_any(Dims(x), memory::data_type::f32, memory::format_tag::any);
    const Md w_any(w_dims, memory::data_type::f32, memory::format_tag::any);
    const Md dst_any(Dims(expected), memory::data_type::f32, memory::format_tag::any);
    const bool with_bias = bias.present || has_b;
    const Md bias_md({maps}, memory::data_type::f32, memory::format_tag::a);
    dnnl::primitive_attr attr = UserScratchpad();
    attr.set_post_ops(post_ops);
    auto conv_desc = [&](const Md& src, const Md& dst) {
      return geometry.Desc(src, w_any, with_bias ? &bias_md : nullptr, dst);
    };
    auto desc = conv_desc(src_any, dst_any);
    if (residual) {
      // With a residual sum the destination takes the other branch's layout when it is blocked
      // (it is, after a convolution) and a non-reference kernel writes it: no reorder of the
      // branch into the destination. Else oneDNN's choice, and the branch is reordered.
      const Md branch = program_->value(Reps(*residual).front()).md;
      if (!IsPlain(branch)) {
        try {
          auto candidate = conv_desc(src_any, branch);
          dnnl::convolution_forward::primitive_desc probe(candidate, attr, engine_);
          if (ImplName(probe).find("ref") == std::string::npos)
            desc = candidate;
        } catch (const dnnl::error&) {
          // no implementation writes that layout: format any
        }
      }
    }
    dnnl::convolution_forward::primitive_desc pd(desc, attr, engine_);
    const double flops = 2.0 * static_cast<double>(ElementCount(expected)) *
                         static_cast<double>(ElementCount(w) / maps);
    if (options_.tune && flops >= kTuneFlops) {
      // The same candidates at `batch`. A residual's branch layout is for the full batch: its
      // proxy is format any (the implementation is matched by name on the real desc).
      auto candidates = [&](int64_t batch) {
        Shape src = x, dst = expected;
        src[0] = dst[0] = batch;
        std::vector<dnnl::convolution_forward::desc> descs{
            batch == x[0]
                ? desc
                : conv_desc(Md(Dims(src), memory::data_type::f32, memory::format_tag::any),
                            Md(Dims(dst), memory::data_type::f32, memory::format_tag::any))};
        if (x.size() == 4 && maps % 16 != 0) {
          descs.push_back(
              conv_desc(Md(Dims(src), memory::data_type::f32, memory::format_tag::nhwc),
                        Md(Dims(dst), memory::data_type::f32, memory::format_tag::nhwc)));
        }
        return descs;
      };
      const auto descs = candidates(x[0]);
      const Md src_now = program_->value(Current(i, 0)).md;
      const int64_t proxy_batch = std::clamp<int64_t>(
          static_cast<int64_t>(kTuneProxyFlops / (flops / static_cast<double>(x[0]))), 1, x[0]);
      pd = proxy_batch == x[0]
               ? FastestConv(descs, descs, attr, src_now)
               : FastestConv(descs, candidates(proxy_batch), attr, WithBatch(src_now, proxy_batch));
    }

    // Weights: constant ones (scaled by a folded BatchNormalization) reordered now.
    int weights;
    if (w_constant) {
      const auto* data = static_cast<const float*>(op.constant_inputs[1]);
      if (scale.empty()) {
        weights = NetworkConstant(data, PlainMd(w_dims), pd.weights_desc());
      } else {
        weights = DerivedConstant(scaled_origin, PlainMd(w_dims), pd.weights_desc(), [&] {
          std::vector<float> scaled(data, data + ElementCount(w));
          const int64_t per_map = ElementCount(w) / maps;
          for (int64_t m = 0; m < maps; ++m) {
            for (int64_t k = 0; k < per_map; ++k)
              scaled[m * per_map + k] *= scale[m];
          }
          return scaled;
        });
      }
    } else {
      const int plain = View(InputPlain(i, 1), PlainMd(w_dims));
      if (program_->value(plain).md == pd.weights_desc()) {
        weights = plain;
      } else {
        weights = program_->AddTemporary(pd.weights_desc());
        Reorder(plain, weights);
      }
    }
    std::vector<std::pair<int, int>> args{{DNNL_ARG_WEIGHTS, weights}};
    if (bias.present) {
      if (bias.shape != Shape{maps}) {  // a scalar so far: broadcast it to every map
        Bias full;
        const std::vector<float> zeros(maps, 0.0f);
        full.Add(zeros.data(), {maps}, 1.0f);
        full.Add(bias.values.data(), bias.shape, 1.0f);
        bias = std::move(full);
      }
      args.push_back(
          {DNNL_ARG_BIAS, OwnedConstant(bias.values.data(), PlainMd(Shape{maps}), bias_md)});
    } else if (has_b) {
      args.push_back({DNNL_ARG_BIAS, InputPlain(i, 2)});
    }
    args.push_back({DNNL_ARG_SRC, InputAs(i, 0, pd.src_desc())});
    args.push_back({DNNL_ARG_DST, residual ? ResidualDestination(*residual, i, last, pd.dst_desc())
                                           : Define(OutputName(last), pd.dst_desc())});
    AddStep(dnnl::convolution_forward(pd), std::move(args), pd.scratchpad_desc());
    Note(i, last,
         ImplName(pd) + (residual ? ", residual '" + *residual + "' as a sum post-op" : ""));
    return last + 1;
  }

  // The destination of a convolution whose sum post-op adds value `branch`: oneDNN accumulates
  // into the destination's bytes, so they must hold `branch` when the primitive starts. The
  // branch's own bytes when it is in the layout `md` and nothing reads them afterwards
  // (CanOverwrite); else a new value that the branch is copied (or reordered) into first.
  int ResidualDestination(const std::string& branch, std::size_t head, std::size_t last,
                          const Md& md) {
    const std::string& output = OutputName(last);
    for (int rep : Reps(branch)) {
      if (program_->value(rep).md == md && CanOverwrite(rep, head, last)) {
        reps_[output].push_back(rep);
        return rep;
      }
    }
    int from = Reps(branch).front();
    for (int rep : Reps(branch)) {
      if (program_->value(rep).md == md)
        from = rep;
    }
    const int dst = Define(output, md);
    Reorder(from, dst);
    return dst;
  }

  // Weights [batch..., K, N] with K contiguous: N's stride is K, the batch dims row-major over
  // K*N (a transposed matrix per batch).
  static Md KContiguous(const memory::dims& dims) {
    const std::size_t rank = dims.size();
    memory::dims strides(rank);
    strides[rank - 2] = 1;
    strides[rank - 1] = dims[rank - 2];
    memory::dim outer = dims[rank - 2] * dims[rank - 1];
    for (std::size_t d = rank - 2; d-- > 0;) {
      strides[d] = outer;
      outer *= dims[d];
    }
    return Md(dims, memory::data_type::f32, strides);
  }

  // Constant weights of a matrix product are laid out once, so their layout is free to choose.
  // oneDNN's format any is not always its fastest: on AVX2 (oneDNN 2.6, gemm:jit, 1 thread)
  // weights transposed (K contiguous) beat the weights as they are ([K,N], N contiguous) for the
  // MLP's large products at batch 64, and lost for the same product at batch 4 and for LeNet's
  // smaller one at batch 64 (the numbers are in docs/performance.md). No layout wins everywhere,
  // so a product of at least kTuneMatMulFlops times both layouts at its own shape, on zeros, and
  // keeps the faster (format any on a tie within 3%).
  dnnl::matmul::primitive_desc FasterWeightsLayout(const dnnl::matmul::primitive_desc& chosen,
                                                   const Md& a_md, const memory::dims& b_dims,
                                                   const std::optional<Md>& bias_md, const Md& y_md,
                                                   const dnnl::primitive_attr& attr) {
    const Md transposed = KContiguous(b_dims);
    if (transposed == chosen.weights_desc())
      return chosen;
    dnnl::matmul::primitive_desc candidate;
    try {
      candidate = dnnl::matmul::primitive_desc(
          bias_md ? dnnl::matmul::desc(a_md, transposed, *bias_md, y_md)
                  : dnnl::matmul::desc(a_md, transposed, y_md),
          attr, engine_);
    } catch (const dnnl::error&) {
      return chosen;  // no implementation for that layout
    }
    if (ImplName(candidate).find("ref") != std::string::npos)
      return chosen;
    const double as_chosen = TimePrimitive(dnnl::matmul(chosen), chosen);
    const double as_transposed = TimePrimitive(dnnl::matmul(candidate), candidate);
    return as_transposed * 1.03 < as_chosen ? candidate : chosen;
  }

  std::size_t LowerMatMul(std::size_t i) {
    if (auto step = quantized_steps_.find(i); step != quantized_steps_.end())
      return LowerQuantizedMatMul(step->second);
    const OperatorDesc& op = layers_[i];
    const bool gemm = op.op_type == "Gemm";
    const Shape& a = op.inputs[0].shape;
    const Shape& b = op.inputs[1].shape;
    const Shape& y = op.outputs[0].shape;

    // oneDNN dims: src [batch..., M, K], weights [batch..., K, N], dst [batch..., M, N], all of
    // one rank; a 1-D ONNX operand gets the dim it lacks (its bytes do not move).
    memory::dims a_dims, b_dims, y_dims, a_strides, b_strides;
    float alpha = 1.0f, beta = 1.0f;
    if (gemm) {
      alpha = FloatAttr(op, "alpha", 1.0f);
      beta = FloatAttr(op, "beta", 1.0f);
      const bool ta = IntAttr(op, "transA", 0) != 0, tb = IntAttr(op, "transB", 0) != 0;
      const int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1], n = tb ? b[0] : b[1];
      a_dims = {m, k};
      b_dims = {k, n};
      y_dims = {m, n};
      a_strides = ta ? memory::dims{1, m} : memory::dims{k, 1};
      b_strides = tb ? memory::dims{1, k} : memory::dims{n, 1};
    } else {
      const Shape a2 = a.size() == 1 ? Shape{1, a[0]} : a;
      const Shape b2 = b.size() == 1 ? Shape{b[0], 1} : b;
      const std::size_t rank = std::max(a2.size(), b2.size());
      const Shape ap = PadTo(a2, rank), bp = PadTo(b2, rank);
      a_dims = Dims(ap);
      b_dims = Dims(bp);
      y_dims = a_dims;
      for (std::size_t d = 0; d + 2 < rank; ++d)
        y_dims[d] = std::max(ap[d], bp[d]);
      y_dims[rank - 1] = bp[rank - 1];
      a_strides = RowMajorStrides(a_dims);
      b_strides = RowMajorStrides(b_dims);
    }
    // The broadcast batch can multiply past the bound that every described shape keeps.
    const Shape y_full(y_dims.begin(), y_dims.end());
    if (!BoundedDimProduct(y_full) || ElementCount(y) != ElementCount(y_full))
      throw CompileError{NodeInvalid(op, "output " + ToString(y) + " does not match the operands")};
    const std::size_t rank = y_dims.size();
    const int64_t n = y_dims[rank - 1];

    // alpha goes into constant weights, else into an eltwise_linear post-op (after the bias,
    // which is therefore divided by it).
    const bool b_constant = IsConstant(op, 1);
    const float post_scale = b_constant ? 1.0f : alpha;
    Bias bias;
    dnnl::post_ops post_ops;
    std::vector<std::pair<int, int>> args;
    const bool has_c = gemm && HasInput(op, 2) && beta != 0.0f;
    bool bias_closed = false;  // a post-op exists: later constants cannot join the bias
    if (has_c && IsConstant(op, 2)) {
      bias.Add(static_cast<const float*>(op.constant_inputs[2]), op.inputs[2].shape,
               beta / post_scale);
    }
    if (post_scale != 1.0f) {
      post_ops.append_eltwise(1.0f, algorithm::eltwise_linear, post_scale, 0.0f);
      bias_closed = true;
    }
    // A non-constant C: a binary post-op when beta is 1; else a binary primitive after the
    // matmul (src1 scaled by beta). Trap: oneDNN 2.6 mishandles two eltwise_linear post-ops
    // around a binary one (test_gemm_beta shows it: linear(2), add C, linear(0.5) gave wrong
    // values), so no beta post-op.
    const bool separate_c = has_c && !IsConstant(op, 2) && beta != 1.0f;
    const Shape c2 = has_c ? PadTo(op.inputs[2].shape, 2) : Shape{};
    if (has_c && !IsConstant(op, 2) && !separate_c) {
      const Md c_md = PlainMd(c2);
      const int index = post_ops.len();
      post_ops.append_binary(algorithm::binary_add, c_md);
      args.push_back(
          {DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1, View(InputPlain(i, 2), c_md)});
      bias_closed = true;
    }
    const bool b_is_column = !gemm && b.size() == 1;
    std::size_t last = separate_c ? i
                                  : FuseEpilogue(i, (bias_closed || b_is_column) ? nullptr : &bias,
                                                 &Compiler::MatMulBiasShape, &post_ops, i);

    const Md a_md(a_dims, memory::data_type::f32, a_strides);
    const Md b_plain(b_dims, memory::data_type::f32, b_strides);
    const Md b_md =
        b_constant ? Md(b_dims, memory::data_type::f32, memory::format_tag::any) : b_plain;
    const Md y_md = PlainMd(y_dims);
    std::optional<Md> bias_md;
    if (bias.present) {
      // The bias broadcasts over every dim but N ([1..., 1, N] or all ones).
      memory::dims dims(rank, 1);
      dims[rank - 1] = bias.shape.empty() ? 1 : bias.shape.back();
      if (ElementCount(bias.shape) != dims[rank - 1]) {
        // Gemm's C as [M,N] or [M,1]: a full 2-D bias.
        const Shape c2 = PadTo(bias.shape, 2);
        dims = Dims(c2);
      }
      bias_md = PlainMd(dims);
      (void)n;
    }
    dnnl::primitive_attr attr = UserScratchpad();
    attr.set_post_ops(post_ops);
    auto desc = bias_md ? dnnl::matmul::desc(a_md, b_md, *bias_md, y_md)
                        : dnnl::matmul::desc(a_md, b_md, y_md);
    dnnl::matmul::primitive_desc pd(desc, attr, engine_);
    const double flops =
        2.0 * static_cast<double>(ElementCount(y)) * static_cast<double>(a_dims[rank - 1]);
    if (options_.tune && b_constant && args.empty() && flops >= kTuneMatMulFlops)
      pd = FasterWeightsLayout(pd, a_md, b_dims, bias_md, y_md, attr);

    int weights;
    if (b_constant) {
      const auto* data = static_cast<const float*>(op.constant_inputs[1]);
      if (alpha != 1.0f) {
        weights = DerivedConstant({{data}, "x alpha " + HexFloat(alpha)}, b_plain,
                                  pd.weights_desc(), [&] {
                                    std::vector<float> scaled(data, data + ElementCount(b));
                                    for (float& v : scaled)
                                      v *= alpha;
                                    return scaled;
                                  });
      } else {
        weights = NetworkConstant(data, b_plain, pd.weights_desc());
      }
    } else {
      weights = View(InputPlain(i, 1), b_plain);
    }
    args.push_back({DNNL_ARG_SRC, View(InputPlain(i, 0), a_md)});
    args.push_back({DNNL_ARG_WEIGHTS, weights});
    if (bias_md)
      args.push_back({DNNL_ARG_BIAS, OwnedConstant(bias.values.data(), *bias_md, *bias_md)});
    if (!separate_c) {
      args.push_back({DNNL_ARG_DST, Define(OutputName(last), y_md)});
      AddStep(dnnl::matmul(pd), std::move(args), pd.scratchpad_desc());
      const bool k_contiguous = b_constant && pd.weights_desc() == KContiguous(b_dims);
      Note(i, last, ImplName(pd) + (k_contiguous ? " with weights K-contiguous" : ""));
      return last + 1;
    }
    const int product = program_->AddTemporary(y_md);
    args.push_back({DNNL_ARG_DST, product});
    AddStep(dnnl::matmul(pd), std::move(args), pd.scratchpad_desc());
    const Md c_md = PlainMd(c2);
    dnnl::primitive_attr c_attr = UserScratchpad();
    c_attr.set_scales(DNNL_ARG_SRC_1, 0, {beta});
    dnnl::binary::primitive_desc add_pd(dnnl::binary::desc(algorithm::binary_add, y_md, c_md, y_md),
                                        c_attr, engine_);
    const int c = View(InputPlain(i, 2), c_md);
    const int dst = Define(OutputName(i), y_md);
    AddStep(dnnl::binary(add_pd),
            {{DNNL_ARG_SRC_0, product}, {DNNL_ARG_SRC_1, c}, {DNNL_ARG_DST, dst}},
            add_pd.scratchpad_desc());
    Note(i, i, ImplName(pd) + " + " + ImplName(add_pd) + " for beta*C");
    return i + 1;
  }

  std::size_t LowerPool(std::size_t i) {
    const OperatorDesc& op = layers_[i];
    const Shape& x = op.inputs[0].shape;
    auto window = ResolveWindow(op, std::span(x).subspan(2), IntsAttr(op, "kernel_shape"),
                                op_rules::WindowOp::kPool);
    if (!window.ok())
      throw CompileError{window.error()};
    algorithm kind = algorithm::pooling_avg_exclude_padding;
    if (op.op_type == "MaxPool") {
      kind = algorithm::pooling_max;
    } else if (IntAttr(op, "count_include_pad", 0) != 0) {
      if (window.value().ceil_extended)
        throw CompileError{NodeUnimplemented(op, "ceil_mode with count_include_pad past the pads")};
      kind = algorithm::pooling_avg_include_padding;
    }
    if (x.size() == 4)
      return LowerPool2d(i, window.value(), kind);
    return LowerPooling(i, window.value(), kind);
  }

  // A 2-D MaxPool or AveragePool by CpuAcc's own kernel (pool_kernel.hpp says why), on the
  // input's channel-blocked layout or channels-last (one reorder in when it has neither).
  std::size_t LowerPool2d(std::size_t i, const Window& window, algorithm kind) {
    const OperatorDesc& op = layers_[i];
    const Shape& x = op.inputs[0].shape;
    const Shape& y = op.outputs[0].shape;
    const Shape expected{x[0], x[1], window.out[0], window.out[1]};
    if (expected != y) {
      throw CompileError{
          NodeInvalid(op, "output " + ToString(y) + ", the window gives " + ToString(expected))};
    }
    PoolGeometry geometry;
    geometry.kind = kind == algorithm::pooling_max ? PoolGeometry::Kind::kMax
                    : kind == algorithm::pooling_avg_include_padding
                        ? PoolGeometry::Kind::kAverageIncludingPadding
                        : PoolGeometry::Kind::kAverageExcludingPadding;
    // Channel-blocked input (a convolution's nChw8c) pools as it is: [N * C/8][H][W][8], the
    // padding channels of the last block zeros in and out; anything else goes channels-last.
    int src = Current(i, 0);
    const Md src_md = program_->value(src).md;
    Md dst_md = *ChannelsLastMd(y);
    const char* how = "CpuAcc's pooling, channels-last";
    geometry.outer = x[0];
    geometry.lanes = x[1];
    if (const std::optional<memory::format_tag> blocked = ChannelBlockedTag(src_md)) {
      const int64_t block = src_md.data.format_desc.blocking.inner_blks[0];
      geometry.outer = x[0] * (src_md.data.padded_dims[1] / block);
      geometry.lanes = block;
      dst_md = Md(Dims(y), memory::data_type::f32, *blocked);
      how = "CpuAcc's pooling, channel-blocked";
    } else {
      src = InputAs(i, 0, *ChannelsLastMd(x));
    }
    geometry.in_h = x[2];
    geometry.in_w = x[3];
    geometry.out_h = y[2];
    geometry.out_w = y[3];
    geometry.kernel_h = window.kernel[0];
    geometry.kernel_w = window.kernel[1];
    geometry.stride_h = window.strides[0];
    geometry.stride_w = window.strides[1];
    geometry.dilation_h = window.dilations[0];
    geometry.dilation_w = window.dilations[1];
    geometry.pad_top = window.pad_begin[0];
    geometry.pad_left = window.pad_begin[1];
    // Include-padding averages count the ONNX padding only: CheckPool refuses a ceil_mode window
    // past it, so oneDNN's pad_end is the ONNX one there.
    geometry.pad_bottom = window.pad_end[0];
    geometry.pad_right = window.pad_end[1];
    geometry.Prepare();
    const int dst = Define(OutputName(i), dst_md);
    program_->AddPool(src, dst, std::move(geometry));
    Note(i, i, how, /*own_kernel=*/true);
    return i + 1;
  }

  // GlobalAveragePool, GlobalMaxPool: one window over all spatial dims.
  std::size_t LowerGlobalPool(std::size_t i) {
    const OperatorDesc& op = layers_[i];
    const Shape& x = op.inputs[0].shape;
    const std::span<const int64_t> spatial(x.begin() + 2, x.end());
    Window window;
    window.kernel.assign(spatial.begin(), spatial.end());
    window.strides.assign(spatial.size(), 1);
    window.dilations.assign(spatial.size(), 1);
    window.pad_begin.assign(spatial.size(), 0);
    window.pad_end.assign(spatial.size(), 0);
    window.out.assign(spatial.size(), 1);
    return LowerPooling(i, window,
                        op.op_type == "GlobalMaxPool" ? algorithm::pooling_max
                                                      : algorithm::pooling_avg_exclude_padding);
  }

  std::size_t LowerPooling(std::size_t i, const Window& window, algorithm kind) {
    const OperatorDesc& op = layers_[i];
    const Shape& x = op.inputs[0].shape;
    Shape expected{x[0], x[1]};
    expected.insert(expected.end(), window.out.begin(), window.out.end());
    if (expected != op.outputs[0].shape) {
      throw CompileError{NodeInvalid(op, "output " + ToString(op.outputs[0].shape) +
                                             ", the window gives " + ToString(expected))};
    }
    memory::dims dilation;
    for (int64_t d : window.dilations)
      dilation.push_back(d - 1);
    // Without padding the two averages agree, and oneDNN 2.6's include-padding kernel is the
    // fast one (on AVX2, by several times; pool_kernel.hpp).
    const auto zero = [](int64_t pad) { return pad == 0; };
    if (kind == algorithm::pooling_avg_exclude_padding &&
        std::all_of(window.pad_begin.begin(), window.pad_begin.end(), zero) &&
        std::all_of(window.pad_end.begin(), window.pad_end.end(), zero)) {
      kind = algorithm::pooling_avg_include_padding;
    }
    // The input stays in whatever layout it has (blocked after a convolution), unless oneDNN
    // has only its scalar reference for that layout (plain NCHW for most pools): then the input
    // goes to channels-last first: one fast reorder costs far less than the scalar pool.
    auto pool_desc = [&](const Md& src_md) {
      const Md dst_any(Dims(expected), memory::data_type::f32, memory::format_tag::any);
      return dnnl::pooling_v2_forward::desc(
          dnnl::prop_kind::forward_inference, kind, src_md, dst_any,
          memory::dims(window.strides.begin(), window.strides.end()),
          memory::dims(window.kernel.begin(), window.kernel.end()), dilation,
          memory::dims(window.pad_begin.begin(), window.pad_begin.end()),
          memory::dims(window.pad_end.begin(), window.pad_end.end()));
    };
    // No post-ops here: oneDNN 2.6 takes them reliably on convolutions and matmuls only.
    const std::size_t last = i;
    const dnnl::primitive_attr attr = UserScratchpad();
    int src = Current(i, 0);
    dnnl::pooling_v2_forward::primitive_desc pd(pool_desc(program_->value(src).md), attr, engine_);
    const std::optional<Md> channels_last = ChannelsLastMd(x);
    if (IsReferenceImpl(ImplName(pd)) && channels_last &&
        program_->value(src).md != *channels_last) {
      dnnl::pooling_v2_forward::primitive_desc on_channels_last(pool_desc(*channels_last), attr,
                                                                engine_);
      if (!IsReferenceImpl(ImplName(on_channels_last))) {
        pd = on_channels_last;
        src = InputAs(i, 0, *channels_last);
      }
    }
    const int dst = Define(OutputName(last), pd.dst_desc());
    AddStep(dnnl::pooling_v2_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}},
            pd.scratchpad_desc());
    Note(i, last, ImplName(pd));
    return last + 1;
  }

  // Relu, LeakyRelu, Sigmoid, Tanh, HardSigmoid, HardSwish, Clip: one eltwise primitive per
  // function of EltwiseSteps, the first into the output, the rest in place. The input's layout
  // is kept (blocked after a convolution): no reorder around an activation.
  std::size_t LowerActivation(std::size_t i) {
    const int src = Current(i, 0);
    const Md md = program_->value(src).md;
    // No post-ops here: oneDNN 2.6 takes them reliably on convolutions and matmuls only.
    int from = src, dst = -1;
    std::string impl;
    for (const Eltwise& function : EltwiseSteps(layers_[i])) {
      dnnl::eltwise_forward::desc desc(dnnl::prop_kind::forward_inference, function.kind, md,
                                       function.alpha, function.beta);
      dnnl::eltwise_forward::primitive_desc pd(desc, UserScratchpad(), engine_);
      if (dst < 0)
        dst = Define(OutputName(i), pd.dst_desc());
      AddStep(dnnl::eltwise_forward(pd), {{DNNL_ARG_SRC, from}, {DNNL_ARG_DST, dst}},
              pd.scratchpad_desc());
      impl += (impl.empty() ? "" : " + ") + ImplName(pd);
      from = dst;
    }
    Note(i, i, impl);
    return i + 1;
  }

  // Add, Sub, Mul, Div. oneDNN's binary primitive broadcasts its second operand only
  // (src0 has the output's dims). So: the operand of the output's shape goes first (swapped for
  // Add and Mul, which commute); where the first operand still broadcasts (Sub, Div, or both
  // broadcasting), it is spread over the output first — the output filled with ones, times the
  // operand (exact: 1 * a is a, infinities and NaNs included) — and the op then runs in place.
  // Two operands of the output's shape keep the first one's layout (blocked after a
  // convolution); broadcasting runs on plain layouts.
  std::size_t LowerBinary(std::size_t i) {
    if (auto step = quantized_steps_.find(i); step != quantized_steps_.end())
      return LowerQuantizedAdd(step->second);
    const OperatorDesc& op = layers_[i];
    const Shape& y = op.outputs[0].shape;
    auto out = op_rules::Broadcast(op.inputs[0].shape, op.inputs[1].shape);
    if (!out.ok() || out.value() != y)
      throw CompileError{NodeInvalid(op, "output " + ToString(y) + " does not match the inputs")};
    const algorithm kind = op.op_type == "Add"   ? algorithm::binary_add
                           : op.op_type == "Sub" ? algorithm::binary_sub
                           : op.op_type == "Mul" ? algorithm::binary_mul
                                                 : algorithm::binary_div;
    const bool commutes = kind == algorithm::binary_add || kind == algorithm::binary_mul;
    // Of the output's element count: the output's dims with leading 1s dropped (same bytes).
    auto full = [&](std::size_t k) { return PadTo(op.inputs[k].shape, y.size()) == y; };
    std::size_t first = 0, second = 1;
    if (!full(0) && full(1) && commutes)
      std::swap(first, second);
    // oneDNN's dims for an ONNX scalar output are [1]; operands padded to the output's rank.
    const Md y_md = PlainMd(y);
    const Md src1_plain = PlainMd(PadTo(op.inputs[second].shape, y.size()));
    if (op.inputs[0].shape == y && op.inputs[1].shape == y && !IsConstant(op, 0) &&
        !IsConstant(op, 1)) {
      const Md md = program_->value(Current(i, first)).md;
      const int src0 = Current(i, first);
      const int src1 = InputAs(i, second, md);
      dnnl::binary::primitive_desc pd(dnnl::binary::desc(kind, md, md, md), UserScratchpad(),
                                      engine_);
      const int dst = Define(OutputName(i), md);
      AddStep(dnnl::binary(pd),
              {{DNNL_ARG_SRC_0, src0}, {DNNL_ARG_SRC_1, src1}, {DNNL_ARG_DST, dst}},
              pd.scratchpad_desc());
      Note(i, i, ImplName(pd));
      return i + 1;
    }
    const int src1 = View(InputPlain(i, second), src1_plain);
    const int dst = Define(OutputName(i), y_md);
    int src0;
    std::string impl;
    if (full(first)) {
      src0 = View(InputPlain(i, first), y_md);
    } else {
      const Md a_md = PlainMd(PadTo(op.inputs[first].shape, y.size()));
      const int a = View(InputPlain(i, first), a_md);
      dnnl::binary::primitive_desc spread(
          dnnl::binary::desc(algorithm::binary_mul, y_md, a_md, y_md), UserScratchpad(), engine_);
      program_->AddFill(dst, 1.0f);
      AddStep(dnnl::binary(spread),
              {{DNNL_ARG_SRC_0, dst}, {DNNL_ARG_SRC_1, a}, {DNNL_ARG_DST, dst}},
              spread.scratchpad_desc());
      impl = "input " + std::to_string(first) + " broadcast by " + ImplName(spread) + ", then ";
      src0 = dst;
    }
    dnnl::binary::primitive_desc pd(dnnl::binary::desc(kind, y_md, src1_plain, y_md),
                                    UserScratchpad(), engine_);
    AddStep(dnnl::binary(pd), {{DNNL_ARG_SRC_0, src0}, {DNNL_ARG_SRC_1, src1}, {DNNL_ARG_DST, dst}},
            pd.scratchpad_desc());
    Note(i, i, impl + ImplName(pd));
    return i + 1;
  }

  // Pad (constant mode, pads >= 0). Folded into the next convolution's padding when that is the
  // only reader, the constant is 0 and only spatial dims are padded (the common export of a
  // padded convolution: both give zeros at the border). Otherwise the output is filled with the
  // constant and the input reordered into the interior, a view of the output at the begin pads.
  std::size_t LowerPad(std::size_t i) {
    const OperatorDesc& op = layers_[i];
    const PadSpec pad = ReadPad(op);
    if (auto next = SoleConsumer(i, OutputName(i)); next && FoldPadIntoConv(i, *next, pad)) {
      notes_[i] = "folded into the padding of " + NodeLabel(layers_[*next]);
      return i + 1;
    }
    const Shape& x = op.inputs[0].shape;
    const Shape& y = op.outputs[0].shape;
    const Md y_md = PlainMd(y);
    const int dst = Define(OutputName(i), y_md);
    program_->AddFill(dst, pad.value);
    const Md interior =
        y_md.submemory_desc(Dims(x), memory::dims(pad.begin.begin(), pad.begin.end()));
    const int inside = View(dst, interior);
    Reorder(InputPlain(i, 0), inside);
    Note(i, i, "fill + reorder into the interior");
    return i + 1;
  }

  // Rewrites Conv layer `conv`, the sole reader of Pad layer `pad_layer`'s output, to read the
  // Pad's input with the Pad's amounts added to its own pads; false (nothing changed) when the
  // Pad is not a zero pad of spatial dims or the Conv's padding is not explicit.
  bool FoldPadIntoConv(std::size_t pad_layer, std::size_t conv, const PadSpec& pad) {
    OperatorDesc& op = layers_[conv];
    const std::size_t rank = pad.begin.size();
    if (op.op_type != "Conv" || pad.value != 0.0f || rank < 3 ||
        layer_inputs_[conv][0] != OutputName(pad_layer) ||
        (layer_inputs_[conv].size() > 1 && layer_inputs_[conv][1] == OutputName(pad_layer)) ||
        pad.begin[0] != 0 || pad.begin[1] != 0 || pad.end[0] != 0 || pad.end[1] != 0 ||
        StringAttr(op, "auto_pad", "NOTSET") != "NOTSET")
      return false;
    const std::size_t spatial = rank - 2;
    std::vector<int64_t> pads = IntsAttr(op, "pads");
    if (pads.empty())
      pads.assign(2 * spatial, 0);
    if (pads.size() != 2 * spatial)
      return false;
    for (std::size_t d = 0; d < spatial; ++d) {
      pads[d] += pad.begin[d + 2];
      pads[d + spatial] += pad.end[d + 2];
    }
    op.attributes["pads"] = pads;
    op.inputs[0] = layers_[pad_layer].inputs[0];
    layer_inputs_[conv][0] = InputName(pad_layer, 0);
    last_use_[InputName(pad_layer, 0)] = std::max(last_use_[InputName(pad_layer, 0)], conv);
    return true;
  }

  std::size_t LowerSoftmax(std::size_t i) {
    const OperatorDesc& op = layers_[i];
    const Shape& x = op.inputs[0].shape;
    const int axis =
        static_cast<int>(*NormalizedAxis(IntAttr(op, "axis", -1), static_cast<int64_t>(x.size())));
    const Md md = PlainMd(x);
    dnnl::softmax_forward::desc desc(dnnl::prop_kind::forward_inference, md, axis);
    dnnl::softmax_forward::primitive_desc pd(desc, UserScratchpad(), engine_);
    const int src = InputPlain(i, 0);
    const int dst = Define(OutputName(i), md);
    AddStep(dnnl::softmax_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}},
            pd.scratchpad_desc());
    Note(i, i, ImplName(pd));
    return i + 1;
  }

  std::size_t LowerBatchNorm(std::size_t i) {
    const OperatorDesc& op = layers_[i];
    const int src = Current(i, 0);
    const Md md = program_->value(src).md;
    const auto flags = dnnl::normalization_flags::use_global_stats |
                       dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
    dnnl::batch_normalization_forward::desc desc(dnnl::prop_kind::forward_inference, md,
                                                 FloatAttr(op, "epsilon", 1e-5f), flags);
    // No post-ops here: oneDNN 2.6 takes them reliably on convolutions and matmuls only.
    const std::size_t last = i;
    const dnnl::primitive_attr attr = UserScratchpad();
    dnnl::batch_normalization_forward::primitive_desc pd(desc, attr, engine_);
    std::vector<std::pair<int, int>> args{{DNNL_ARG_SRC, src},
                                          {DNNL_ARG_SCALE, InputPlain(i, 1)},
                                          {DNNL_ARG_SHIFT, InputPlain(i, 2)},
                                          {DNNL_ARG_MEAN, InputPlain(i, 3)},
                                          {DNNL_ARG_VARIANCE, InputPlain(i, 4)}};
    args.push_back({DNNL_ARG_DST, Define(OutputName(last), pd.dst_desc())});
    AddStep(dnnl::batch_normalization_forward(pd), std::move(args), pd.scratchpad_desc());
    Note(i, last, ImplName(pd));
    return last + 1;
  }

  // Concat as one reorder per input into its slice of the output (a submemory); oneDNN 2.6's own
  // concat ran a scalar copy loop here (a large share of a SqueezeNet-like request). The output's
  // layout keeps the convolutions' out of a round trip to plain and back:
  //  - the inputs' channel-blocked layout, when they all share it and a channel concat's slices
  //    start on block boundaries (an Inception block: every branch a convolution);
  //  - else channels-last, when any input has it or a channel concat has any input that is not
  //    plain (DenseNet's growth of 12 channels in 8-channel blocks): blocked inputs take one
  //    reorder either way, and what reads the output (a pool, a batch norm, a convolution) has
  //    fast kernels on channels-last; on plain NCHW, oneDNN 2.6 pools with its scalar reference
  //    (an Inception-like block's average pool then cost nearly as much as the rest of it);
  //  - else plain.
  std::size_t LowerConcat(std::size_t i) {
    const OperatorDesc& op = layers_[i];
    const Shape& y = op.outputs[0].shape;
    const auto axis = static_cast<std::size_t>(
        *NormalizedAxis(IntAttr(op, "axis", 0), static_cast<int64_t>(y.size())));
    std::optional<memory::format_tag> shared_block;
    bool blocks_align = axis == 1, any_channels_last = false, any_laid_out = false;
    for (std::size_t k = 0; k < op.inputs.size(); ++k) {
      if (ElementCount(op.inputs[k].shape) == 0)
        continue;
      const Md md = program_->value(Current(i, k)).md;
      const std::optional<memory::format_tag> block = ChannelBlockedTag(md);
      blocks_align = blocks_align && block && (!shared_block || *block == *shared_block) &&
                     op.inputs[k].shape[1] % md.data.format_desc.blocking.inner_blks[0] == 0;
      if (block)
        shared_block = block;
      any_channels_last |= ChannelsLastMd(y) && md == *ChannelsLastMd(op.inputs[k].shape);
      any_laid_out |= !IsPlain(md);
    }
    Md y_md = PlainMd(y);
    const char* how = "reorders into slices";
    if (blocks_align && shared_block) {
      y_md = Md(Dims(y), memory::data_type::f32, *shared_block);
      how = "reorders into channel-blocked slices";
    } else if (ChannelsLastMd(y) && (any_channels_last || (axis == 1 && any_laid_out))) {
      y_md = *ChannelsLastMd(y);
      how = "reorders into channels-last slices";
    }
    const bool keep_layouts = !IsPlain(y_md);
    const int dst = Define(OutputName(i), y_md);
    memory::dims offsets(y.size(), 0);
    for (std::size_t k = 0; k < op.inputs.size(); ++k) {
      const Shape& x = op.inputs[k].shape;
      if (ElementCount(x) == 0)
        continue;
      const int src = keep_layouts ? Current(i, k) : InputPlain(i, k);
      const int slice =
          program_->AddValue(y_md.submemory_desc(Dims(x), offsets), program_->value(dst).storage);
      Reorder(src, slice);
      offsets[axis] += x[axis];
    }
    Note(i, i, how);
    return i + 1;
  }

  std::size_t LowerTranspose(std::size_t i) {
    const OperatorDesc& op = layers_[i];
    const Shape& x = op.inputs[0].shape;
    const Shape& y = op.outputs[0].shape;
    std::vector<int64_t> perm = IntsAttr(op, "perm");
    if (!op.attributes.contains("perm")) {
      for (std::size_t d = x.size(); d-- > 0;)
        perm.push_back(static_cast<int64_t>(d));
    }
    // The input seen in the output's dim order: output dim d walks input dim perm[d].
    const memory::dims x_strides = RowMajorStrides(Dims(x));
    memory::dims strides;
    for (int64_t p : perm)
      strides.push_back(x_strides[p]);
    const Md permuted(Dims(y), memory::data_type::f32, x.empty() ? memory::dims{1} : strides);
    const int src = View(InputPlain(i, 0), permuted);
    const int dst = Define(OutputName(i), PlainMd(y));
    Reorder(src, dst);
    Note(i, i, "reorder");
    return i + 1;
  }

  // ---- quantized layers ---------------------------------------------------------------------

  // The int8 step headed by layer i (QuantizedStep), or nullopt when the layers around it do not
  // have that form (they then run one by one: the pairs as reorders, the product in FP32).
  std::optional<QuantizedStep> MatchQuantizedStep(std::size_t i) {
    const OperatorDesc& op = layers_[i];
    if (op.op_type == "Add")
      return MatchQuantizedAdd(i);
    const bool conv = op.op_type == "Conv", gemm = op.op_type == "Gemm";
    if ((!conv && !gemm && op.op_type != "MatMul") || op.outputs.size() != 1)
      return std::nullopt;
    auto dequantized = [&](std::size_t index) -> std::optional<std::size_t> {
      if (!HasInput(op, index) || IsConstant(op, index))
        return std::nullopt;
      auto it = producer_.find(InputName(i, index));
      if (it == producer_.end() || layers_[it->second].op_type != "DequantizeLinear")
        return std::nullopt;
      return it->second;
    };
    QuantizedStep step;
    step.head = i;
    const auto src = dequantized(0), weights = dequantized(1);
    if (!src || !weights)
      return std::nullopt;
    const OperatorDesc& s = layers_[*src];
    const OperatorDesc& w = layers_[*weights];
    if (IsConstant(s, 0) || s.inputs[0].type == DataType::kInt32 || !IsConstant(w, 0) ||
        w.inputs[0].type != DataType::kInt8)
      return std::nullopt;
    step.src_dq = *src;
    step.weights_dq = *weights;
    step.src = ReadQuantParams(s);
    step.weights = ReadQuantParams(w);
    const Shape& b = op.inputs[1].shape;
    int64_t out_axis = 0;
    if (gemm) {
      if (IntAttr(op, "transA", 0) != 0 || FloatAttr(op, "alpha", 1.0f) != 1.0f ||
          (HasInput(op, 2) && FloatAttr(op, "beta", 1.0f) != 1.0f))
        return std::nullopt;
      out_axis = IntAttr(op, "transB", 0) != 0 ? 0 : 1;
    } else if (!conv) {
      if (op.inputs[0].shape.size() < 2 || b.size() != 2)
        return std::nullopt;
      out_axis = 1;
    }
    const int64_t n = b[out_axis];
    if (!step.weights.per_tensor() && step.weights.axis != out_axis)
      return std::nullopt;
    if (HasInput(op, 2)) {
      if (ElementCount(op.inputs[2].shape) != n || op.inputs[2].shape.back() != n)
        return std::nullopt;
      if (IsConstant(op, 2)) {
        step.float_bias = static_cast<const float*>(op.constant_inputs[2]);
      } else {
        const auto bias = dequantized(2);
        if (!bias || !IsConstant(layers_[*bias], 0) ||
            layers_[*bias].inputs[0].type != DataType::kInt32)
          return std::nullopt;
        step.bias_dq = *bias;
        step.bias = ReadQuantParams(layers_[*bias]);
      }
    }
    MatchEpilogue(i, &step, /*float_output=*/true);
    return step;
  }

  // The layers after `head` up to its QuantizeLinear, each value read by exactly one layer:
  // Relu/Clip, then the QuantizeLinear (into `step`). When they have another form: false, or
  // with `float_output` true, the step writes the last of them (the head, or its last Relu/Clip)
  // in FP32: `quantize` is that layer, `dst` scale 1 and zero point 0.
  bool MatchEpilogue(std::size_t head, QuantizedStep* step, bool float_output) {
    std::string value = OutputName(head);
    for (;;) {
      auto readers = consumers_.find(value);
      const bool one_reader = !output_index_.contains(value) && readers != consumers_.end() &&
                              readers->second.size() == 1;
      const std::size_t next = one_reader ? readers->second.front() : 0;
      const std::string& type = one_reader ? layers_[next].op_type : value;
      if (one_reader && InputName(next, 0) == value && (type == "Relu" || type == "Clip")) {
        step->epilogue.push_back(next);
        value = OutputName(next);
        continue;
      }
      if (one_reader && InputName(next, 0) == value && type == "QuantizeLinear") {
        step->quantize = next;
        step->dst = ReadQuantParams(layers_[next]);
        return true;
      }
      if (!float_output)
        return false;
      step->quantize = step->epilogue.empty() ? head : step->epilogue.back();
      step->quantized_output = false;
      step->dst = QuantParams{DataType::kFloat32, -1, {1.0f}, {0}};
      return true;
    }
  }

  // An Add of two dequantized activations of one shape (QuantizedStep says how it runs).
  std::optional<QuantizedStep> MatchQuantizedAdd(std::size_t i) {
    const OperatorDesc& op = layers_[i];
    if (op.inputs.size() != 2 || op.inputs[0].shape != op.inputs[1].shape ||
        op.outputs[0].shape != op.inputs[0].shape)
      return std::nullopt;
    QuantizedStep step;
    step.head = i;
    for (std::size_t k = 0; k < 2; ++k) {
      if (IsConstant(op, k))
        return std::nullopt;
      auto it = producer_.find(InputName(i, k));
      if (it == producer_.end() || layers_[it->second].op_type != "DequantizeLinear" ||
          IsConstant(layers_[it->second], 0))
        return std::nullopt;
      (k == 0 ? step.src_dq : step.second_dq) = it->second;
      (k == 0 ? step.src : step.second) = ReadQuantParams(layers_[it->second]);
    }
    if (!MatchEpilogue(i, &step, /*float_output=*/false))
      return std::nullopt;
    return step;
  }

  // Whether every reader of layer i's output is an int8 step that reads the quantized input
  // itself (so the dequantized value is never needed).
  bool ReadOnlyByQuantizedSteps(std::size_t i) {
    const std::string& value = OutputName(i);
    auto readers = consumers_.find(value);
    if (output_index_.contains(value) || readers == consumers_.end())
      return false;
    return std::all_of(readers->second.begin(), readers->second.end(),
                       [&](std::size_t reader) { return quantized_steps_.contains(reader); });
  }

  // A one-element INT32 constant: a zero point given to a primitive at execution.
  int ZeroPointValue(int32_t zero_point) {
    memory value(Md({1}, memory::data_type::s32, memory::format_tag::a), engine_);
    *static_cast<int32_t*>(value.get_data_handle()) = zero_point;
    return program_->AddConstant(value);
  }

  // The primitive's attributes for `step`: output scales (per channel on dim `channel_dim` of the
  // destination when the weights have per-channel scales), the zero points, the epilogue as
  // post-ops; and the bias in accumulator units (empty without one). See QuantizedStep.
  dnnl::primitive_attr QuantizedAttr(const QuantizedStep& step, int64_t channels, int channel_dim,
                                     std::vector<float>* bias) {
    const double sx = step.src.scale(0), sy = step.dst.scale(0);
    std::vector<float> output_scales;
    for (int64_t c = 0; c < (step.weights.per_tensor() ? 1 : channels); ++c)
      output_scales.push_back(static_cast<float>(sx * step.weights.scale(c) / sy));
    bias->clear();
    if (step.bias_dq || step.float_bias != nullptr) {
      const auto* b = step.bias_dq
                          ? static_cast<const int32_t*>(layers_[*step.bias_dq].constant_inputs[0])
                          : nullptr;
      for (int64_t c = 0; c < channels; ++c) {
        const double real = b ? b[c] * static_cast<double>(step.bias.scale(c)) : step.float_bias[c];
        bias->push_back(static_cast<float>(real / (sx * step.weights.scale(c))));
      }
    }
    dnnl::post_ops post_ops;
    AppendEpilogue(step, &post_ops);
    dnnl::primitive_attr attr = UserScratchpad();
    attr.set_output_scales(step.weights.per_tensor() ? 0 : 1 << channel_dim, output_scales);
    if (step.src.zero_point(0) != 0)
      attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
    if (step.dst.zero_point(0) != 0)
      attr.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
    attr.set_post_ops(post_ops);
    return attr;
  }

  // The step's Relu/Clip as post-ops on values in units of the output's scale.
  void AppendEpilogue(const QuantizedStep& step, dnnl::post_ops* post_ops) {
    const double sy = step.dst.scale(0);
    for (std::size_t layer : step.epilogue) {
      if (layers_[layer].op_type == "Relu") {
        post_ops->append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
      } else {
        const auto [low, high] = ClipBounds(layers_[layer]);
        post_ops->append_eltwise(1.0f, algorithm::eltwise_clip, static_cast<float>(low / sy),
                                 static_cast<float>(high / sy));
      }
    }
  }

  // The arguments every int8 step has besides weights and bias: source, destination (the
  // QuantizeLinear's output), zero points. Records the shapes of the fused layers' outputs.
  void QuantizedArgs(const QuantizedStep& step, const Md& src_md, const Md& dst_md,
                     std::vector<std::pair<int, int>>* args) {
    for (std::size_t layer : step.epilogue)
      shapes_[OutputName(layer)] = layers_[layer].outputs[0].shape;
    shapes_[OutputName(step.quantize)] = layers_[step.quantize].outputs[0].shape;
    // A MatMul's [batch..., M, K] activations are read as [batch * M, K]: the same bytes.
    const std::string& x = InputName(step.src_dq, 0);
    args->push_back({DNNL_ARG_SRC, src_md.dims() == Dims(ShapeOf(x)) ? Get(x, src_md)
                                                                     : View(GetPlain(x), src_md)});
    args->push_back({DNNL_ARG_DST, Define(OutputName(step.quantize), dst_md)});
    if (step.src.zero_point(0) != 0) {
      args->push_back(
          {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, ZeroPointValue(step.src.zero_point(0))});
    }
    if (step.dst.zero_point(0) != 0) {
      args->push_back(
          {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, ZeroPointValue(step.dst.zero_point(0))});
    }
  }

  // The network's INT8 weights (plain `md`) laid out as `wanted`, once per backend instance.
  int QuantizedWeights(const QuantizedStep& step, const Md& md, const Md& wanted) {
    const void* data = layers_[step.weights_dq].constant_inputs[0];
    return program_->AddSharedConstant(
        constants_.Get({{data}, ""}, md, wanted, [&] { return LaidOut(data, md, wanted); }));
  }

  // The notes of an int8 step: the head says what ran, the layers fused into it name it.
  void NoteQuantized(const QuantizedStep& step, const std::string& impl) {
    const OperatorDesc& head = layers_[step.head];
    const bool add = head.op_type == "Add";
    std::string chain = "DequantizeLinear+" + head.op_type;
    for (std::size_t layer : step.epilogue)
      chain += "+" + layers_[layer].op_type;
    if (step.quantized_output)
      chain += "+QuantizeLinear";
    const std::string types =
        std::string(TypeName(DnnlType(step.src.type))) +
        (add ? std::string(" + ") + TypeName(DnnlType(step.second.type)) : std::string(" x s8")) +
        " -> " + TypeName(DnnlType(step.dst.type));
    const std::string scales = add || step.weights.per_tensor() ? "per-tensor" : "per-channel";
    std::string threads;
    if (threads_ > 1) {
      threads = step_threads_ > 1 ? " on " + std::to_string(step_threads_) + " threads"
                                  : " on 1 thread (too little work for more)";
    }
    notes_[step.head] = "int8 (" + types + ", " + scales + " scales), oneDNN " + impl + threads +
                        ", fused " + chain;
    std::vector<std::size_t> fused = step.epilogue;
    if (step.quantized_output)
      fused.push_back(step.quantize);
    for (std::size_t layer : fused) {
      notes_[layer] = "fused into " + head.name + " (int8 " + chain + ")";
      lowered_[layer] = true;
    }
  }

  // oneDNN's first int8 implementation is not always its fastest (on AVX-512 VNNI, depthwise
  // convolutions ran slower on brdgmm_dw than on jit_int8; docs/performance.md, int8 section):
  // when tuning, each non-reference implementation that keeps the first one's source and
  // destination layouts (its neighbours' layouts do not change) is timed once on zeros, the
  // fastest kept (the first on a tie within 3%).
  dnnl::convolution_forward::primitive_desc FastestQuantizedConv(
      const dnnl::convolution_forward::desc& desc, const dnnl::primitive_attr& attr,
      const QuantizedStep& step) {
    dnnl::convolution_forward::primitive_desc first(desc, attr, engine_);
    const double flops = 2.0 *
                         static_cast<double>(ElementCount(layers_[step.head].outputs[0].shape)) *
                         static_cast<double>(ElementCount(layers_[step.head].inputs[1].shape) /
                                             layers_[step.head].inputs[1].shape[0]);
    if (!options_.tune || flops < kTuneFlops)
      return first;
    std::unordered_map<int, memory> zero_points;
    for (const auto& [arg, value] : {std::pair{DNNL_ARG_SRC, step.src.zero_point(0)},
                                     std::pair{DNNL_ARG_DST, step.dst.zero_point(0)}}) {
      if (value == 0)
        continue;
      memory m(Md({1}, memory::data_type::s32, memory::format_tag::a), engine_);
      *static_cast<int32_t*>(m.get_data_handle()) = value;
      zero_points[DNNL_ARG_ATTR_ZERO_POINTS | arg] = m;
    }
    dnnl::convolution_forward::primitive_desc candidate = first, best_pd = first;
    int index = 0, best = 0;
    double best_time = 1e300;
    do {
      if (!IsReferenceImpl(ImplName(candidate)) && candidate.src_desc() == first.src_desc() &&
          candidate.dst_desc() == first.dst_desc()) {
        const double time =
            TimePrimitive(dnnl::convolution_forward(candidate), candidate, zero_points);
        if (time * (index == 0 ? 1.0 : 1.03) < best_time) {
          best_time = time;
          best = index;
          best_pd = candidate;
        }
      }
      ++index;
    } while (candidate.next_impl());
    // On a busy machine one timing can flatter a slow implementation (a gemm-based or an SSE4.1
    // kernel once won at batch 8 on 2 threads, and the request took ten times as long): the
    // winner must beat the first choice again, by 10%, timed side by side.
    if (best != 0) {
      const double again_first =
          TimePrimitive(dnnl::convolution_forward(first), first, zero_points);
      const double again_best =
          TimePrimitive(dnnl::convolution_forward(best_pd), best_pd, zero_points);
      if (again_best * 1.1 > again_first)
        best = 0;
    }
    dnnl::convolution_forward::primitive_desc chosen(desc, attr, engine_);
    for (int k = 0; k < best; ++k)
      chosen.next_impl();
    return chosen;
  }

  std::size_t LowerQuantizedConv(const QuantizedStep& step) {
    const std::size_t i = step.head;
    const OperatorDesc& op = layers_[i];
    const ConvGeometry geometry = ConvGeometryOf(op);
    const int64_t maps = geometry.maps;
    const memory::dims& w_dims = geometry.weights;
    const Md src_any(Dims(op.inputs[0].shape), DnnlType(step.src.type), memory::format_tag::any);
    const Md w_any(w_dims, memory::data_type::s8, memory::format_tag::any);
    const Md dst_any(Dims(geometry.output), DnnlType(step.dst.type), memory::format_tag::any);
    const Md bias_md({maps}, memory::data_type::f32, memory::format_tag::a);
    std::vector<float> bias;
    const dnnl::primitive_attr attr = QuantizedAttr(step, maps, 1, &bias);
    const auto desc = geometry.Desc(src_any, w_any, bias.empty() ? nullptr : &bias_md, dst_any);
    const dnnl::convolution_forward::primitive_desc pd = FastestQuantizedConv(desc, attr, step);
    std::vector<std::pair<int, int>> args{
        {DNNL_ARG_WEIGHTS,
         QuantizedWeights(step, PlainMd(Shape(w_dims.begin(), w_dims.end()), memory::data_type::s8),
                          pd.weights_desc())}};
    if (!bias.empty())
      args.push_back({DNNL_ARG_BIAS, OwnedConstant(bias.data(), bias_md, bias_md)});
    QuantizedArgs(step, pd.src_desc(), pd.dst_desc(), &args);
    AddStep(dnnl::convolution_forward(pd), std::move(args), pd.scratchpad_desc());
    NoteQuantized(step, ImplName(pd));
    return i + 1;
  }

  std::size_t LowerQuantizedAdd(const QuantizedStep& step) {
    const double sa = step.src.scale(0), sb = step.second.scale(0), sy = step.dst.scale(0);
    const int a = Reps(InputName(step.src_dq, 0)).front();
    const Md a_md = program_->value(a).md;
    const Md b_md = WithType(a_md, DnnlType(step.second.type));
    const Md y_md = WithType(a_md, DnnlType(step.dst.type));
    // v = y / sy + zy, then the epilogue on v: Relu as max(v, zy), Clip(lo, hi) as a clip to
    // [lo / sy + zy, hi / sy + zy]. (Trap: a linear shift after a Relu post-op gave zeros here on
    // oneDNN 2.6, so the zero point goes in first and the bounds move with it.)
    const auto zy = static_cast<double>(step.dst.zero_point(0));
    const double shift = zy - (sa * step.src.zero_point(0) + sb * step.second.zero_point(0)) / sy;
    dnnl::post_ops post_ops;
    if (shift != 0.0)
      post_ops.append_eltwise(1.0f, algorithm::eltwise_linear, 1.0f, static_cast<float>(shift));
    for (std::size_t layer : step.epilogue) {
      float low = static_cast<float>(zy), high = std::numeric_limits<float>::max();
      if (layers_[layer].op_type == "Clip") {
        const auto [min, max] = ClipBounds(layers_[layer]);
        low = static_cast<float>(std::max<double>(min / sy + zy, -high));
        high = static_cast<float>(std::min<double>(max / sy + zy, high));
      }
      post_ops.append_eltwise(1.0f, algorithm::eltwise_clip, low, high);
    }
    dnnl::primitive_attr attr = UserScratchpad();
    attr.set_scales(DNNL_ARG_SRC_0, 0, {static_cast<float>(sa / sy)});
    attr.set_scales(DNNL_ARG_SRC_1, 0, {static_cast<float>(sb / sy)});
    attr.set_post_ops(post_ops);
    const dnnl::binary::primitive_desc pd(
        dnnl::binary::desc(algorithm::binary_add, a_md, b_md, y_md), attr, engine_);
    const int b = Get(InputName(step.second_dq, 0), b_md);
    for (std::size_t layer : step.epilogue)
      shapes_[OutputName(layer)] = layers_[layer].outputs[0].shape;
    shapes_[OutputName(step.quantize)] = layers_[step.quantize].outputs[0].shape;
    const int dst = Define(OutputName(step.quantize), y_md);
    AddStep(dnnl::binary(pd), {{DNNL_ARG_SRC_0, a}, {DNNL_ARG_SRC_1, b}, {DNNL_ARG_DST, dst}},
            pd.scratchpad_desc());
    NoteQuantized(step, ImplName(pd));
    return step.head + 1;
  }

  // MatMul of activations [batch..., M, K] (as [batch * M, K]) and 2-D weights, Gemm (not
  // transposing A, alpha and beta 1).
  std::size_t LowerQuantizedMatMul(const QuantizedStep& step) {
    const std::size_t i = step.head;
    const OperatorDesc& op = layers_[i];
    const Shape& a = op.inputs[0].shape;
    const Shape& y = op.outputs[0].shape;
    const bool tb = op.op_type == "Gemm" && IntAttr(op, "transB", 0) != 0;
    const int64_t k = a.back(), m = ElementCount(a) / k;
    const int64_t n = tb ? op.inputs[1].shape[0] : op.inputs[1].shape[1];
    Shape expected(a.begin(), a.end() - 1);
    expected.push_back(n);
    if (y != expected)
      throw CompileError{NodeInvalid(op, "output " + ToString(y) + " does not match the operands")};
    const Md a_md = PlainMd(Shape{m, k}, DnnlType(step.src.type));
    const Md b_plain({k, n}, memory::data_type::s8, tb ? memory::dims{1, k} : memory::dims{n, 1});
    const Md b_any({k, n}, memory::data_type::s8, memory::format_tag::any);
    const Md y_md = PlainMd(Shape{m, n}, DnnlType(step.dst.type));
    const Md bias_md = PlainMd(Shape{1, n});
    std::vector<float> bias;
    const dnnl::primitive_attr attr = QuantizedAttr(step, n, 1, &bias);
    const auto desc = bias.empty() ? dnnl::matmul::desc(a_md, b_any, y_md)
                                   : dnnl::matmul::desc(a_md, b_any, bias_md, y_md);
    const dnnl::matmul::primitive_desc pd(desc, attr, engine_);
    std::vector<std::pair<int, int>> args{
        {DNNL_ARG_WEIGHTS, QuantizedWeights(step, b_plain, pd.weights_desc())}};
    if (!bias.empty())
      args.push_back({DNNL_ARG_BIAS, OwnedConstant(bias.data(), bias_md, bias_md)});
    QuantizedArgs(step, a_md, y_md, &args);
    AddStep(dnnl::matmul(pd), std::move(args), pd.scratchpad_desc());
    NoteQuantized(step, ImplName(pd));
    return i + 1;
  }

  // QuantizeLinear alone (per tensor): a reorder of the FP32 input, in its layout, to UINT8/INT8
  // with scale 1/s and the zero point; oneDNN rounds half to even and saturates. (x * (1/s) may
  // differ from ONNX's x / s in the last bit: a value at an exact x.5 may round one step apart.)
  std::size_t LowerQuantize(std::size_t i) {
    const QuantParams params = ReadQuantParams(layers_[i]);
    const int src = Current(i, 0);
    const Md src_md = program_->value(src).md;
    const Md dst_md = WithType(src_md, DnnlType(params.type));
    dnnl::primitive_attr attr = UserScratchpad();
    attr.set_output_scales(0, {1.0f / params.scale(0)});
    std::vector<std::pair<int, int>> args{{DNNL_ARG_FROM, src}};
    if (params.zero_point(0) != 0) {
      attr.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
      args.push_back(
          {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, ZeroPointValue(params.zero_point(0))});
    }
    const dnnl::reorder::primitive_desc pd(engine_, src_md, engine_, dst_md, attr);
    args.push_back({DNNL_ARG_TO, Define(OutputName(i), dst_md)});
    AddStep(dnnl::reorder(pd), std::move(args), pd.scratchpad_desc());
    Note(i, i, ImplName(pd) + " to " + TypeName(DnnlType(params.type)) + " (scale, zero point)");
    return i + 1;
  }

  // DequantizeLinear: nothing when only int8 steps read it; a constant (weights, bias) in FP32,
  // computed once; else a reorder to FP32 with the zero point and the scale, in the input's layout.
  std::size_t LowerDequantize(std::size_t i) {
    const OperatorDesc& op = layers_[i];
    if (ReadOnlyByQuantizedSteps(i)) {
      notes_[i] = "fused into " + layers_[consumers_[OutputName(i)].front()].name + " (int8 step)";
      return i + 1;
    }
    const QuantParams params = ReadQuantParams(op);
    if (IsConstant(op, 0)) {
      const Shape& x = op.inputs[0].shape;
      const int64_t count = ElementCount(x);
      int64_t inner = 1, extent = 1;
      if (params.axis >= 0) {
        extent = x[params.axis];
        for (std::size_t d = params.axis + 1; d < x.size(); ++d)
          inner *= x[d];
      }
      std::vector<float> values(count);
      for (int64_t e = 0; e < count; ++e) {
        const int64_t c = (e / inner) % extent;
        double q = 0;
        switch (params.type) {
          case DataType::kInt8:
            q = static_cast<const int8_t*>(op.constant_inputs[0])[e];
            break;
          case DataType::kUint8:
            q = static_cast<const uint8_t*>(op.constant_inputs[0])[e];
            break;
          default:
            q = static_cast<const int32_t*>(op.constant_inputs[0])[e];
        }
        values[e] = static_cast<float>((q - params.zero_point(c)) * params.scale(c));
      }
      const Md md = LogicalMd(OutputName(i));
      reps_[OutputName(i)].push_back(OwnedConstant(values.data(), md, md));
      notes_[i] = "dequantized once, at compile time";
      return i + 1;
    }
    const int src = Current(i, 0);
    const Md src_md = program_->value(src).md;
    const Md dst_md = WithType(src_md, memory::data_type::f32);
    dnnl::primitive_attr attr = UserScratchpad();
    attr.set_output_scales(0, {params.scale(0)});
    std::vector<std::pair<int, int>> args{{DNNL_ARG_FROM, src}};
    if (params.zero_point(0) != 0) {
      attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
      args.push_back(
          {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, ZeroPointValue(params.zero_point(0))});
    }
    const dnnl::reorder::primitive_desc pd(engine_, src_md, engine_, dst_md, attr);
    args.push_back({DNNL_ARG_TO, Define(OutputName(i), dst_md)});
    AddStep(dnnl::reorder(pd), std::move(args), pd.scratchpad_desc());
    Note(i, i, ImplName(pd) + " from " + TypeName(DnnlType(params.type)) + " (zero point, scale)");
    return i + 1;
  }

  const SubgraphDesc& g_;
  // The layers as lowered: a copy, because folding rewrites a consumer (a Pad folded into the
  // next Conv's padding gives that Conv the Pad's input). Constants still point into g_'s data.
  std::vector<OperatorDesc> layers_;
  std::vector<std::vector<std::string>> layer_inputs_;
  dnnl::engine engine_;
  ConstantCache& constants_;
  dnnl::stream stream_;
  std::shared_ptr<Program> program_;
  const int threads_;
  int step_threads_ = 1;  // for the primitives of the layer being lowered
  const CompileOptions options_;
  std::map<std::string, std::vector<int>, std::less<>> reps_;  // value -> its layouts in program
  std::map<std::string, Shape, std::less<>> shapes_;
  std::map<std::string, int, std::less<>> uses_;              // consumers inside the run
  std::map<std::string, std::size_t, std::less<>> last_use_;  // the last layer that reads it
  std::map<std::string, std::size_t, std::less<>> output_index_;
  std::vector<std::string> notes_;
  std::map<std::string, memory::data_type, std::less<>> types_;  // FP32 when not listed
  std::map<std::string, std::size_t, std::less<>> producer_;     // layer writing the value
  std::map<std::string, std::vector<std::size_t>, std::less<>> consumers_;  // layers reading it
  std::map<std::size_t, QuantizedStep> quantized_steps_;                    // by head layer
  std::vector<bool> lowered_;  // fused into a step lowered before its own turn came

  friend const OpRow* FindOpRow(std::string_view op_type);
};

const OpRow* FindOpRow(std::string_view op_type) {
  static constexpr OpRow kOps[] = {
      {"Conv", CheckConv, &Compiler::LowerConv},
      {"MaxPool", CheckMaxPool, &Compiler::LowerPool},
      {"AveragePool", CheckAveragePool, &Compiler::LowerPool},
      {"GlobalAveragePool", CheckGlobalPool, &Compiler::LowerGlobalPool},
      {"GlobalMaxPool", CheckGlobalPool, &Compiler::LowerGlobalPool},
      {"Gemm", CheckGemm, &Compiler::LowerMatMul},
      {"MatMul", CheckMatMul, &Compiler::LowerMatMul},
      {"Add", CheckBinary, &Compiler::LowerBinary},
      {"Mul", CheckBinary, &Compiler::LowerBinary},
      {"Sub", CheckBinary, &Compiler::LowerBinary},
      {"Div", CheckBinary, &Compiler::LowerBinary},
      {"Relu", CheckUnary, &Compiler::LowerActivation},
      {"LeakyRelu", CheckLeakyRelu, &Compiler::LowerActivation},
      {"HardSigmoid", CheckHardSigmoid, &Compiler::LowerActivation},
      {"HardSwish", CheckUnary, &Compiler::LowerActivation},
      {"Clip", CheckClip, &Compiler::LowerActivation},
      {"Dropout", CheckDropout, &Compiler::LowerView},
      {"Pad", CheckPad, &Compiler::LowerPad},
      {"Sigmoid", CheckUnary, &Compiler::LowerActivation},
      {"Tanh", CheckUnary, &Compiler::LowerActivation},
      {"Softmax", CheckSoftmax, &Compiler::LowerSoftmax},
      {"BatchNormalization", CheckBatchNorm, &Compiler::LowerBatchNorm},
      {"Identity", CheckIdentity, &Compiler::LowerView},
      {"Flatten", CheckFlatten, &Compiler::LowerView},
      {"Reshape", CheckReshape, &Compiler::LowerView},
      {"Transpose", CheckTranspose, &Compiler::LowerTranspose},
      {"Concat", CheckConcat, &Compiler::LowerConcat},
      {"QuantizeLinear", CheckQuantizeLinear, &Compiler::LowerQuantize},
      {"DequantizeLinear", CheckDequantizeLinear, &Compiler::LowerDequantize},
  };
  for (const OpRow& row : kOps) {
    if (row.op_type == op_type)
      return &row;
  }
  return nullptr;
}

}  // namespace

Status CheckOp(const OperatorDesc& op) {
  if (const OpRow* row = FindOpRow(op.op_type))
    return row->check(op);
  if (op.op_type == "Constant")
    return NodeUnimplemented(op, "Constant is not a backend op: the host folds it");
  return Unimplemented("CpuAcc does not implement op " + op.op_type + " (node '" + op.name + "')");
}

Result<CompileResult> Compile(const SubgraphDesc& subgraph, const dnnl::engine& engine,
                              ConstantCache& constants, int threads, CompileOptions options) {
  // Primitives are created with the thread count they will run with: oneDNN sizes some kernels'
  // work split at creation (omp_get_max_threads of the creating thread).
  // Creating them runs teams too (weight reorders), as big as `threads`, maybe none at all.
  auto team = OmpTeamScope::Enter(
      threads, false,
      "compiling " + (subgraph.layers.empty() ? std::string("an empty run")
                                              : NodeLabel(subgraph.layers.front())));
  if (!team.ok())
    return std::move(team).error();
  ScopedOmpThreads scoped(threads);
  try {
    return Compiler(subgraph, engine, constants, threads, options).Run();
  } catch (const dnnl::error& error) {
    return Unimplemented(std::string("CpuAcc: oneDNN: ") + error.what());
  } catch (const std::exception& error) {
    return Internal(std::string("CpuAcc: compiling a run of layers: ") + error.what());
  }
}

SubgraphDesc SingleLayer(const OperatorDesc& op, std::vector<std::size_t>* input_indices) {
  SubgraphDesc graph;
  graph.layers.push_back(op);
  std::vector<std::string> inputs, outputs;
  input_indices->clear();
  for (std::size_t k = 0; k < op.inputs.size(); ++k) {
    const std::string name = "in" + std::to_string(k);
    if (!HasInput(op, k)) {
      inputs.emplace_back();
      continue;
    }
    inputs.push_back(name);
    if (!IsConstant(op, k)) {
      graph.inputs.push_back(name);
      graph.input_infos.push_back(op.inputs[k]);
      input_indices->push_back(k);
    }
  }
  for (std::size_t k = 0; k < op.outputs.size(); ++k) {
    outputs.push_back("out" + std::to_string(k));
    graph.outputs.push_back(outputs.back());
    graph.output_infos.push_back(op.outputs[k]);
  }
  graph.layer_inputs.push_back(std::move(inputs));
  graph.layer_outputs.push_back(std::move(outputs));
  return graph;
}

}  // namespace backplane::cpu_acc
