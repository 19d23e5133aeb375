// CpuAcc against CpuRef on random configurations of every op CpuAcc claims (fixed seeds), one
// workload per layer on each backend; and random chains compiled whole by CpuAcc
// (CompileSubgraph, called directly: the host does not call it yet) against CpuRef layer by layer.
#include <algorithm>
#include <functional>
#include <iostream>
#include <numeric>

#include "batch_split.hpp"
#include "cpu_acc_test_util.hpp"

namespace backplane::cpu_acc_test {
namespace {

using Ints = std::vector<int64_t>;
using Rng = std::mt19937;

int Uniform(Rng& rng, int low, int high) {
  return std::uniform_int_distribution<int>(low, high)(rng);
}
bool Chance(Rng& rng, double p) {
  return std::bernoulli_distribution(p)(rng);
}
template <typename T>
T Pick(Rng& rng, std::initializer_list<T> values) {
  return *(values.begin() + Uniform(rng, 0, static_cast<int>(values.size()) - 1));
}

FloatTensor RandomTensor(const Shape& shape, Rng& rng, float low = -1.0f, float high = 1.0f) {
  std::uniform_real_distribution<float> value(low, high);
  FloatTensor tensor{shape, std::vector<float>(static_cast<std::size_t>(ElementCount(shape)))};
  for (float& v : tensor.values)
    v = value(rng);
  return tensor;
}

// A data input of the graph: constant or not, at random.
std::string DataInput(TestGraph& graph, const std::string& name, const Shape& shape, Rng& rng,
                      double constant_chance) {
  if (Chance(rng, constant_chance))
    graph.AddConstant(name, RandomTensor(shape, rng));
  else
    graph.SetInput(name, RandomTensor(shape, rng));
  return name;
}

int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// ONNX's output size of a window (independent of both backends' code).
struct WindowSpec {
  std::string auto_pad = "NOTSET";
  Ints kernel, strides, dilations, pads;
  bool ceil_mode = false;
};

std::optional<Ints> WindowOutput(const WindowSpec& w, const Ints& in) {
  const std::size_t rank = in.size();
  Ints out;
  for (std::size_t d = 0; d < rank; ++d) {
    const int64_t extent = (w.kernel[d] - 1) * w.dilations[d] + 1;
    const int64_t stride = w.strides[d];
    if (w.auto_pad == "SAME_UPPER" || w.auto_pad == "SAME_LOWER") {
      out.push_back(CeilDiv(in[d], stride));
      continue;
    }
    const int64_t padded =
        in[d] + (w.auto_pad == "NOTSET" ? w.pads[d] + w.pads[d + rank] : 0) - extent;
    if (padded < 0)
      return std::nullopt;
    int64_t size = (w.ceil_mode ? CeilDiv(padded, stride) : padded / stride) + 1;
    if (w.ceil_mode && (size - 1) * stride >= in[d] + (w.auto_pad == "NOTSET" ? w.pads[d] : 0))
      --size;
    out.push_back(size);
  }
  return out;
}

// A random window over `rank` spatial dims; `kernel` given for Conv (W's dims).
WindowSpec RandomWindow(Rng& rng, std::size_t rank, const Ints& kernel, bool pool) {
  WindowSpec w;
  w.auto_pad =
      Chance(rng, 0.7) ? "NOTSET" : Pick<std::string>(rng, {"SAME_UPPER", "SAME_LOWER", "VALID"});
  for (std::size_t d = 0; d < rank; ++d) {
    w.kernel.push_back(kernel.empty() ? Uniform(rng, 1, 4) : kernel[d]);
    w.strides.push_back(Chance(rng, 0.5) ? 1 : Uniform(rng, 2, 3));
    w.dilations.push_back(Chance(rng, 0.7) ? 1 : 2);
  }
  w.pads.assign(2 * rank, 0);
  if (w.auto_pad == "NOTSET") {
    for (std::size_t d = 0; d < 2 * rank; ++d) {
      const int64_t k = w.kernel[d % rank];
      w.pads[d] = Chance(rng, 0.5) ? 0 : Uniform(rng, 0, static_cast<int>(k - 1));
    }
  }
  w.ceil_mode = pool && Chance(rng, 0.3);
  return w;
}

AttributeMap WindowAttributes(const WindowSpec& w, Rng& rng, bool with_kernel) {
  AttributeMap attributes;
  if (w.auto_pad != "NOTSET" || Chance(rng, 0.2))
    attributes["auto_pad"] = w.auto_pad;
  if (with_kernel || Chance(rng, 0.5))
    attributes["kernel_shape"] = w.kernel;
  if (std::any_of(w.strides.begin(), w.strides.end(), [](int64_t d) { return d != 1; }) ||
      Chance(rng, 0.5))
    attributes["strides"] = w.strides;
  if (std::any_of(w.dilations.begin(), w.dilations.end(), [](int64_t d) { return d != 1; }) ||
      Chance(rng, 0.2))
    attributes["dilations"] = w.dilations;
  if (w.auto_pad == "NOTSET" &&
      (std::any_of(w.pads.begin(), w.pads.end(), [](int64_t p) { return p != 0; }) ||
       Chance(rng, 0.2)))
    attributes["pads"] = w.pads;
  if (w.ceil_mode)
    attributes["ceil_mode"] = int64_t{1};
  return attributes;
}

Ints RandomSpatial(Rng& rng, std::size_t rank) {
  Ints in;
  for (std::size_t d = 0; d < rank; ++d)
    in.push_back(Uniform(rng, 1, rank == 1 ? 20 : (rank == 2 ? 11 : 6)));
  return in;
}

// ---- one random operator per call; false when the draw does not make a valid node ----------

bool MakeConv(TestGraph& g, Rng& rng) {
  const std::size_t rank = Pick<std::size_t>(rng, {1, 2, 2, 2, 3});
  const int64_t group = Chance(rng, 0.6) ? 1 : Uniform(rng, 2, 4);
  const bool depthwise = group > 1 && Chance(rng, 0.5);
  const int64_t c = group * (depthwise ? 1 : Uniform(rng, 1, 3));
  const int64_t m = group * Uniform(rng, 1, 3);
  const int64_t n = Chance(rng, 0.5) ? 1 : Uniform(rng, 2, 3);
  Ints kernel;
  for (std::size_t d = 0; d < rank; ++d)
    kernel.push_back(Uniform(rng, 1, rank == 3 ? 2 : 3));
  WindowSpec w = RandomWindow(rng, rank, kernel, false);
  const Ints in = RandomSpatial(rng, rank);
  auto out = WindowOutput(w, in);
  if (!out)
    return false;
  Shape x{n, c}, wshape{m, c / group}, y{n, m};
  x.insert(x.end(), in.begin(), in.end());
  wshape.insert(wshape.end(), kernel.begin(), kernel.end());
  y.insert(y.end(), out->begin(), out->end());
  std::vector<std::string> inputs{DataInput(g, "X", x, rng, 0.0),
                                  DataInput(g, "W", wshape, rng, 0.6)};
  if (Chance(rng, 0.6))
    inputs.push_back(DataInput(g, "B", {m}, rng, 0.6));
  AttributeMap attributes = WindowAttributes(w, rng, false);
  attributes.erase("ceil_mode");
  if (group > 1 || Chance(rng, 0.2))
    attributes["group"] = group;
  g.AddLayer("Conv", "conv", inputs, {"Y"}, {y}, attributes);
  return true;
}

bool MakePool(TestGraph& g, Rng& rng, const std::string& type) {
  const std::size_t rank = Pick<std::size_t>(rng, {1, 2, 2, 2, 3});
  WindowSpec w = RandomWindow(rng, rank, {}, true);
  const Ints in = RandomSpatial(rng, rank);
  auto out = WindowOutput(w, in);
  if (!out)
    return false;
  const int64_t n = Uniform(rng, 1, 3), c = Uniform(rng, 1, 17);
  Shape x{n, c}, y{n, c};
  x.insert(x.end(), in.begin(), in.end());
  y.insert(y.end(), out->begin(), out->end());
  AttributeMap attributes = WindowAttributes(w, rng, true);
  if (type == "AveragePool" && Chance(rng, 0.5))
    attributes["count_include_pad"] = int64_t{1};
  g.AddLayer(type, "pool", {DataInput(g, "X", x, rng, 0.0)}, {"Y"}, {y}, attributes);
  return true;
}

bool MakeGlobalPool(TestGraph& g, Rng& rng, const std::string& type) {
  const std::size_t rank = Pick<std::size_t>(rng, {1, 2, 3});
  const Ints in = RandomSpatial(rng, rank);
  Shape x{Uniform(rng, 1, 3), Uniform(rng, 1, 20)};
  Shape y = x;
  x.insert(x.end(), in.begin(), in.end());
  y.insert(y.end(), rank, 1);
  g.AddLayer(type, "gpool", {DataInput(g, "X", x, rng, 0.0)}, {"Y"}, {y});
  return true;
}

bool MakeGemm(TestGraph& g, Rng& rng) {
  const int64_t m = Uniform(rng, 1, 33), k = Uniform(rng, 1, 40), n = Uniform(rng, 1, 33);
  const bool ta = Chance(rng, 0.4), tb = Chance(rng, 0.5);
  std::vector<std::string> inputs{DataInput(g, "A", ta ? Shape{k, m} : Shape{m, k}, rng, 0.1),
                                  DataInput(g, "B", tb ? Shape{n, k} : Shape{k, n}, rng, 0.6)};
  if (Chance(rng, 0.7)) {
    const Shape c = Pick<Shape>(
        rng, {Shape{}, Shape{1}, Shape{n}, Shape{1, n}, Shape{m, 1}, Shape{m, n}, Shape{1, 1}});
    inputs.push_back(DataInput(g, "C", c, rng, 0.6));
  }
  AttributeMap attributes;
  if (ta || Chance(rng, 0.2))
    attributes["transA"] = int64_t{ta};
  if (tb || Chance(rng, 0.2))
    attributes["transB"] = int64_t{tb};
  if (Chance(rng, 0.4))
    attributes["alpha"] = Pick<float>(rng, {0.5f, -1.25f, 2.0f, 1.0f});
  if (Chance(rng, 0.4))
    attributes["beta"] = Pick<float>(rng, {0.5f, -1.25f, 2.0f, 0.0f, 1.0f});
  g.AddLayer("Gemm", "gemm", inputs, {"Y"}, {{m, n}}, attributes);
  return true;
}

bool MakeMatMul(TestGraph& g, Rng& rng) {
  const int64_t m = Uniform(rng, 1, 17), k = Uniform(rng, 1, 24), n = Uniform(rng, 1, 17);
  const std::size_t batch_rank = Uniform(rng, 0, 2);
  Shape batch;
  for (std::size_t d = 0; d < batch_rank; ++d)
    batch.push_back(Uniform(rng, 1, 3));
  auto batch_of = [&](Rng& r) {
    Shape own;
    const std::size_t drop = Uniform(r, 0, static_cast<int>(batch.size()));
    for (std::size_t d = drop; d < batch.size(); ++d)
      own.push_back(Chance(r, 0.3) ? 1 : batch[d]);
    return own;
  };
  Shape a = batch_of(rng), b = batch_of(rng);
  const bool a_vector = a.empty() && Chance(rng, 0.2);
  const bool b_vector = b.empty() && Chance(rng, 0.2);
  if (a_vector) {
    a = {k};
  } else {
    a.push_back(m);
    a.push_back(k);
  }
  if (b_vector) {
    b = {k};
  } else {
    b.push_back(k);
    b.push_back(n);
  }
  const Shape a_batch(a.begin(), a.end() - std::min<std::size_t>(a.size(), 2));
  const Shape b_batch(b.begin(), b.end() - std::min<std::size_t>(b.size(), 2));
  Shape y(std::max(a_batch.size(), b_batch.size()));
  for (std::size_t i = 0; i < y.size(); ++i) {
    const int64_t da = i < y.size() - a_batch.size() ? 1 : a_batch[i - (y.size() - a_batch.size())];
    const int64_t db = i < y.size() - b_batch.size() ? 1 : b_batch[i - (y.size() - b_batch.size())];
    y[i] = std::max(da, db);
  }
  if (!a_vector)
    y.push_back(m);
  if (!b_vector)
    y.push_back(n);
  g.AddLayer("MatMul", "matmul", {DataInput(g, "A", a, rng, 0.0), DataInput(g, "B", b, rng, 0.5)},
             {"Y"}, {y});
  return true;
}

Shape RandomShape(Rng& rng, int min_rank, int max_rank, int max_dim) {
  Shape shape(Uniform(rng, min_rank, max_rank));
  for (auto& dim : shape)
    dim = Uniform(rng, 1, max_dim);
  return shape;
}

bool MakeBinary(TestGraph& g, Rng& rng, const std::string& type) {
  const Shape full = RandomShape(rng, 0, 4, 5);
  Shape other;
  const std::size_t rank = Uniform(rng, 0, static_cast<int>(full.size()));
  for (std::size_t d = full.size() - rank; d < full.size(); ++d)
    other.push_back(Chance(rng, 0.4) ? 1 : full[d]);
  const bool swap = Chance(rng, 0.5);
  const std::string a = DataInput(g, "A", swap ? other : full, rng, swap ? 0.3 : 0.0);
  const std::string b = DataInput(g, "B", swap ? full : other, rng, swap ? 0.0 : 0.3);
  g.AddLayer(type, "binary", {a, b}, {"Y"}, {full});
  return true;
}

bool MakeUnary(TestGraph& g, Rng& rng, const std::string& type) {
  const Shape shape = RandomShape(rng, 1, 4, 7);
  // Sigmoid and Tanh saturate: a wider range exercises their tails.
  g.SetInput("X", RandomTensor(shape, rng, -8.0f, 8.0f));
  g.AddLayer(type, "unary", {"X"}, {"Y"}, {shape});
  return true;
}

bool MakeSoftmax(TestGraph& g, Rng& rng) {
  const Shape shape = RandomShape(rng, 1, 4, 9);
  const auto rank = static_cast<int>(shape.size());
  g.SetInput("X", RandomTensor(shape, rng, -10.0f, 10.0f));
  AttributeMap attributes;
  if (Chance(rng, 0.8))
    attributes["axis"] = int64_t{Uniform(rng, -rank, rank - 1)};
  g.AddLayer("Softmax", "softmax", {"X"}, {"Y"}, {shape}, attributes);
  return true;
}

bool MakeBatchNorm(TestGraph& g, Rng& rng) {
  Shape x = RandomShape(rng, 2, 5, 6);
  const int64_t c = x[1];
  const double constant = Chance(rng, 0.5) ? 1.0 : 0.0;
  std::vector<std::string> inputs{DataInput(g, "X", x, rng, 0.0)};
  inputs.push_back(DataInput(g, "scale", {c}, rng, constant));
  inputs.push_back(DataInput(g, "bias", {c}, rng, constant));
  inputs.push_back(DataInput(g, "mean", {c}, rng, constant));
  FloatTensor var = RandomTensor({c}, rng, 0.1f, 2.0f);
  if (constant > 0)
    g.AddConstant("var", std::move(var));
  else
    g.SetInput("var", std::move(var));
  inputs.push_back("var");
  AttributeMap attributes;
  if (Chance(rng, 0.5))
    attributes["epsilon"] = Pick<float>(rng, {1e-5f, 1e-3f, 0.1f});
  g.AddLayer("BatchNormalization", "bn", inputs, {"Y"}, {x}, attributes);
  return true;
}

bool MakeConcat(TestGraph& g, Rng& rng) {
  const Shape base = RandomShape(rng, 1, 4, 5);
  const auto rank = static_cast<int>(base.size());
  const int axis = Uniform(rng, -rank, rank - 1);
  const std::size_t axis_index = axis < 0 ? axis + rank : axis;
  const int count = Uniform(rng, 1, 4);
  std::vector<std::string> inputs;
  Shape y = base;
  y[axis_index] = 0;
  for (int i = 0; i < count; ++i) {
    Shape shape = base;
    shape[axis_index] = Uniform(rng, 1, 4);
    y[axis_index] += shape[axis_index];
    inputs.push_back(DataInput(g, "X" + std::to_string(i), shape, rng, 0.2));
  }
  g.AddLayer("Concat", "concat", inputs, {"Y"}, {y}, {{"axis", int64_t{axis}}});
  return true;
}

bool MakeTranspose(TestGraph& g, Rng& rng) {
  const Shape x = RandomShape(rng, 1, 5, 5);
  Ints perm(x.size());
  std::iota(perm.begin(), perm.end(), 0);
  AttributeMap attributes;
  if (Chance(rng, 0.8)) {
    std::shuffle(perm.begin(), perm.end(), rng);
    attributes["perm"] = perm;
  } else {
    std::reverse(perm.begin(), perm.end());
  }
  Shape y;
  for (int64_t p : perm)
    y.push_back(x[p]);
  g.AddLayer("Transpose", "transpose", {DataInput(g, "X", x, rng, 0.0)}, {"Y"}, {y}, attributes);
  return true;
}

bool MakeLayout(TestGraph& g, Rng& rng, const std::string& type) {
  const Shape x = RandomShape(rng, 1, 4, 5);
  const auto rank = static_cast<int64_t>(x.size());
  g.SetInput("X", RandomTensor(x, rng));
  if (type == "Identity") {
    g.AddLayer(type, "identity", {"X"}, {"Y"}, {x});
  } else if (type == "Flatten") {
    const int64_t axis = Uniform(rng, static_cast<int>(-rank), static_cast<int>(rank));
    const int64_t split = axis < 0 ? axis + rank : axis;
    Shape y{1, 1};
    for (int64_t d = 0; d < rank; ++d)
      y[d < split ? 0 : 1] *= x[d];
    g.AddLayer(type, "flatten", {"X"}, {"Y"}, {y}, {{"axis", axis}});
  } else {
    // A random factorisation of the element count, with a 0 (copy) or a -1 (infer) sometimes.
    int64_t rest = ElementCount(x);
    Shape y;
    while (rest > 1 && y.size() < 4) {
      std::vector<int64_t> divisors;
      for (int64_t d = 1; d <= rest; ++d) {
        if (rest % d == 0)
          divisors.push_back(d);
      }
      const int64_t d = divisors[Uniform(rng, 0, static_cast<int>(divisors.size()) - 1)];
      y.push_back(d);
      rest /= d;
    }
    if (rest > 1 || y.empty())
      y.push_back(rest);
    Ints target = y;
    for (std::size_t i = 0; i < target.size(); ++i) {
      if (i < x.size() && target[i] == x[i] && Chance(rng, 0.3))
        target[i] = 0;
    }
    if (Chance(rng, 0.3))
      target[Uniform(rng, 0, static_cast<int>(target.size()) - 1)] = -1;
    g.AddInt64Constant("shape", target);
    g.AddLayer(type, "reshape", {"X", "shape"}, {"Y"}, {y});
  }
  return true;
}

bool MakeOp(TestGraph& g, Rng& rng, const std::string& type) {
  if (type == "Conv")
    return MakeConv(g, rng);
  if (type == "MaxPool" || type == "AveragePool")
    return MakePool(g, rng, type);
  if (type == "GlobalAveragePool" || type == "GlobalMaxPool")
    return MakeGlobalPool(g, rng, type);
  if (type == "Gemm")
    return MakeGemm(g, rng);
  if (type == "MatMul")
    return MakeMatMul(g, rng);
  if (type == "Add" || type == "Mul")
    return MakeBinary(g, rng, type);
  if (type == "Relu" || type == "Sigmoid" || type == "Tanh")
    return MakeUnary(g, rng, type);
  if (type == "Softmax")
    return MakeSoftmax(g, rng);
  if (type == "BatchNormalization")
    return MakeBatchNorm(g, rng);
  if (type == "Concat")
    return MakeConcat(g, rng);
  if (type == "Transpose")
    return MakeTranspose(g, rng);
  return MakeLayout(g, rng, type);
}

class CpuAccRandomOpTest : public CpuAccTest, public ::testing::WithParamInterface<std::string> {};

// 200 configurations per op (fewer under a sanitizer). A configuration CpuAcc refuses
// (kUnimplemented: it would run on CpuRef) is counted, and most must be accepted.
TEST_P(CpuAccRandomOpTest, MatchesCpuRef) {
  const std::string type = GetParam();
  Rng rng(std::hash<std::string>{}(type) % 100000 + 20261130);
  const int iterations = Iterations(200);
  int ran = 0, refused = 0;
  std::string first_refusal;
  for (int iteration = 0; ran + refused < iterations && iteration < 10 * iterations; ++iteration) {
    TestGraph graph;
    if (!MakeOp(graph, rng, type))
      continue;
    const OperatorDesc& op = graph.layers()[0].op;
    graph.MarkOutput("Y");
    ASSERT_TRUE(cpu_ref().IsSupported(op).ok())
        << "the test made a node CpuRef refuses: " << cpu_ref().IsSupported(op).ToString()
        << graph.Describe();
    Status supported = cpu_acc().IsSupported(op);
    auto expected = graph.RunPerLayer(cpu_ref());
    ASSERT_TRUE(expected.ok()) << expected.error().ToString() << graph.Describe();
    if (supported.ok()) {
      auto actual = graph.RunPerLayer(cpu_acc());
      if (!actual.ok() && actual.error().code() == StatusCode::kUnimplemented) {
        supported = actual.error();  // CreateWorkload may refuse what oneDNN turns down
      } else {
        ASSERT_TRUE(actual.ok()) << actual.error().ToString() << graph.Describe();
        std::string mismatch;
        ASSERT_TRUE(AllClose(actual->at("Y").values, expected->at("Y").values, &mismatch))
            << "case " << iteration << ": " << mismatch << graph.Describe();
        ++ran;
        continue;
      }
    }
    ASSERT_EQ(supported.code(), StatusCode::kUnimplemented) << supported.ToString();
    if (first_refusal.empty())
      first_refusal = supported.message() + graph.Describe();
    ++refused;
  }
  RecordProperty("ran", ran);
  RecordProperty("refused", refused);
  EXPECT_GE(ran, iterations * 3 / 4) << "CpuAcc refused " << refused << " of " << ran + refused
                                     << " configurations, e.g. " << first_refusal;
}

INSTANTIATE_TEST_SUITE_P(Ops, CpuAccRandomOpTest,
                         ::testing::Values("Conv", "MaxPool", "AveragePool", "GlobalAveragePool",
                                           "GlobalMaxPool", "Gemm", "MatMul", "Add", "Mul", "Relu",
                                           "Sigmoid", "Tanh", "Softmax", "BatchNormalization",
                                           "Concat", "Transpose", "Identity", "Flatten", "Reshape"),
                         [](const auto& info) { return info.param; });

// ---- random chains, compiled whole ------------------------------------------------------------

// A CNN-like run: Conv [+BN] [+Add bias] [+activation] [pool] [Conv+Relu] Flatten/Reshape,
// Gemm/MatMul [+Add] [+activation] [Softmax]; sometimes an inner value is an output too.
void MakeCnnChain(TestGraph& g, Rng& rng, bool* expect_fusion) {
  const int64_t n = Chance(rng, 0.5) ? 1 : Uniform(rng, 2, 4);
  const int64_t c = Uniform(rng, 1, 4), h = Uniform(rng, 6, 14), w = Uniform(rng, 6, 14);
  g.AddInput("x", {n, c, h, w}, rng);
  std::string current = "x";
  Shape shape{n, c, h, w};
  int layer = 0;
  auto next_name = [&] { return "v" + std::to_string(layer++); };
  auto add_conv = [&](bool relu) {
    const int64_t m = Uniform(rng, 1, 9);
    const Ints kernel{Uniform(rng, 1, 3), Uniform(rng, 1, 3)};
    WindowSpec spec = RandomWindow(rng, 2, kernel, false);
    auto out = WindowOutput(spec, {shape[2], shape[3]});
    if (!out || (*out)[0] < 2 || (*out)[1] < 2) {
      spec = WindowSpec{"SAME_UPPER", kernel, {1, 1}, {1, 1}, {0, 0, 0, 0}, false};
      out = Ints{shape[2], shape[3]};
    }
    const std::string wname = "W" + std::to_string(layer);
    g.AddConstant(wname, RandomTensor({m, shape[1], kernel[0], kernel[1]}, rng));
    std::vector<std::string> inputs{current, wname};
    if (Chance(rng, 0.6)) {
      g.AddConstant("B" + std::to_string(layer), RandomTensor({m}, rng));
      inputs.push_back("B" + std::to_string(layer));
    }
    AttributeMap attributes = WindowAttributes(spec, rng, false);
    attributes.erase("ceil_mode");
    Shape y{shape[0], m, (*out)[0], (*out)[1]};
    const std::string name = next_name();
    g.AddLayer("Conv", "conv" + name, inputs, {name}, {y}, attributes);
    current = name;
    shape = y;
    if (relu) {
      const std::string r = next_name();
      g.AddLayer("Relu", "relu" + r, {current}, {r}, {shape});
      current = r;
      *expect_fusion = true;
    }
  };
  add_conv(false);
  if (Chance(rng, 0.4)) {
    const int64_t m = shape[1];
    const std::string p = "bn" + std::to_string(layer);
    g.AddConstant(p + "s", RandomTensor({m}, rng));
    g.AddConstant(p + "b", RandomTensor({m}, rng));
    g.AddConstant(p + "m", RandomTensor({m}, rng));
    g.AddConstant(p + "v", RandomTensor({m}, rng, 0.2f, 2.0f));
    const std::string name = next_name();
    g.AddLayer("BatchNormalization", p, {current, p + "s", p + "b", p + "m", p + "v"}, {name},
               {shape});
    current = name;
    *expect_fusion = true;
  }
  if (Chance(rng, 0.5)) {
    const Shape bias = Pick<Shape>(
        rng, {Shape{shape[1], 1, 1}, Shape{1, shape[1], 1, 1}, Shape{1}, Shape{shape[1], 1, 1}});
    const std::string cname = "addc" + std::to_string(layer);
    g.AddConstant(cname, RandomTensor(bias, rng));
    const std::string name = next_name();
    if (Chance(rng, 0.5))
      g.AddLayer("Add", "add" + name, {current, cname}, {name}, {shape});
    else
      g.AddLayer("Add", "add" + name, {cname, current}, {name}, {shape});
    current = name;
  }
  if (Chance(rng, 0.7)) {
    const std::string type = Pick<std::string>(rng, {"Relu", "Relu", "Sigmoid", "Tanh"});
    const std::string name = next_name();
    g.AddLayer(type, "act" + name, {current}, {name}, {shape});
    current = name;
  }
  if (Chance(rng, 0.2))
    g.MarkOutput(current);  // an inner output: written out, and not fused past
  if (Chance(rng, 0.6)) {
    const std::string type =
        Pick<std::string>(rng, {"MaxPool", "AveragePool", "GlobalAveragePool"});
    const std::string name = next_name();
    if (type == "GlobalAveragePool") {
      const Shape y{shape[0], shape[1], 1, 1};
      g.AddLayer(type, "pool" + name, {current}, {name}, {y});
      shape = y;
    } else {
      const Ints kernel{std::min<int64_t>(2, shape[2]), std::min<int64_t>(2, shape[3])};
      const Shape y{shape[0], shape[1], (shape[2] - kernel[0]) / 2 + 1,
                    (shape[3] - kernel[1]) / 2 + 1};
      g.AddLayer(type, "pool" + name, {current}, {name}, {y},
                 {{"kernel_shape", kernel}, {"strides", Ints{2, 2}}});
      shape = y;
    }
    current = name;
  }
  if (shape[2] >= 3 && shape[3] >= 3 && Chance(rng, 0.5))
    add_conv(true);
  // To 2-D.
  const int64_t features = shape[1] * shape[2] * shape[3];
  const std::string flat = next_name();
  if (Chance(rng, 0.5)) {
    g.AddLayer("Flatten", "flatten" + flat, {current}, {flat}, {{shape[0], features}});
  } else {
    g.AddInt64Constant("shape" + flat, {shape[0], -1});
    g.AddLayer("Reshape", "reshape" + flat, {current, "shape" + flat}, {flat},
               {{shape[0], features}});
  }
  current = flat;
  shape = {shape[0], features};
  const int64_t out = Uniform(rng, 1, 12);
  const std::string fc = next_name();
  if (Chance(rng, 0.5)) {
    const bool tb = Chance(rng, 0.5);
    g.AddConstant("fcW", RandomTensor(tb ? Shape{out, features} : Shape{features, out}, rng));
    std::vector<std::string> inputs{current, "fcW"};
    if (Chance(rng, 0.6)) {
      g.AddConstant("fcC", RandomTensor({out}, rng));
      inputs.push_back("fcC");
    }
    AttributeMap attributes{{"transB", int64_t{tb}}};
    if (Chance(rng, 0.3))
      attributes["alpha"] = 0.5f;
    g.AddLayer("Gemm", "gemm" + fc, inputs, {fc}, {{shape[0], out}}, attributes);
  } else {
    g.AddConstant("fcW", RandomTensor({features, out}, rng));
    g.AddLayer("MatMul", "matmul" + fc, {current, "fcW"}, {fc}, {{shape[0], out}});
    if (Chance(rng, 0.7)) {
      g.AddConstant("fcB", RandomTensor(Chance(rng, 0.5) ? Shape{out} : Shape{1, out}, rng));
      const std::string name = next_name();
      g.AddLayer("Add", "fcadd" + name, {fc, "fcB"}, {name}, {{shape[0], out}});
      current = name;
      *expect_fusion = true;
    }
  }
  if (current == flat)
    current = fc;
  shape = {shape[0], out};
  if (Chance(rng, 0.5)) {
    const std::string name = next_name();
    g.AddLayer(Pick<std::string>(rng, {"Relu", "Tanh"}), "fcact" + name, {current}, {name},
               {shape});
    current = name;
    *expect_fusion = true;
  }
  if (Chance(rng, 0.3)) {
    const std::string name = next_name();
    g.AddLayer("Softmax", "softmax" + name, {current}, {name}, {shape}, {{"axis", int64_t{1}}});
    current = name;
  }
  g.MarkOutput(current);
}

// An MLP-like run: (Gemm | MatMul [+Add]) [+Relu] repeated, with a second graph input added in
// the middle sometimes (a non-constant Add operand).
void MakeMlpChain(TestGraph& g, Rng& rng, bool* expect_fusion) {
  const int64_t n = Chance(rng, 0.5) ? 1 : Uniform(rng, 2, 9);
  int64_t features = Uniform(rng, 1, 40);
  g.AddInput("x", {n, features}, rng);
  std::string current = "x";
  const int depth = Uniform(rng, 1, 3);
  for (int i = 0; i < depth; ++i) {
    const std::string s = std::to_string(i);
    const int64_t out = Uniform(rng, 1, 40);
    if (Chance(rng, 0.5)) {
      g.AddConstant("W" + s, RandomTensor({features, out}, rng));
      g.AddConstant("C" + s, RandomTensor({out}, rng));
      g.AddLayer("Gemm", "gemm" + s, {current, "W" + s, "C" + s}, {"g" + s}, {{n, out}});
      current = "g" + s;
    } else {
      g.AddConstant("W" + s, RandomTensor({features, out}, rng));
      g.AddLayer("MatMul", "matmul" + s, {current, "W" + s}, {"m" + s}, {{n, out}});
      g.AddConstant("B" + s, RandomTensor({out}, rng));
      g.AddLayer("Add", "add" + s, {"m" + s, "B" + s}, {"a" + s}, {{n, out}});
      current = "a" + s;
      *expect_fusion = true;
    }
    if (Chance(rng, 0.3)) {
      g.AddInput("side" + s, {n, out}, rng);
      g.AddLayer("Add", "side_add" + s, {current, "side" + s}, {"s" + s}, {{n, out}});
      current = "s" + s;
    }
    if (Chance(rng, 0.7)) {
      g.AddLayer("Relu", "relu" + s, {current}, {"r" + s}, {{n, out}});
      current = "r" + s;
    }
    features = out;
  }
  g.MarkOutput(current);
}

class CpuAccCompiledRunTest : public CpuAccTest {
 protected:
  // Returns how many chains ran as parts of their batch (cpu_acc/batch_split.hpp; with
  // batch_split "always", every chain with a batch does) in the way `split_note` says.
  static int CheckChains(bool cnn, std::string_view split_note = "run at once, 1 thread each");
};

int CpuAccCompiledRunTest::CheckChains(bool cnn, std::string_view split_note) {
  Rng rng(cnn ? 424242 : 777);
  int split_runs = 0;
  const int iterations = Iterations(200);
  int fused_notes = 0;
  for (int iteration = 0; iteration < iterations; ++iteration) {
    TestGraph graph;
    bool expect_fusion = false;
    if (cnn)
      MakeCnnChain(graph, rng, &expect_fusion);
    else
      MakeMlpChain(graph, rng, &expect_fusion);
    auto expected = graph.RunPerLayer(cpu_ref());
    EXPECT_TRUE(expected.ok()) << expected.error().ToString() << graph.Describe();
    if (!expected.ok())
      return split_runs;
    std::vector<std::string> notes;
    auto actual = graph.RunCompiled(cpu_acc(), &notes);
    EXPECT_TRUE(actual.ok()) << "chain " << iteration << ": " << actual.error().ToString()
                             << graph.Describe();
    if (!actual.ok())
      return split_runs;
    EXPECT_EQ(notes.size(), graph.layers().size());
    for (const auto& name : graph.outputs()) {
      std::string mismatch;
      EXPECT_TRUE(AllClose(actual->at(name).values, expected->at(name).values, &mismatch))
          << "chain " << iteration << ", output " << name << ": " << mismatch << graph.Describe();
    }
    split_runs += notes.front().find(split_note) != std::string::npos;
    const bool fused = std::any_of(notes.begin(), notes.end(), [](const std::string& note) {
      return note.starts_with("fused into");
    });
    fused_notes += fused;
    if (expect_fusion && graph.outputs().size() == 1) {
      EXPECT_TRUE(fused) << "chain " << iteration << " fused nothing" << graph.Describe();
    }
  }
  EXPECT_GT(fused_notes, iterations / 3);
  return split_runs;
}

TEST_F(CpuAccCompiledRunTest, RandomCnnRunsMatchCpuRefLayerByLayer) {
  CheckChains(true);
}

TEST_F(CpuAccCompiledRunTest, RandomMlpRunsMatchCpuRefLayerByLayer) {
  CheckChains(false);
}

// The same chains with their batch split into parts run at once (half of them have a batch of
// 2 to 9 rows, odd ones in parts of unequal size): the answer is CpuRef's, and the split happened.
TEST_F(CpuAccCompiledRunTest, RandomRunsSplitAlongTheirBatchMatchCpuRef) {
  BACKPLANE_REQUIRE_CPUS(2);
  ASSERT_TRUE(
      cpu_acc()
          .UpdateOptions({{"intra_op_threads", int64_t{2}}, {"batch_split", std::string("always")}})
          .ok());
  const int cnn_splits = CheckChains(true);
  const int mlp_splits = CheckChains(false);
  ASSERT_TRUE(
      cpu_acc()
          .UpdateOptions({{"intra_op_threads", int64_t{1}}, {"batch_split", std::string("auto")}})
          .ok());
  const int iterations = Iterations(200);
  EXPECT_GT(cnn_splits, iterations / 4) << "of " << iterations << " CNN chains";
  EXPECT_GT(mlp_splits, iterations / 4) << "of " << iterations << " MLP chains";
}

// With one thread the parts run one after the other, on the calling thread: the answer is still
// CpuRef's, and the split happened.
TEST_F(CpuAccCompiledRunTest, RandomRunsSplitIntoPartsRunOneAfterTheOtherMatchCpuRef) {
  ASSERT_TRUE(cpu_acc().UpdateOptions({{"batch_split", std::string("always")}}).ok());
  const int cnn_splits = CheckChains(true, "run one after the other");
  const int mlp_splits = CheckChains(false, "run one after the other");
  ASSERT_TRUE(cpu_acc().UpdateOptions({{"batch_split", std::string("auto")}}).ok());
  const int iterations = Iterations(200);
  EXPECT_GT(cnn_splits, iterations / 4) << "of " << iterations << " CNN chains";
  EXPECT_GT(mlp_splits, iterations / 4) << "of " << iterations << " MLP chains";
}

// A run bound by its weights is never split on its own: every part would stream every weight
// (the wide MLPs that dynamic batching serves; parts of 8 rows made one at batch 64 several times
// slower). With one thread and with two.
TEST_F(CpuAccCompiledRunTest, AutoNeverSplitsARunBoundByItsWeights) {
  Rng rng(5);
  TestGraph g;
  g.AddInput("x", {64, 784}, rng);
  g.AddConstant("w0", RandomTensor({784, 512}, rng));
  g.AddConstant("w1", RandomTensor({512, 10}, rng));
  g.AddLayer("Gemm", "gemm0", {"x", "w0"}, {"g0"}, {{64, 512}});
  g.AddLayer("Relu", "relu", {"g0"}, {"r"}, {{64, 512}});
  g.AddLayer("Gemm", "gemm1", {"r", "w1"}, {"y"}, {{64, 10}});
  g.MarkOutput("y");
  for (const int64_t parts : {2, 4, 8, 32})
    EXPECT_FALSE(cpu_acc::SplitPays(g.Subgraph(), parts)) << parts << " parts";
  // Where a convolution of the same batch, 512 FLOPs a weight and sample, pays in every part.
  TestGraph conv;
  conv.AddInput("x", {64, 16, 16, 16}, rng);
  conv.AddConstant("w", RandomTensor({16, 16, 3, 3}, rng));
  conv.AddLayer("Conv", "conv", {"x", "w"}, {"y"}, {{64, 16, 16, 16}},
                {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  conv.MarkOutput("y");
  for (const int64_t parts : {2, 4, 8, 32})
    EXPECT_TRUE(cpu_acc::SplitPays(conv.Subgraph(), parts)) << parts << " parts";
  auto expected = g.RunPerLayer(cpu_ref());
  ASSERT_TRUE(expected.ok()) << expected.error().ToString();
  for (const int64_t threads : {1, 2}) {
    if (threads > FindUsableCpus().count)
      continue;  // refused on one usable CPU
    SCOPED_TRACE("intra_op_threads " + std::to_string(threads));
    ASSERT_TRUE(cpu_acc().UpdateOptions({{"intra_op_threads", threads}}).ok());
    std::vector<std::string> notes;
    auto actual = g.RunCompiled(cpu_acc(), &notes);
    ASSERT_TRUE(actual.ok()) << actual.error().ToString();
    std::string mismatch;
    EXPECT_TRUE(AllClose(actual->at("y").values, expected->at("y").values, &mismatch)) << mismatch;
    for (const std::string& note : notes)
      EXPECT_THAT(note, ::testing::Not(::testing::HasSubstr("split")));
  }
  ASSERT_TRUE(cpu_acc().UpdateOptions({{"intra_op_threads", int64_t{1}}}).ok());
}

// Runs whose layers combine samples are never split, even when told to always split: each
// still answers as CpuRef does, on the whole batch.
TEST_F(CpuAccCompiledRunTest, RunsThatMixSamplesAreNotSplit) {
  BACKPLANE_REQUIRE_CPUS(2);
  Rng rng(91);
  struct Case {
    std::string what;
    std::function<void(TestGraph&)> build;
  };
  const std::vector<Case> cases{
      {"Softmax over the batch",
       [&](TestGraph& g) {
         g.AddInput("x", {4, 6}, rng);
         g.AddLayer("Relu", "relu", {"x"}, {"r"}, {{4, 6}});
         g.AddLayer("Softmax", "softmax", {"r"}, {"y"}, {{4, 6}}, {{"axis", int64_t{0}}});
       }},
      {"Gemm with transA",
       [&](TestGraph& g) {
         g.AddInput("x", {4, 6}, rng);
         g.AddConstant("w", RandomTensor({4, 5}, rng));
         g.AddLayer("Gemm", "gemm", {"x", "w"}, {"g"}, {{6, 5}}, {{"transA", int64_t{1}}});
         g.AddLayer("Relu", "relu", {"g"}, {"y"}, {{6, 5}});
       }},
      {"Concat along the batch",
       [&](TestGraph& g) {
         g.AddInput("x", {4, 6}, rng);
         g.AddLayer("Relu", "relu", {"x"}, {"r"}, {{4, 6}});
         g.AddLayer("Concat", "concat", {"x", "r"}, {"y"}, {{8, 6}}, {{"axis", int64_t{0}}});
       }},
      {"Transpose moving the batch",
       [&](TestGraph& g) {
         g.AddInput("x", {4, 6}, rng);
         g.AddLayer("Relu", "relu", {"x"}, {"r"}, {{4, 6}});
         g.AddLayer("Transpose", "transpose", {"r"}, {"y"}, {{6, 4}});
       }},
      {"a constant per sample",
       [&](TestGraph& g) {
         g.AddInput("x", {4, 6}, rng);
         g.AddConstant("c", RandomTensor({4, 6}, rng));
         g.AddLayer("Add", "add", {"x", "c"}, {"a"}, {{4, 6}});
         g.AddLayer("Relu", "relu", {"a"}, {"y"}, {{4, 6}});
       }},
      {"MatMul with weights per sample",
       [&](TestGraph& g) {
         g.AddInput("x", {4, 3, 6}, rng);
         g.AddConstant("w", RandomTensor({4, 6, 5}, rng));
         g.AddLayer("MatMul", "matmul", {"x", "w"}, {"m"}, {{4, 3, 5}});
         g.AddLayer("Relu", "relu", {"m"}, {"y"}, {{4, 3, 5}});
       }},
      {"a reshape that moves samples",
       [&](TestGraph& g) {
         g.AddInput("x", {4, 6}, rng);
         g.AddLayer("Relu", "relu", {"x"}, {"r"}, {{4, 6}});
         g.AddInt64Constant("shape", {2, 12});
         g.AddLayer("Reshape", "reshape", {"r", "shape"}, {"y"}, {{2, 12}});
       }},
  };
  ASSERT_TRUE(
      cpu_acc()
          .UpdateOptions({{"intra_op_threads", int64_t{2}}, {"batch_split", std::string("always")}})
          .ok());
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TestGraph g;
    c.build(g);
    g.MarkOutput("y");
    auto expected = g.RunPerLayer(cpu_ref());
    ASSERT_TRUE(expected.ok()) << expected.error().ToString() << g.Describe();
    std::vector<std::string> notes;
    auto actual = g.RunCompiled(cpu_acc(), &notes);
    ASSERT_TRUE(actual.ok()) << actual.error().ToString() << g.Describe();
    std::string mismatch;
    EXPECT_TRUE(AllClose(actual->at("y").values, expected->at("y").values, &mismatch)) << mismatch;
    for (const std::string& note : notes)
      EXPECT_THAT(note, ::testing::Not(::testing::HasSubstr("split"))) << g.Describe();
  }
  ASSERT_TRUE(
      cpu_acc()
          .UpdateOptions({{"intra_op_threads", int64_t{1}}, {"batch_split", std::string("auto")}})
          .ok());
}

// Products of at least 4 MFLOP (kTuneFlops) with constant weights: CpuAcc times its weights in
// both layouts when it compiles them and keeps the faster (placement says "weights
// K-contiguous" when that one won). Whichever wins, the answer is CpuRef's: Gemm with transB,
// alpha and a bias, MatMul of rank 2 and 3 with weights of either rank, shapes at random.
TEST_F(CpuAccCompiledRunTest, LargeProductsMatchCpuRefInTheirTunedWeightLayout) {
  const uint64_t seed = backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  Rng rng(static_cast<Rng::result_type>(seed));
  int k_contiguous = 0;
  const int cases = Iterations(12);
  for (int c = 0; c < cases; ++c) {
    TestGraph g;
    const int64_t k = Uniform(rng, 400, 800), n = Uniform(rng, 200, 520);
    // Small weights: sums over 800 products stay near 1, within the comparison's tolerance.
    auto weights = [&](const Shape& shape) { return RandomTensor(shape, rng, -0.1f, 0.1f); };
    std::string current;
    Shape out;
    switch (Uniform(rng, 0, 2)) {
      case 0: {  // Gemm, as an exported Linear layer: transB = 1, bias
        const int64_t m = Pick<int64_t>(rng, {32, 64, 96});
        const bool tb = Chance(rng, 0.5);
        g.AddInput("x", {m, k}, rng);
        g.AddConstant("W", weights(tb ? Shape{n, k} : Shape{k, n}));
        g.AddConstant("C", weights({n}));
        AttributeMap attributes{{"transB", int64_t{tb}}};
        if (Chance(rng, 0.3))
          attributes["alpha"] = 0.5f;
        out = {m, n};
        g.AddLayer("Gemm", "gemm", {"x", "W", "C"}, {"y"}, {out}, attributes);
        current = "y";
        break;
      }
      case 1: {  // MatMul, rank 2
        const int64_t m = Pick<int64_t>(rng, {32, 64});
        g.AddInput("x", {m, k}, rng);
        g.AddConstant("W", weights({k, n}));
        out = {m, n};
        g.AddLayer("MatMul", "matmul", {"x", "W"}, {"y"}, {out});
        current = "y";
        break;
      }
      default: {  // MatMul, rank 3, weights per batch or shared
        const int64_t batch = Uniform(rng, 2, 3), m = Uniform(rng, 16, 48);
        g.AddInput("x", {batch, m, k}, rng);
        g.AddConstant("W", weights(Chance(rng, 0.5) ? Shape{batch, k, n} : Shape{k, n}));
        out = {batch, m, n};
        g.AddLayer("MatMul", "matmul", {"x", "W"}, {"y"}, {out});
        current = "y";
        break;
      }
    }
    if (Chance(rng, 0.5)) {
      g.AddLayer("Relu", "relu", {current}, {"r"}, {out});
      current = "r";
    }
    g.MarkOutput(current);
    auto expected = g.RunPerLayer(cpu_ref());
    ASSERT_TRUE(expected.ok()) << expected.error().ToString() << g.Describe();
    std::vector<std::string> notes;
    auto actual = g.RunCompiled(cpu_acc(), &notes);
    ASSERT_TRUE(actual.ok()) << "case " << c << ": " << actual.error().ToString() << g.Describe();
    std::string mismatch;
    ASSERT_TRUE(AllClose(actual->at(current).values, expected->at(current).values, &mismatch))
        << "case " << c << " (" << notes.front() << "): " << mismatch << g.Describe();
    k_contiguous += notes.front().find("weights K-contiguous") != std::string::npos;
  }
  // Which layout wins is the machine's: said, not asserted.
  std::cout << k_contiguous << " of " << cases << " products chose K-contiguous weights\n";
}

}  // namespace
}  // namespace backplane::cpu_acc_test
