#include "batch_catalogue.hpp"

#include <algorithm>
#include <functional>
#include <numeric>
#include <optional>
#include <random>

#include "model_builder.hpp"

namespace backplane::testing {
namespace {

int64_t ElementCountOf(const std::vector<int64_t>& dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<>());
}

// Builds the catalogue's models, each from a fresh ModelBuilder, with dimensions drawn from one
// seeded sequence.
class Catalogue {
 public:
  explicit Catalogue(uint64_t seed) : random_(seed) {}

  std::vector<BatchCase> Generate() {
    for (int round = 0; round < 2; ++round) {
      Elementwise();
      Activations();
      Softmax();
      Gemm();
      MatMul();
      Windows();
      BatchNormalization();
      Flatten();
      Reshape();
      Transpose();
      Concat();
      Pad();
      Quantization();
      ConstantNode();
      Chains();
    }
    OldOpsetSoftmax();
    UnbatchedOutput();
    return std::move(cases_);
  }

 private:
  int64_t Uniform(int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(random_);
  }
  bool Coin() { return Uniform(0, 1) == 1; }
  // `count` dimensions of 2..4.
  std::vector<int64_t> Dims(std::size_t count) {
    std::vector<int64_t> dims(count);
    for (auto& dim : dims)
      dim = Uniform(2, 4);
    return dims;
  }
  static std::vector<int64_t> Batched(std::vector<int64_t> dims) {
    dims.insert(dims.begin(), -1);
    return dims;
  }
  // Values 0.3 apart around `start`, never 0 (they divide).
  static std::vector<float> Values(int64_t count, float start = 0.5f) {
    std::vector<float> values(static_cast<std::size_t>(count));
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] = start + 0.3f * static_cast<float>(static_cast<int>(i % 7) - 3);
      if (values[i] == 0.0f)
        values[i] = 0.125f;
    }
    return values;
  }
  void Weight(ModelBuilder& model, const std::string& name, const std::vector<int64_t>& dims,
              float start = 0.5f) {
    model.FloatInitializer(name, dims, Values(ElementCountOf(dims), start));
  }

  // A case whose graph inputs are `inputs` (name and the dims after the batch) and whose
  // output is "y": safe when `refused` is empty.
  void Record(const std::string& what, const std::string& op_type, ModelBuilder& model,
              const std::vector<std::pair<std::string, std::vector<int64_t>>>& inputs,
              std::string refused = {}, std::string reason = {}) {
    BatchCase added{.name = what + "_" + std::to_string(cases_.size()),
                    .op_type = op_type,
                    .model = {},
                    .inputs = {},
                    .refused = std::move(refused),
                    .reason = std::move(reason)};
    for (const auto& [name, dims] : inputs)
      added.inputs.emplace_back(name, dims);
    model.OutputNoShape("y");
    added.model = model.Serialize();
    cases_.push_back(std::move(added));
  }
  // One graph input "x" of the batch with `dims` after it.
  static ModelBuilder WithInput(const std::vector<int64_t>& dims) {
    ModelBuilder model;
    model.Input("x", Batched(dims));
    return model;
  }

  void Elementwise() {
    for (const std::string op : {"Add", "Sub", "Mul", "Div"}) {
      const std::vector<int64_t> dims = Dims(static_cast<std::size_t>(Uniform(1, 2)));
      // A constant that broadcasts over the batch: a lower rank, or dimension 0 of 1.
      {
        std::vector<int64_t> constant(dims.begin() + Uniform(0, 1), dims.end());
        if (constant.size() == dims.size() && Coin())
          constant.insert(constant.begin(), 1);
        ModelBuilder model = WithInput(dims);
        Weight(model, "c", constant);
        if (Coin())
          model.Node(op, {"x", "c"}, {"y"}, "e");
        else
          model.Node(op, {"c", "x"}, {"y"}, "e");
        Record(op + "_const", op, model, {{"x", Batched(dims)}});
      }
      {  // Two inputs of the batch.
        ModelBuilder model = WithInput(dims);
        model.Input("x2", Batched(dims));
        model.Node(op, {"x", "x2"}, {"y"}, "e");
        Record(op + "_two_inputs", op, model, {{"x", Batched(dims)}, {"x2", Batched(dims)}});
      }
      {  // A constant with rows of its own: row r meets row r.
        std::vector<int64_t> constant = dims;
        constant.insert(constant.begin(), Uniform(2, 4));
        ModelBuilder model = WithInput(dims);
        Weight(model, "c", constant);
        model.Node(op, {"x", "c"}, {"y"}, "e");
        Record(op + "_rows_of_const", op, model, {{"x", Batched(dims)}}, "node 'e' (" + op + ")",
               "input 1 ('c') of shape [" + std::to_string(constant[0]));
      }
      {  // The batch of a lower rank than the result: it lands on dimension 1.
        ModelBuilder model = WithInput({});
        Weight(model, "c", {Uniform(2, 4), 1});
        model.Node(op, {"x", "c"}, {"y"}, "e");
        Record(op + "_batch_broadcast", op, model, {{"x", Batched({})}}, "node 'e' (" + op + ")",
               "its batch dimension would land on dimension 1");
      }
    }
  }

  void Activations() {
    for (const std::string op : {"Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
                                 "Identity", "Clip", "Dropout"}) {
      const std::vector<int64_t> dims = Dims(static_cast<std::size_t>(Uniform(1, 3)));
      ModelBuilder model = WithInput(dims);
      if (op == "Clip") {
        model.FloatInitializer("low", {}, {-0.25f});
        model.FloatInitializer("high", {}, {0.5f});
        model.Node(op, {"x", "low", "high"}, {"y"}, "a");
      } else {
        auto& node = model.Node(op, {"x"}, {"y"}, "a");
        if (op == "LeakyRelu")
          SetFloat(node, "alpha", 0.1f);
      }
      Record(op, op, model, {{"x", Batched(dims)}});
    }
    // Dropout's ratio from the batch: a parameter every row would share.
    const std::vector<int64_t> dims = Dims(1);
    ModelBuilder model = WithInput(dims);
    model.Input("ratio", {-1});
    model.Node("Dropout", {"x", "ratio"}, {"y"}, "d");
    Record("Dropout_batched_ratio", "Dropout", model, {{"x", Batched(dims)}, {"ratio", {-1}}},
           "node 'd' (Dropout)", "input 1 ('ratio') carries the batch dimension");
  }

  void Softmax() {
    const auto rank = static_cast<int64_t>(Uniform(1, 3));  // after the batch
    const std::vector<int64_t> dims = Dims(static_cast<std::size_t>(rank));
    const int64_t total = rank + 1;
    {
      const int64_t axis = Uniform(1, rank);
      ModelBuilder model = WithInput(dims);
      SetInt(model.Node("Softmax", {"x"}, {"y"}, "sm"), "axis", Coin() ? axis : axis - total);
      Record("Softmax_axis", "Softmax", model, {{"x", Batched(dims)}});
    }
    {
      ModelBuilder model = WithInput(dims);
      SetInt(model.Node("Softmax", {"x"}, {"y"}, "sm"), "axis", Coin() ? 0 : -total);
      Record("Softmax_axis0", "Softmax", model, {{"x", Batched(dims)}}, "node 'sm' (Softmax)",
             "normalises over axis 0, the batch dimension: rows of different requests would mix");
    }
    {  // Rank 1: the default axis -1 is the batch.
      ModelBuilder model = WithInput({});
      model.Node("Softmax", {"x"}, {"y"}, "sm");
      Record("Softmax_vector", "Softmax", model, {{"x", Batched({})}}, "node 'sm' (Softmax)",
             "normalises over axis 0");
    }
  }

  void Gemm() {
    const int64_t k = Uniform(2, 5);
    const int64_t n = Uniform(2, 5);
    {
      ModelBuilder model = WithInput({k});
      const bool trans_b = Coin();
      Weight(model, "w", trans_b ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n});
      std::vector<std::string> inputs = {"x", "w"};
      if (Coin()) {
        Weight(model, "bias", Coin() ? std::vector<int64_t>{n} : std::vector<int64_t>{1, n});
        inputs.push_back("bias");
      }
      auto& node = model.Node("Gemm", inputs, {"y"}, "g");
      SetInt(node, "transB", trans_b ? 1 : 0);
      SetFloat(node, "alpha", 0.5f);
      Record("Gemm", "Gemm", model, {{"x", Batched({k})}});
    }
    {  // transA: the batch becomes the dimension summed over.
      ModelBuilder model = WithInput({k});
      Weight(model, "w", {Uniform(2, 4), n});
      SetInt(model.Node("Gemm", {"x", "w"}, {"y"}, "g"), "transA", 1);
      Record("Gemm_transA", "Gemm", model, {{"x", Batched({k})}}, "node 'g' (Gemm)",
             "transposes A (transA=1)");
    }
    {  // The batch in B.
      ModelBuilder model = WithInput({n});
      Weight(model, "a", {Uniform(2, 4), Uniform(2, 4)});
      model.Node("Gemm", {"a", "x"}, {"y"}, "g");
      Record("Gemm_batch_in_B", "Gemm", model, {{"x", Batched({n})}}, "node 'g' (Gemm)",
             "multiplies by input 1 ('x') (B), which carries the batch dimension");
    }
    {  // A C with rows of its own.
      ModelBuilder model = WithInput({k});
      Weight(model, "w", {k, n});
      const int64_t rows = Uniform(2, 4);
      Weight(model, "bias", {rows, n});
      model.Node("Gemm", {"x", "w", "bias"}, {"y"}, "g");
      Record("Gemm_rows_of_C", "Gemm", model, {{"x", Batched({k})}}, "node 'g' (Gemm)",
             "adds input 2 ('bias') (C) of shape [" + std::to_string(rows));
    }
  }

  void MatMul() {
    const int64_t s = Uniform(2, 3);
    const int64_t k = Uniform(2, 4);
    const int64_t n = Uniform(2, 4);
    const auto safe = [&](const std::string& what, std::vector<int64_t> x, std::vector<int64_t> w) {
      ModelBuilder model = WithInput(x);
      Weight(model, "w", w);
      model.Node("MatMul", {"x", "w"}, {"y"}, "mm");
      Record(what, "MatMul", model, {{"x", Batched(x)}});
    };
    safe("MatMul_2d", {k}, {k, n});
    safe("MatMul_3d", {s, k}, {k, n});
    safe("MatMul_3d_broadcast", {s, k}, {1, k, n});
    safe("MatMul_vector_weight", {s, k}, {k});
    {  // A weight times the batch's matrices: W x B[r].
      ModelBuilder model = WithInput({k, n});
      Weight(model, "w", {s, k});
      model.Node("MatMul", {"w", "x"}, {"y"}, "mm");
      Record("MatMul_weight_times_batch", "MatMul", model, {{"x", Batched({k, n})}});
    }
    {  // The batch in both: A[r] x B[r].
      ModelBuilder model = WithInput({s, k});
      model.Input("x2", Batched({k, n}));
      model.Node("MatMul", {"x", "x2"}, {"y"}, "mm");
      Record("MatMul_both_batched", "MatMul", model,
             {{"x", Batched({s, k})}, {"x2", Batched({k, n})}});
    }
    const auto unsafe = [&](const std::string& what, std::vector<int64_t> x, std::vector<int64_t> w,
                            bool x_is_b, const std::string& reason) {
      ModelBuilder model = WithInput(x);
      Weight(model, "w", w);
      model.Node("MatMul",
                 x_is_b ? std::vector<std::string>{"w", "x"} : std::vector<std::string>{"x", "w"},
                 {"y"}, "mm");
      Record(what, "MatMul", model, {{"x", Batched(x)}}, "node 'mm' (MatMul)", reason);
    };
    unsafe("MatMul_batch_in_B", {n}, {Uniform(2, 4), Uniform(2, 4)}, true,
           "multiplies by input 1 ('x') of shape [?," + std::to_string(n) +
               "], a matrix or vector that carries the batch dimension");
    unsafe("MatMul_rows_of_A", {k, n}, {Uniform(2, 4), s, k}, true, "input 0 ('w') of shape [");
    unsafe("MatMul_batch_as_vector", {}, {Uniform(2, 4), n}, false, "as a vector");
    unsafe("MatMul_rows_of_B", {s, k}, {Uniform(2, 4), k, n}, false,
           "along dimension 0, the batch");
    unsafe("MatMul_higher_rank_B", {k}, {Uniform(2, 4), k, n}, false,
           "whose leading dimensions go before the batch");
  }

  void Windows() {
    const int64_t c = Uniform(1, 3);
    const std::vector<int64_t> image = {c, Uniform(4, 6), Uniform(4, 6)};
    {
      ModelBuilder model = WithInput(image);
      const int64_t f = Uniform(1, 3);
      Weight(model, "w", {f, c, 3, 3}, -0.5f);
      Weight(model, "b", {f});
      auto& node = model.Node("Conv", {"x", "w", "b"}, {"y"}, "conv");
      SetInts(node, "pads", {1, 1, 1, 1});
      Record("Conv", "Conv", model, {{"x", Batched(image)}});
    }
    {  // The batch as the filters: every request's rows filter every image.
      ModelBuilder model = WithInput({c, 2, 2});
      Weight(model, "image", {1, c, 5, 5});
      model.Node("Conv", {"image", "x"}, {"y"}, "conv");
      Record("Conv_batch_as_filters", "Conv", model, {{"x", Batched({c, 2, 2})}},
             "node 'conv' (Conv)", "input 1 ('x') carries the batch dimension");
    }
    for (const std::string op : {"MaxPool", "AveragePool"}) {
      ModelBuilder model = WithInput(image);
      auto& node = model.Node(op, {"x"}, {"y"}, "pool");
      SetInts(node, "kernel_shape", {2, 2});
      if (Coin())
        SetInts(node, "strides", {2, 2});
      Record(op, op, model, {{"x", Batched(image)}});
    }
    for (const std::string op : {"GlobalAveragePool", "GlobalMaxPool"}) {
      ModelBuilder model = WithInput(image);
      model.Node(op, {"x"}, {"y"}, "pool");
      Record(op, op, model, {{"x", Batched(image)}});
    }
  }

  void BatchNormalization() {
    const int64_t c = Uniform(1, 4);
    const std::vector<int64_t> dims = {c, Uniform(2, 3), Uniform(2, 3)};
    {
      ModelBuilder model = WithInput(dims);
      Weight(model, "scale", {c});
      Weight(model, "bias", {c});
      Weight(model, "mean", {c});
      Weight(model, "var", {c}, 2.0f);
      model.Node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"y"}, "bn");
      Record("BatchNormalization", "BatchNormalization", model, {{"x", Batched(dims)}});
    }
    {  // The scale from the batch.
      ModelBuilder model = WithInput({c});
      model.Input("s", {-1});
      Weight(model, "bias", {c});
      Weight(model, "mean", {c});
      Weight(model, "var", {c}, 2.0f);
      model.Node("BatchNormalization", {"x", "s", "bias", "mean", "var"}, {"y"}, "bn");
      Record("BatchNormalization_batched_scale", "BatchNormalization", model,
             {{"x", Batched({c})}, {"s", {-1}}}, "node 'bn' (BatchNormalization)",
             "input 1 ('s') carries the batch dimension");
    }
  }

  void Flatten() {
    const std::vector<int64_t> dims = Dims(3);
    {
      ModelBuilder model = WithInput(dims);
      SetInt(model.Node("Flatten", {"x"}, {"y"}, "f"), "axis", Coin() ? 1 : -3);
      Record("Flatten_axis1", "Flatten", model, {{"x", Batched(dims)}});
    }
    {  // Axis 2 past a dimension of 1: still the batch.
      const std::vector<int64_t> one = {1, dims[1], dims[2]};
      ModelBuilder model = WithInput(one);
      SetInt(model.Node("Flatten", {"x"}, {"y"}, "f"), "axis", 2);
      Record("Flatten_past_one", "Flatten", model, {{"x", Batched(one)}});
    }
    {
      ModelBuilder model = WithInput(dims);
      SetInt(model.Node("Flatten", {"x"}, {"y"}, "f"), "axis", Coin() ? 0 : -4);
      Record("Flatten_axis0", "Flatten", model, {{"x", Batched(dims)}}, "node 'f' (Flatten)",
             "flattens with axis 0");
    }
    {
      ModelBuilder model = WithInput(dims);
      SetInt(model.Node("Flatten", {"x"}, {"y"}, "f"), "axis", Uniform(2, 3));
      Record("Flatten_merges_batch", "Flatten", model, {{"x", Batched(dims)}}, "node 'f' (Flatten)",
             "merges the batch dimension with dimension 1");
    }
  }

  void Reshape() {
    const std::vector<int64_t> dims = Dims(2);
    const int64_t a = dims[0];
    const int64_t b = dims[1];
    const auto reshape = [&](const std::string& what, std::vector<int64_t> target,
                             std::string reason = {}) {
      ModelBuilder model = WithInput(dims);
      model.Int64Initializer("shape", {static_cast<int64_t>(target.size())}, target);
      model.Node("Reshape", {"x", "shape"}, {"y"}, "r");
      Record(what, "Reshape", model, {{"x", Batched(dims)}},
             reason.empty() ? std::string() : "node 'r' (Reshape)", reason);
    };
    const std::vector<std::vector<int64_t>> safe = {
        {0, -1}, {-1, a * b}, {0, b, a}, {-1, b, a}, {0, 0, b}, {-1, 0, b}, {0, a * b, 1}};
    reshape("Reshape_keeps_batch", safe[static_cast<std::size_t>(Uniform(0, 6))]);
    reshape("Reshape_keeps_batch", safe[static_cast<std::size_t>(Uniform(0, 6))]);
    reshape("Reshape_fixed_first", {a, -1}, "dimension 0 of its output would not be the batch");
    reshape("Reshape_one_first", {1, -1}, "dimension 0 of its output would not be the batch");
    reshape("Reshape_part_of_row", {-1, b},
            "hold " + std::to_string(b) + " elements where a row has " + std::to_string(a * b));
  }

  void Transpose() {
    const auto rank = static_cast<std::size_t>(Uniform(1, 3));  // after the batch
    const std::vector<int64_t> dims = Dims(rank);
    std::vector<int64_t> perm(rank + 1);
    std::iota(perm.begin(), perm.end(), 0);
    {
      std::shuffle(perm.begin() + 1, perm.end(), random_);
      ModelBuilder model = WithInput(dims);
      SetInts(model.Node("Transpose", {"x"}, {"y"}, "t"), "perm", perm);
      Record("Transpose_keeps_batch", "Transpose", model, {{"x", Batched(dims)}});
    }
    {
      do {
        std::shuffle(perm.begin(), perm.end(), random_);
      } while (perm[0] == 0);
      ModelBuilder model = WithInput(dims);
      SetInts(model.Node("Transpose", {"x"}, {"y"}, "t"), "perm", perm);
      Record("Transpose_moves_batch", "Transpose", model, {{"x", Batched(dims)}},
             "node 't' (Transpose)", "moves the batch dimension");
    }
    {  // No perm: reversed, the batch last.
      ModelBuilder model = WithInput(dims);
      model.Node("Transpose", {"x"}, {"y"}, "t");
      Record("Transpose_reversed", "Transpose", model, {{"x", Batched(dims)}},
             "node 't' (Transpose)",
             "moves the batch dimension to dimension " + std::to_string(rank));
    }
  }

  void Concat() {
    const std::vector<int64_t> dims = Dims(static_cast<std::size_t>(Uniform(1, 2)));
    const auto rank = static_cast<int64_t>(dims.size()) + 1;
    {
      ModelBuilder model = WithInput(dims);
      model.Input("x2", Batched(dims));
      const int64_t axis = Uniform(1, rank - 1);
      SetInt(model.Node("Concat", {"x", "x2", "x"}, {"y"}, "cat"), "axis",
             Coin() ? axis : axis - rank);
      Record("Concat", "Concat", model, {{"x", Batched(dims)}, {"x2", Batched(dims)}});
    }
    {
      ModelBuilder model = WithInput(dims);
      model.Input("x2", Batched(dims));
      SetInt(model.Node("Concat", {"x", "x2"}, {"y"}, "cat"), "axis", Coin() ? 0 : -rank);
      Record("Concat_axis0", "Concat", model, {{"x", Batched(dims)}, {"x2", Batched(dims)}},
             "node 'cat' (Concat)", "concatenates along axis 0, the batch dimension");
    }
    {  // A constant beside the batch: its rows meet the batch's by position.
      ModelBuilder model = WithInput(dims);
      std::vector<int64_t> constant = dims;
      constant.insert(constant.begin(), Uniform(1, 3));
      Weight(model, "c", constant);
      SetInt(model.Node("Concat", {"x", "c"}, {"y"}, "cat"), "axis", rank - 1);
      Record("Concat_constant", "Concat", model, {{"x", Batched(dims)}}, "node 'cat' (Concat)",
             "joins input 1 ('c'), which does not carry the batch dimension");
    }
  }

  void Pad() {
    const std::vector<int64_t> dims = Dims(2);
    const auto pad = [&](const std::string& what, std::vector<int64_t> pads,
                         std::string reason = {}) {
      ModelBuilder model = WithInput(dims);
      model.Int64Initializer("pads", {6}, pads);
      model.FloatInitializer("value", {}, {0.75f});
      model.Node("Pad", {"x", "pads", "value"}, {"y"}, "p");
      Record(what, "Pad", model, {{"x", Batched(dims)}},
             reason.empty() ? std::string() : "node 'p' (Pad)", reason);
    };
    pad("Pad", {0, Uniform(0, 2), Uniform(0, 2), 0, Uniform(0, 2), Uniform(1, 2)});
    pad("Pad_batch", {Uniform(0, 1), 0, 0, Uniform(1, 2), 0, 0}, "pads axis 0, the batch");
  }

  // x → QuantizeLinear → DequantizeLinear → y, float at both ends, per tensor or per axis: safe
  // away from axis 0, where each row would get its own scale.
  void Quantization() {
    const std::vector<int64_t> dims = Dims(2);
    const auto qdq = [&](const std::string& what, std::optional<int64_t> axis,
                         std::string reason = {}) {
      ModelBuilder model = WithInput(dims);
      // The scale's length: one, or the batch's dimension at axis 0 (as a model quantized with
      // a fixed batch has it), or the axis's dimension.
      const int64_t length = !axis ? 1 : *axis == 0 ? Uniform(2, 3) : dims[*axis - 1];
      const std::vector<int64_t> shape =
          axis ? std::vector<int64_t>{length} : std::vector<int64_t>{};
      model.FloatInitializer("scale", shape, std::vector<float>(length, 0.25f));
      model.QuantizedInitializer("zero", shape, onnx::TensorProto::INT8,
                                 std::vector<int32_t>(length, -3));
      auto& quantize = model.Node("QuantizeLinear", {"x", "scale", "zero"}, {"q"}, "quant");
      auto& dequantize = model.Node("DequantizeLinear", {"q", "scale", "zero"}, {"y"}, "dequant");
      if (axis) {
        const int64_t given = Coin() ? *axis : *axis - 3;  // rank 3: negative axes too
        SetInt(quantize, "axis", given);
        SetInt(dequantize, "axis", given);
      }
      Record(what, "QuantizeLinear", model, {{"x", Batched(dims)}},
             reason.empty() ? std::string() : "node 'quant' (QuantizeLinear)", reason);
    };
    qdq("QuantizeLinear_per_tensor", std::nullopt);
    qdq("QuantizeLinear_per_axis", Uniform(1, 2));
    qdq("QuantizeLinear_axis0", 0, "per index of axis 0, the batch dimension");
  }

  // A Constant node (folded at import) as an operand: as any constant.
  void ConstantNode() {
    const std::vector<int64_t> dims = Dims(1);
    for (const int64_t rows : {int64_t{1}, Uniform(2, 3)}) {
      ModelBuilder model = WithInput(dims);
      auto& node = model.Node("Constant", {}, {"c"}, "const");
      auto* attribute = node.add_attribute();
      attribute->set_name("value");
      attribute->set_type(onnx::AttributeProto::TENSOR);
      auto* tensor = attribute->mutable_t();
      tensor->set_data_type(onnx::TensorProto::FLOAT);
      tensor->add_dims(rows);
      tensor->add_dims(dims[0]);
      for (float value : Values(rows * dims[0]))
        tensor->add_float_data(value);
      model.Node("Mul", {"x", "c"}, {"y"}, "m");
      if (rows == 1)
        Record("Constant", "Constant", model, {{"x", Batched(dims)}});
      else
        Record("Constant_rows", "Constant", model, {{"x", Batched(dims)}}, "node 'm' (Mul)",
               "along dimension 0, the batch");
    }
  }

  // A random chain of safe nodes over [N, F]; and the same chain with one unsafe node spliced in
  // at a random place, which the refusal must name.
  void Chains() {
    for (int chain = 0; chain < 3; ++chain) {
      const int64_t features = Uniform(2, 5);
      const auto length = static_cast<std::size_t>(Uniform(2, 5));
      const auto spliced_at = static_cast<std::size_t>(Uniform(0, static_cast<int64_t>(length)));
      const int64_t unsafe_kind = Uniform(0, 3);
      std::vector<int64_t> kinds(length);
      for (auto& kind : kinds)
        kind = Uniform(0, 5);
      for (const bool spoiled : {false, true}) {
        ModelBuilder model = WithInput({features});
        int64_t width = features;
        std::string value = "x";
        std::string refused;
        std::string reason;
        for (std::size_t step = 0; step <= length; ++step) {
          const std::string name = "n" + std::to_string(step);
          const std::string out = step == length ? "y" : "v" + std::to_string(step);
          if (spoiled && step == spliced_at) {
            const std::string bad = "bad";
            const std::string bad_out = "bad_out";
            if (unsafe_kind == 0) {
              SetInt(model.Node("Softmax", {value}, {bad_out}, bad), "axis", 0);
              refused = "node 'bad' (Softmax)";
              reason = "normalises over axis 0";
            } else if (unsafe_kind == 1) {
              SetInts(model.Node("Transpose", {value}, {"bad_t"}, bad), "perm", {1, 0});
              SetInts(model.Node("Transpose", {"bad_t"}, {bad_out}, "back"), "perm", {1, 0});
              refused = "node 'bad' (Transpose)";
              reason = "moves the batch dimension to dimension 1";
            } else if (unsafe_kind == 2) {
              model.Int64Initializer("bad_shape", {2}, {-1, 2 * width});
              model.Int64Initializer("back_shape", {2}, {-1, width});
              model.Node("Reshape", {value, "bad_shape"}, {"bad_r"}, bad);
              model.Node("Reshape", {"bad_r", "back_shape"}, {bad_out}, "back");
              refused = "node 'bad' (Reshape)";
              reason = "where a row has " + std::to_string(width);
            } else {
              SetInt(model.Node("Concat", {value, value}, {"bad_c"}, bad), "axis", 0);
              model.Node("Add", {"bad_c", "bad_c"}, {bad_out}, "after");
              refused = "node 'bad' (Concat)";
              reason = "along axis 0";
            }
            value = bad_out;
          }
          if (step == length) {
            model.Node("Identity", {value}, {"y"}, name);
            break;
          }
          switch (kinds[step]) {
            case 0:
              model.Node("Relu", {value}, {out}, name);
              break;
            case 1: {
              const int64_t next = Uniform(2, 5);
              Weight(model, name + "_w", {width, next}, -0.75f);
              Weight(model, name + "_b", {next});
              model.Node("Gemm", {value, name + "_w", name + "_b"}, {out}, name);
              width = next;
              break;
            }
            case 2:
              SetInt(model.Node("Softmax", {value}, {out}, name), "axis", 1);
              break;
            case 3:
              Weight(model, name + "_c", {width});
              model.Node("Add", {value, name + "_c"}, {out}, name);
              break;
            case 4: {
              model.Int64Initializer(name + "_shape", {3}, {0, 1, width});
              model.Int64Initializer(name + "_back", {2}, {-1, width});
              model.Node("Reshape", {value, name + "_shape"}, {name + "_3d"}, name);
              model.Node("Reshape", {name + "_3d", name + "_back"}, {out}, name + "_back");
              break;
            }
            default:
              model.Node("Tanh", {value}, {out}, name);
              break;
          }
          value = out;
        }
        Record(spoiled ? "chain_spoiled" : "chain", "chain", model, {{"x", Batched({features})}},
               refused, reason);
      }
    }
  }

  // Softmax before opset 13 normalises over every axis from `axis` on; import rewrites it as
  // Flatten, Softmax, Reshape back ([-1, the row's dims]), which must still count as safe.
  void OldOpsetSoftmax() {
    const std::vector<int64_t> dims = Dims(2);
    for (const int64_t axis : {int64_t{1}, int64_t{0}}) {
      ModelBuilder model = WithInput(dims);
      model.proto().mutable_opset_import(0)->set_version(11);
      SetInt(model.Node("Softmax", {"x"}, {"y"}, "sm"), "axis", axis);
      if (axis == 1)
        Record("Softmax_opset11", "Softmax", model, {{"x", Batched(dims)}});
      else
        Record("Softmax_opset11_axis0", "Softmax", model, {{"x", Batched(dims)}},
               "node 'sm/flatten' (Flatten)", "flattens with axis 0");
    }
  }

  // An output computed from constants alone cannot be split back into requests.
  void UnbatchedOutput() {
    ModelBuilder model = WithInput({2});
    Weight(model, "c", {1, 2});
    model.Node("Relu", {"x"}, {"unused"}, "r");
    model.Node("Relu", {"c"}, {"y"}, "constant_relu");
    Record("unbatched_output", "Relu", model, {{"x", Batched({2})}}, "graph output 'y'",
           "does not carry the batch dimension");
  }

  std::mt19937_64 random_;
  std::vector<BatchCase> cases_;
};

}  // namespace

std::vector<BatchCase> GenerateBatchCatalogue(uint64_t seed) {
  return Catalogue(seed).Generate();
}

}  // namespace backplane::testing
