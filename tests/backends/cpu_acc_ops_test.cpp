// Issue 20's ops on CpuAcc against CpuRef: random configurations of Sub, Div, LeakyRelu,
// HardSigmoid, HardSwish, Clip, Dropout, Pad, and Add/Mul/Sub/Div with either operand or both
// broadcasting (seeded; the seed is printed on failure). Then compiled runs: the new activations
// fused into a convolution (MobileNetV2's Conv+BN+Relu6), a zero Pad folded into the next
// convolution, ResNet's basic and projection-shortcut blocks with the residual Add as a sum
// post-op — each compiled whole against CpuAcc layer by layer (unfused) and CpuRef — and the
// two-thread policy as placement notes show it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <string>

#include "batch_split.hpp"
#include "cpu_acc_test_util.hpp"
#include "sanitizer_build.hpp"
#include "test_util.hpp"

namespace backplane::cpu_acc_test {
namespace {

using ::testing::HasSubstr;
using Rng = std::mt19937;
using Ints = std::vector<int64_t>;

int DrawInt(Rng& rng, int low, int high) {
  return std::uniform_int_distribution<int>(low, high)(rng);
}

bool DrawChance(Rng& rng, double p) {
  return std::bernoulli_distribution(p)(rng);
}

FloatTensor DrawTensor(const Shape& shape, Rng& rng, float low, float high) {
  std::uniform_real_distribution<float> value(low, high);
  FloatTensor tensor{shape, std::vector<float>(static_cast<std::size_t>(ElementCount(shape)))};
  for (float& v : tensor.values)
    v = value(rng);
  return tensor;
}

Shape DrawShape(Rng& rng, int min_rank, int max_rank, int max_dim) {
  Shape shape(DrawInt(rng, min_rank, max_rank));
  for (auto& dim : shape)
    dim = DrawInt(rng, 1, max_dim);
  return shape;
}

// An operand that broadcasts to `full` (numpy rules): a suffix of its dims, each kept or 1.
Shape DrawBroadcastOperand(Rng& rng, const Shape& full) {
  Shape operand;
  const std::size_t rank = DrawInt(rng, 0, static_cast<int>(full.size()));
  for (std::size_t d = full.size() - rank; d < full.size(); ++d)
    operand.push_back(DrawChance(rng, 0.5) ? 1 : full[d]);
  return operand;
}

// Add/Sub/Mul/Div: each operand the output's shape or a broadcast of it (both may broadcast),
// data or constant. Div's divisor stays away from zero.
void MakeBinaryCase(TestGraph& g, Rng& rng, const std::string& type) {
  Shape full = DrawShape(rng, 0, 4, 5);
  Shape a = DrawChance(rng, 0.4) ? full : DrawBroadcastOperand(rng, full);
  Shape b = DrawChance(rng, 0.4) ? full : DrawBroadcastOperand(rng, full);
  // The output is the broadcast of both: a dim that both reduce to 1 is 1.
  Shape y(std::max(a.size(), b.size()));
  for (std::size_t d = 0; d < y.size(); ++d) {
    const std::size_t from_end = y.size() - d;
    const int64_t da = from_end <= a.size() ? a[a.size() - from_end] : 1;
    const int64_t db = from_end <= b.size() ? b[b.size() - from_end] : 1;
    y[d] = std::max(da, db);
  }
  g.SetInput("A", DrawTensor(a, rng, -2.0f, 2.0f));
  FloatTensor divisor = DrawTensor(b, rng, 0.5f, 2.0f);
  if (type != "Div") {
    divisor = DrawTensor(b, rng, -2.0f, 2.0f);
  } else {
    for (float& v : divisor.values)
      v = DrawChance(rng, 0.5) ? v : -v;
  }
  if (DrawChance(rng, 0.3))
    g.AddConstant("B", std::move(divisor));
  else
    g.SetInput("B", std::move(divisor));
  g.AddLayer(type, "binary", {"A", "B"}, {"Y"}, {y});
}

// A scalar constant of rank 0 or 1 (ONNX allows either for Clip's bounds).
std::string ScalarConstant(TestGraph& g, Rng& rng, const std::string& name, float value) {
  g.AddConstant(name, {DrawChance(rng, 0.5) ? Shape{} : Shape{1}, {value}});
  return name;
}

void MakeActivationCase(TestGraph& g, Rng& rng, const std::string& type) {
  const Shape shape = DrawShape(rng, 1, 4, 7);
  g.SetInput("X", DrawTensor(shape, rng, -8.0f, 8.0f));
  AttributeMap attributes;
  std::vector<std::string> inputs{"X"};
  if (type == "LeakyRelu" && DrawChance(rng, 0.7)) {
    attributes["alpha"] = std::uniform_real_distribution<float>(-1.0f, 2.0f)(rng);
  } else if (type == "HardSigmoid") {
    if (DrawChance(rng, 0.7))
      attributes["alpha"] = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
    if (DrawChance(rng, 0.7))
      attributes["beta"] = std::uniform_real_distribution<float>(-1.0f, 2.0f)(rng);
  } else if (type == "Clip") {
    // Relu6, one bound, both (min > max included: ONNX gives max everywhere), none.
    const int form = DrawInt(rng, 0, 4);
    const float low = std::uniform_real_distribution<float>(-6.0f, 6.0f)(rng);
    const float high = std::uniform_real_distribution<float>(-6.0f, 6.0f)(rng);
    if (form == 0) {
      inputs = {"X", ScalarConstant(g, rng, "min", 0.0f), ScalarConstant(g, rng, "max", 6.0f)};
    } else if (form == 1) {
      inputs = {"X", ScalarConstant(g, rng, "min", low)};
    } else if (form == 2) {
      inputs = {"X", "", ScalarConstant(g, rng, "max", high)};
    } else if (form == 3) {
      inputs = {"X", ScalarConstant(g, rng, "min", low), ScalarConstant(g, rng, "max", high)};
    }
  } else if (type == "Dropout" && DrawChance(rng, 0.5)) {
    inputs.push_back(ScalarConstant(g, rng, "ratio", 0.5f));
  }
  g.AddLayer(type, "activation", inputs, {"Y"}, {shape}, attributes);
}

void MakePadCase(TestGraph& g, Rng& rng) {
  const Shape x = DrawShape(rng, 1, 4, 5);
  Ints pads(2 * x.size());
  Shape y = x;
  for (std::size_t d = 0; d < x.size(); ++d) {
    pads[d] = DrawInt(rng, 0, 2);
    pads[d + x.size()] = DrawInt(rng, 0, 2);
    y[d] += pads[d] + pads[d + x.size()];
  }
  g.SetInput("X", DrawTensor(x, rng, -1.0f, 1.0f));
  g.AddInt64Constant("pads", pads);
  std::vector<std::string> inputs{"X", "pads"};
  if (DrawChance(rng, 0.6))
    inputs.push_back(ScalarConstant(g, rng, "value", DrawChance(rng, 0.5) ? 0.0f : 2.5f));
  g.AddLayer("Pad", "pad", inputs, {"Y"}, {y});
}

class CpuAccNewOpTest : public CpuAccTest, public ::testing::WithParamInterface<std::string> {};

// Every configuration must be accepted by CpuAcc (these are the ops it now claims) and match
// CpuRef at the tolerance.
TEST_P(CpuAccNewOpTest, MatchesCpuRefOnRandomConfigurations) {
  const std::string type = GetParam();
  const unsigned seed = static_cast<unsigned>(std::hash<std::string>{}(type) % 100000 + 20261202);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int iteration = 0; iteration < Iterations(150); ++iteration) {
    TestGraph graph;
    if (type == "Pad")
      MakePadCase(graph, rng);
    else if (type == "Add" || type == "Sub" || type == "Mul" || type == "Div")
      MakeBinaryCase(graph, rng, type);
    else
      MakeActivationCase(graph, rng, type);
    graph.MarkOutput("Y");
    const OperatorDesc& op = graph.layers()[0].op;
    ASSERT_TRUE(cpu_ref().IsSupported(op).ok())
        << cpu_ref().IsSupported(op).ToString() << graph.Describe();
    ASSERT_TRUE(cpu_acc().IsSupported(op).ok())
        << "case " << iteration << ": " << cpu_acc().IsSupported(op).ToString() << graph.Describe();
    auto expected = graph.RunPerLayer(cpu_ref());
    ASSERT_TRUE(expected.ok()) << expected.error().ToString() << graph.Describe();
    auto actual = graph.RunPerLayer(cpu_acc());
    ASSERT_TRUE(actual.ok()) << "case " << iteration << ": " << actual.error().ToString()
                             << graph.Describe();
    std::string mismatch;
    ASSERT_TRUE(AllClose(actual->at("Y").values, expected->at("Y").values, &mismatch))
        << "case " << iteration << ": " << mismatch << graph.Describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, CpuAccNewOpTest,
                         ::testing::Values("Add", "Sub", "Mul", "Div", "LeakyRelu", "HardSigmoid",
                                           "HardSwish", "Clip", "Dropout", "Pad"),
                         [](const auto& info) { return info.param; });

// ---- refusals: what CpuAcc declines, and why -------------------------------------------------

OperatorDesc NodeOf(std::string type, std::vector<TensorInfo> inputs,
                    std::vector<const void*> constants, std::vector<Shape> outputs,
                    AttributeMap attributes = {}) {
  OperatorDesc op{.op_type = std::move(type), .name = "n", .attributes = std::move(attributes)};
  op.inputs = std::move(inputs);
  op.constant_inputs = std::move(constants);
  op.constant_inputs.resize(op.inputs.size(), nullptr);
  for (auto& shape : outputs)
    op.outputs.push_back({DataType::kFloat32, std::move(shape)});
  return op;
}

TEST_F(CpuAccTest, RefusesWhatItCannotRunNamingTheNodeAndWhy) {
  const float six = 6.0f;
  const float pair[2] = {0.0f, 1.0f};
  const int64_t negative[4] = {0, -1, 0, 1};
  const int64_t ones[4] = {0, 1, 0, 1};
  const uint8_t training = 1;
  const TensorInfo x{DataType::kFloat32, {2, 3}};
  const TensorInfo scalar{DataType::kFloat32, {}};
  struct Case {
    OperatorDesc op;
    StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {NodeOf("Clip", {x, scalar}, {}, {{2, 3}}), StatusCode::kUnimplemented,
       "Clip node 'n': min (input 1) must be a constant"},
      {NodeOf("Clip", {x, {DataType::kFloat32, {2}}}, {nullptr, pair}, {{2, 3}}),
       StatusCode::kInvalidArgument, "min (input 1) must be a scalar, has shape [2]"},
      {NodeOf("Clip", {x}, {}, {{2, 3}}, {{"max", six}}), StatusCode::kUnimplemented,
       "attribute 'max' is Clip-6's"},
      {NodeOf("Dropout", {x}, {}, {{2, 3}, {2, 3}}), StatusCode::kUnimplemented,
       "the mask output (output 1) is a BOOL tensor"},
      {NodeOf("Dropout", {x, scalar, {DataType::kBool, {}}}, {nullptr, nullptr, &training},
              {{2, 3}}),
       StatusCode::kUnimplemented, "training_mode is true: CpuAcc runs inference only"},
      {NodeOf("Pad", {x, {DataType::kInt64, {4}}}, {nullptr, negative}, {{2, 3}}),
       StatusCode::kUnimplemented, "negative pads (cropping) are not supported"},
      {NodeOf("Pad", {x, {DataType::kInt64, {4}}}, {nullptr, ones}, {{2, 5}},
              {{"mode", std::string("reflect")}}),
       StatusCode::kUnimplemented, "mode 'reflect' is not supported (only 'constant')"},
      {NodeOf("Pad", {x, {DataType::kInt64, {4}}}, {}, {{2, 5}}), StatusCode::kUnimplemented,
       "pads (input 1) must be a constant 1-D INT64 tensor"},
      {NodeOf("Pad", {x, {DataType::kInt64, {4}}, scalar}, {nullptr, ones}, {{2, 5}}),
       StatusCode::kUnimplemented, "constant_value (input 2) must be a constant FP32 scalar"},
      {NodeOf("Sub", {x, {DataType::kFloat32, {4}}}, {}, {{2, 4}}), StatusCode::kInvalidArgument,
       "Sub node 'n'"},
      {NodeOf("LeakyRelu", {x}, {}, {{2, 3}}, {{"slope", six}}), StatusCode::kUnimplemented,
       "unsupported attribute 'slope'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    const Status status = cpu_acc().IsSupported(c.op);
    EXPECT_EQ(status.code(), c.code) << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

// ---- compiled runs ---------------------------------------------------------------------------

// Runs `graph` compiled whole on CpuAcc, layer by layer on CpuAcc (nothing fused) and layer by
// layer on CpuRef; every output must agree. Returns the compiled run's layer notes.
std::vector<std::string> ExpectFusedUnfusedAndReferenceAgree(const TestGraph& graph,
                                                             loader::BackendInstance& reference,
                                                             loader::BackendInstance& accelerated) {
  auto expected = graph.RunPerLayer(reference);
  EXPECT_TRUE(expected.ok()) << expected.error().ToString() << graph.Describe();
  auto unfused = graph.RunPerLayer(accelerated);
  EXPECT_TRUE(unfused.ok()) << unfused.error().ToString() << graph.Describe();
  std::vector<std::string> notes;
  auto fused = graph.RunCompiled(accelerated, &notes);
  EXPECT_TRUE(fused.ok()) << fused.error().ToString() << graph.Describe();
  if (!expected.ok() || !unfused.ok() || !fused.ok())
    return notes;
  for (const auto& name : graph.outputs()) {
    std::string mismatch;
    EXPECT_TRUE(AllClose(fused->at(name).values, expected->at(name).values, &mismatch))
        << "compiled, output " << name << ": " << mismatch << graph.Describe();
    EXPECT_TRUE(AllClose(unfused->at(name).values, expected->at(name).values, &mismatch))
        << "per layer, output " << name << ": " << mismatch << graph.Describe();
  }
  return notes;
}

// Conv 3x3 (pads 1) + BatchNormalization on `in` [n, c, h, w] -> `out` [n, maps, h/stride...];
// the BatchNormalization's epsilon its default unless given.
Shape AddConvBn(TestGraph& g, Rng& rng, const std::string& in, const std::string& out, int64_t maps,
                int64_t stride, int64_t kernel = 3, std::optional<float> epsilon = std::nullopt) {
  const Shape& x = g.ShapeOf(in);
  const int64_t pad = kernel / 2;
  const Shape y{x[0], maps, (x[2] + 2 * pad - kernel) / stride + 1,
                (x[3] + 2 * pad - kernel) / stride + 1};
  g.AddConstant(out + "_w", DrawTensor({maps, x[1], kernel, kernel}, rng, -0.5f, 0.5f));
  g.AddConstant(out + "_b", DrawTensor({maps}, rng, -0.5f, 0.5f));
  g.AddLayer("Conv", out + "_conv", {in, out + "_w", out + "_b"}, {out + "_c"}, {y},
             {{"kernel_shape", Ints{kernel, kernel}},
              {"pads", Ints{pad, pad, pad, pad}},
              {"strides", Ints{stride, stride}}});
  g.AddConstant(out + "_gamma", DrawTensor({maps}, rng, 0.5f, 1.5f));
  g.AddConstant(out + "_beta", DrawTensor({maps}, rng, -0.5f, 0.5f));
  g.AddConstant(out + "_mean", DrawTensor({maps}, rng, -0.5f, 0.5f));
  g.AddConstant(out + "_var", DrawTensor({maps}, rng, 0.5f, 1.5f));
  AttributeMap bn_attributes;
  if (epsilon)
    bn_attributes["epsilon"] = *epsilon;
  g.AddLayer("BatchNormalization", out + "_bn",
             {out + "_c", out + "_gamma", out + "_beta", out + "_mean", out + "_var"}, {out}, {y},
             std::move(bn_attributes));
  return y;
}

// ResNet's basic block (torchvision's order): conv-bn-relu, conv-bn, (projection conv-bn of the
// input when `stride` or the width changes), Add, Relu.
std::string AddBasicBlock(TestGraph& g, Rng& rng, const std::string& in, const std::string& name,
                          int64_t maps, int64_t stride) {
  const Shape y1 = AddConvBn(g, rng, in, name + "_1", maps, stride);
  g.AddLayer("Relu", name + "_relu1", {name + "_1"}, {name + "_r1"}, {y1});
  AddConvBn(g, rng, name + "_r1", name + "_2", maps, 1);
  std::string shortcut = in;
  if (stride != 1 || g.ShapeOf(in)[1] != maps) {
    AddConvBn(g, rng, in, name + "_down", maps, stride, 1);
    shortcut = name + "_down";
  }
  g.AddLayer("Add", name + "_add", {name + "_2", shortcut}, {name + "_sum"}, {y1});
  g.AddLayer("Relu", name + "_relu2", {name + "_sum"}, {name}, {y1});
  return name;
}

using CpuAccFusionTest = CpuAccTest;

TEST_F(CpuAccFusionTest, ResNetBasicBlocksFuseTheResidualAddAsASumPostOp) {
  for (unsigned seed : {11u, 12u, 13u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    TestGraph g;
    g.SetInput("x", DrawTensor({DrawInt(rng, 1, 3), 16, 12, 12}, rng, -1.0f, 1.0f));
    // Identity shortcut reading a boundary input (the branch is copied into the destination),
    // identity shortcut reading a temporary (accumulated in place), projection shortcut.
    AddBasicBlock(g, rng, "x", "b1", 16, 1);
    AddBasicBlock(g, rng, "b1", "b2", 16, 1);
    AddBasicBlock(g, rng, "b2", "b3", 32, 2);
    g.MarkOutput("b3");
    const auto notes = ExpectFusedUnfusedAndReferenceAgree(g, cpu_ref(), cpu_acc());
    ASSERT_EQ(notes.size(), g.layers().size());
    for (std::size_t k = 0; k < g.layers().size(); ++k) {
      const std::string& name = g.layers()[k].op.name;
      if (name == "b1_2_conv" || name == "b2_2_conv") {
        EXPECT_THAT(notes[k], HasSubstr("fused Conv+BatchNormalization+Add+Relu")) << name;
        EXPECT_THAT(notes[k], HasSubstr("as a sum post-op")) << name;
      }
      if (name == "b3_down_conv") {  // the Add follows the projection: it takes the sum
        EXPECT_THAT(notes[k], HasSubstr("residual 'b3_2' as a sum post-op")) << name;
      }
      if (name.ends_with("_add")) {
        EXPECT_THAT(notes[k], HasSubstr("fused into")) << name;
      }
    }
  }
}

// The branch the sum post-op adds is read again after the Add (an output of the run, and by a
// later layer): its bytes must not be accumulated into.
TEST_F(CpuAccFusionTest, ResidualBranchReadAfterTheAddIsNotOverwritten) {
  Rng rng(21);
  TestGraph g;
  g.SetInput("x", DrawTensor({2, 16, 8, 8}, rng, -1.0f, 1.0f));
  const Shape y = AddConvBn(g, rng, "x", "a", 16, 1);
  g.AddLayer("Relu", "a_relu", {"a"}, {"branch"}, {y});
  AddConvBn(g, rng, "branch", "c", 16, 1);
  g.AddLayer("Add", "add", {"c", "branch"}, {"sum"}, {y});
  g.AddLayer("Mul", "later", {"sum", "branch"}, {"product"}, {y});
  g.MarkOutput("product");
  g.MarkOutput("branch");
  const auto notes = ExpectFusedUnfusedAndReferenceAgree(g, cpu_ref(), cpu_acc());
  ASSERT_EQ(notes.size(), g.layers().size());
  EXPECT_THAT(notes[3], HasSubstr("as a sum post-op"));
}

// ---- Folded weights shared between programs (backends/cpu_acc/constant_cache.hpp) ----

std::vector<float> FirstInput(const TestGraph& g) {
  const std::span<const float> values = g.InputViews().at(0).Elements<float>();
  return {values.begin(), values.end()};
}

// Runs `workload` on `x` (shape `x_shape`); its single output, of shape `y_shape`.
std::vector<float> RunOne(loader::Workload& workload, const Shape& x_shape,
                          const std::vector<float>& x, const Shape& y_shape) {
  std::vector<float> y(static_cast<std::size_t>(ElementCount(y_shape)), NAN);
  const ConstTensorView input{{DataType::kFloat32, x_shape}, x.data()};
  const TensorView output{{DataType::kFloat32, y_shape}, y.data()};
  if (Status status = workload.Execute({&input, 1}, {&output, 1}); !status.ok())
    ADD_FAILURE() << status.ToString();
  return y;
}

// A convolution with a BatchNormalization folded into its 9.4 MB of weights, compiled at six
// more batch sizes: a copy of the folded weights per layout the convolutions want, not one per
// program; and every size computes with them (each row of a batch equals the row alone, which
// equals CpuRef). Trap: CpuAcc times oneDNN's implementations per batch size and keeps the
// fastest, and each wants its own layout (four here: jit avx512 and avx2, brgconv, gemm), so
// which sizes share a copy changes from run to run (CI once grew 30.6 MB, three copies' worth,
// against a fixed bound of three): the bound is a copy per implementation the six programs chose
// that the first two had not, plus one for the programs themselves and ASan's shadow (TSan's
// shadow is too large to bound this way); without the sharing, six copies.
TEST_F(CpuAccFusionTest, FoldedWeightsAreSharedByTheProgramsOfEveryBatchSize) {
  Rng rng(31);
  TestGraph g;
  g.SetInput("x", DrawTensor({1, 512, 4, 4}, rng, -1.0f, 1.0f));
  const Shape y1 = AddConvBn(g, rng, "x", "y", 512, 1);
  g.MarkOutput("y");
  std::vector<std::unique_ptr<loader::Workload>> programs;
  std::vector<std::string> implementations;  // per program: its convolution's layer note
  const auto compile = [&](int64_t batch) -> loader::Workload& {
    auto compiled = cpu_acc().CompileSubgraph(cpu_acc::WithBatch(g.Subgraph(), batch));
    EXPECT_TRUE(compiled.ok()) << "batch " << batch << ": " << compiled.error().ToString();
    programs.push_back(std::move(compiled.value().workload));
    implementations.push_back(compiled.value().layer_notes.at(0));
    return *programs.back();
  };
  loader::Workload& alone = compile(1);
  compile(2);  // oneDNN may want other layouts for one or two samples
  ReleaseFreedMemory();
  const int64_t before = testing::ProcStatusBytes(getpid(), "VmRSS").value();
  for (int64_t batch = 3; batch <= 8; ++batch)
    compile(batch);
  ReleaseFreedMemory();  // what compiling used and freed (tuning's buffers) is not a program's
  const int64_t grown = testing::ProcStatusBytes(getpid(), "VmRSS").value() - before;
  const std::set<std::string> laid_out_before(implementations.begin(), implementations.begin() + 2);
  std::set<std::string> new_implementations;
  std::string chosen;
  for (std::size_t p = 0; p < implementations.size(); ++p) {
    chosen += "\n  batch " + std::to_string(p + 1) + ": " + implementations[p];
    if (p >= 2 && !laid_out_before.contains(implementations[p]))
      new_implementations.insert(implementations[p]);
  }
  const int64_t weight_bytes = 512 * 512 * 9 * static_cast<int64_t>(sizeof(float));
  const auto copies = static_cast<int64_t>(new_implementations.size());
  ASSERT_LT(copies, 5) << "too many implementations for the bound to tell sharing apart:" << chosen;
#if defined(BACKPLANE_TSAN_BUILD)
  // Not asserted under TSan: its shadow and metadata of everything the programs write are resident
  // too and drown the copies counted here (one new implementation grew 48.4 MB, two 59.3 MB: five
  // and six copies' bytes). Release and ASan hold the bound; TSan still checks the answers below.
  RecordProperty("resident_growth_bytes", std::to_string(grown));
#else
  EXPECT_LT(grown, (copies + 1) * weight_bytes)
      << "6 programs grew the resident set by " << grown << " bytes; the folded weights are "
      << weight_bytes << ", and " << copies
      << " implementations are new at batch 3 to 8:" << chosen;
#endif

  auto want = g.RunPerLayer(cpu_ref());
  ASSERT_TRUE(want.ok()) << want.error().ToString();
  const std::vector<float> x = FirstInput(g);
  const std::vector<float> got_alone = RunOne(alone, g.ShapeOf("x"), x, y1);
  std::string mismatch;
  EXPECT_TRUE(AllClose(got_alone, want->at("y").values, &mismatch)) << mismatch;
  for (std::size_t p = 1; p < programs.size(); ++p) {
    const int64_t batch = static_cast<int64_t>(p) + 1;
    std::vector<float> xs;
    for (int64_t r = 0; r < batch; ++r)
      xs.insert(xs.end(), x.begin(), x.end());
    const std::vector<float> ys =
        RunOne(*programs[p], {batch, 512, 4, 4}, xs, {batch, y1[1], y1[2], y1[3]});
    for (int64_t r = 0; r < batch; ++r) {
      const std::vector<float> row(ys.begin() + r * ElementCount(y1),
                                   ys.begin() + (r + 1) * ElementCount(y1));
      EXPECT_TRUE(AllClose(row, got_alone, &mismatch))
          << "batch " << batch << " row " << r << ": " << mismatch;
    }
  }
}

// Folded weights depend on the BatchNormalization's epsilon as much as on its bytes: the same
// weights, gamma and var under another epsilon are folded anew, while the first program lives.
TEST_F(CpuAccFusionTest, FoldedWeightsUnderAnotherEpsilonAreFoldedAnew) {
  const auto make = [](TestGraph& g, std::optional<float> epsilon) {
    Rng rng(41);  // the same values in both graphs
    g.SetInput("x", DrawTensor({2, 16, 6, 6}, rng, -1.0f, 1.0f));
    AddConvBn(g, rng, "x", "y", 16, 1, 3, epsilon);
    g.MarkOutput("y");
  };
  TestGraph small_epsilon, large_epsilon;
  make(small_epsilon, std::nullopt);
  make(large_epsilon, 0.5f);
  auto first = small_epsilon.RunCompiled(cpu_acc(), nullptr);
  ASSERT_TRUE(first.ok()) << first.error().ToString();
  // The run of the first graph's constants (their addresses) with the second graph's epsilon.
  SubgraphDesc other = small_epsilon.Subgraph();
  other.layers[1].attributes = large_epsilon.Subgraph().layers[1].attributes;
  auto kept = cpu_acc().CompileSubgraph(small_epsilon.Subgraph());  // holds the first folding
  auto compiled = cpu_acc().CompileSubgraph(other);
  ASSERT_TRUE(kept.ok() && compiled.ok());
  const std::vector<float> x = FirstInput(small_epsilon);
  const std::vector<float> got = RunOne(*compiled->workload, {2, 16, 6, 6}, x, {2, 16, 6, 6});
  auto want = large_epsilon.RunPerLayer(cpu_ref());
  auto want_small = small_epsilon.RunPerLayer(cpu_ref());
  ASSERT_TRUE(want.ok() && want_small.ok());
  std::string mismatch;
  EXPECT_TRUE(AllClose(got, want->at("y").values, &mismatch)) << mismatch;
  EXPECT_FALSE(AllClose(want_small->at("y").values, want->at("y").values, &mismatch))
      << "the two epsilons must give different answers for this test to mean anything";
}

// SqueezeNet's Fire module: squeeze 1x1, two expand convolutions (1x1 and 3x3), Concat along the
// channels, then a consumer; the Concat writes each input into its slice of the output, in the
// convolutions' layout when they share one. Seeded random widths (multiples of 16 and not, so
// that oneDNN picks channels-last or blocked layouts), batches, a boundary input among the
// Concat's inputs, the Concat along another axis, and its output read by two layers and returned.
TEST_F(CpuAccFusionTest, ConcatOfConvolutionOutputsMatchesCpuRef) {
  for (unsigned seed = 31; seed < 39; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    TestGraph g;
    const int64_t n = DrawInt(rng, 1, 4), c = DrawInt(rng, 3, 24), side = DrawInt(rng, 4, 12);
    g.SetInput("x", DrawTensor({n, c, side, side}, rng, -1.0f, 1.0f));
    const int64_t squeeze = DrawInt(rng, 4, 16);
    const int64_t e1 = DrawChance(rng, 0.5) ? 16 * DrawInt(rng, 1, 2) : DrawInt(rng, 4, 40);
    const int64_t e3 = DrawChance(rng, 0.3)   ? e1
                       : DrawChance(rng, 0.5) ? 16 * DrawInt(rng, 1, 2)
                                              : DrawInt(rng, 4, 40);
    AddConvBn(g, rng, "x", "squeeze", squeeze, 1, 1);
    AddConvBn(g, rng, "squeeze", "expand1", e1, 1, 1);
    AddConvBn(g, rng, "squeeze", "expand3", e3, 1, 3);
    std::vector<std::string> inputs{"expand1", "expand3"};
    const bool with_boundary_input = DrawChance(rng, 0.3);
    if (with_boundary_input) {
      g.SetInput("side", DrawTensor({n, 5, side, side}, rng, -1.0f, 1.0f));
      inputs.insert(inputs.begin() + DrawInt(rng, 0, 2), "side");
    }
    // Along the height only when the other dims agree (the same widths, no boundary input).
    const int64_t axis = !with_boundary_input && e1 == e3 ? 2 : 1;
    Shape y = g.ShapeOf("expand1");
    y[axis] = 0;
    for (const auto& input : inputs)
      y[axis] += g.ShapeOf(input)[axis];
    g.AddLayer("Concat", "concat", inputs, {"fire"}, {y}, {{"axis", axis}});
    g.AddLayer("Relu", "after", {"fire"}, {"fire_relu"}, {y});
    AddConvBn(g, rng, "fire", "next", 8, 1, 1);
    g.MarkOutput("fire");
    g.MarkOutput("fire_relu");
    g.MarkOutput("next");
    const auto notes = ExpectFusedUnfusedAndReferenceAgree(g, cpu_ref(), cpu_acc());
    ASSERT_EQ(notes.size(), g.layers().size());
    for (std::size_t k = 0; k < g.layers().size(); ++k) {
      if (g.layers()[k].op.name == "concat") {
        EXPECT_THAT(notes[k], HasSubstr("reorders into")) << g.Describe();
      }
    }
  }
}

// Pools after convolutions (channel-blocked outputs, channel counts that do not fill the blocks)
// and after a Concat of them (Inception's average-pool branch) run on CpuAcc's pooling kernel in
// the layout they get, and agree with CpuRef: max and both averages, padding, strides, ceil_mode.
TEST_F(CpuAccFusionTest, PoolsAfterConvolutionsAndConcatsMatchCpuRef) {
  for (unsigned seed = 41; seed < 53; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    TestGraph g;
    const int64_t n = DrawInt(rng, 1, 3), c = DrawInt(rng, 3, 16), side = DrawInt(rng, 5, 14);
    g.SetInput("x", DrawTensor({n, c, side, side}, rng, -1.0f, 1.0f));
    AddConvBn(g, rng, "x", "a", DrawInt(rng, 3, 40), 1, 3);
    std::string pooled = "a";
    if (DrawChance(rng, 0.5)) {
      AddConvBn(g, rng, "x", "b",
                DrawChance(rng, 0.5) ? 8 * DrawInt(rng, 1, 3) : DrawInt(rng, 3, 20), 1, 1);
      Shape y = g.ShapeOf("a");
      y[1] += g.ShapeOf("b")[1];
      g.AddLayer("Concat", "concat", {"a", "b"}, {"ab"}, {y}, {{"axis", int64_t{1}}});
      pooled = "ab";
    }
    const Shape x = g.ShapeOf(pooled);
    const int64_t kernel = DrawInt(rng, 2, 3), stride = DrawInt(rng, 1, 2);
    const int64_t pad = DrawInt(rng, 0, kernel - 1), ceil_mode = DrawChance(rng, 0.3) ? 1 : 0;
    const bool max = DrawChance(rng, 0.5);
    const int64_t span = side + 2 * pad - kernel;
    int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
    if (ceil_mode && (out - 1) * stride >= side + pad)  // ONNX: the last window starts inside
      --out;
    AttributeMap attributes{{"kernel_shape", Ints{kernel, kernel}},
                            {"strides", Ints{stride, stride}},
                            {"pads", Ints(4, pad)},
                            {"ceil_mode", ceil_mode}};
    if (!max && !ceil_mode)
      attributes["count_include_pad"] = int64_t{DrawChance(rng, 0.5) ? 1 : 0};
    g.AddLayer(max ? "MaxPool" : "AveragePool", "pool", {pooled}, {"pooled"},
               {{x[0], x[1], out, out}}, attributes);
    AddConvBn(g, rng, "pooled", "next", 8, 1, 1);
    g.MarkOutput("pooled");
    g.MarkOutput("next");
    const auto notes = ExpectFusedUnfusedAndReferenceAgree(g, cpu_ref(), cpu_acc());
    ASSERT_EQ(notes.size(), g.layers().size());
    for (std::size_t k = 0; k < g.layers().size(); ++k) {
      if (g.layers()[k].op.name == "pool") {
        EXPECT_THAT(notes[k], HasSubstr("CpuAcc's pooling")) << g.Describe();
      }
    }
  }
}

// MobileNetV2's Conv+BN+Relu6 (Clip), and the other new activations after a convolution, as
// post-ops of the convolution; the result equals the unfused one and CpuRef's.
TEST_F(CpuAccFusionTest, NewActivationsFuseIntoTheConvolution) {
  const unsigned seed = 31;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (const std::string type : {"Clip", "LeakyRelu", "HardSigmoid", "HardSwish"}) {
    SCOPED_TRACE(type);
    TestGraph g;
    g.SetInput("x", DrawTensor({1, 8, 10, 10}, rng, -2.0f, 2.0f));
    const Shape y = AddConvBn(g, rng, "x", "c", 16, 1);
    std::vector<std::string> inputs{"c"};
    AttributeMap attributes;
    if (type == "Clip") {
      g.AddConstant("zero", {{}, {0.0f}});
      g.AddConstant("six", {{}, {6.0f}});
      inputs = {"c", "zero", "six"};
    } else if (type == "LeakyRelu") {
      attributes["alpha"] = 0.1f;
    }
    g.AddLayer(type, "act", inputs, {"y"}, {y}, attributes);
    g.MarkOutput("y");
    const auto notes = ExpectFusedUnfusedAndReferenceAgree(g, cpu_ref(), cpu_acc());
    ASSERT_EQ(notes.size(), 3u);
    EXPECT_THAT(notes[0], HasSubstr("fused Conv+BatchNormalization+" + type));
  }
}

// Pad (zeros, spatial) before a Conv becomes the Conv's padding; a Pad with another constant,
// or padding channels, is computed (fill + reorder) and then convolved.
TEST_F(CpuAccFusionTest, ZeroSpatialPadFoldsIntoTheNextConvolution) {
  Rng rng(41);
  for (const bool foldable : {true, false}) {
    SCOPED_TRACE(foldable ? "foldable" : "not foldable");
    TestGraph g;
    g.SetInput("x", DrawTensor({2, 4, 9, 7}, rng, -1.0f, 1.0f));
    g.AddInt64Constant("pads",
                       foldable ? Ints{0, 0, 1, 2, 0, 0, 2, 0} : Ints{0, 1, 1, 0, 0, 0, 0, 1});
    g.AddConstant("value", {{}, {foldable ? 0.0f : 0.75f}});
    const Shape padded = foldable ? Shape{2, 4, 12, 9} : Shape{2, 5, 10, 8};
    g.AddLayer("Pad", "pad", {"x", "pads", "value"}, {"p"}, {padded});
    g.AddConstant("w", DrawTensor({6, padded[1], 3, 3}, rng, -0.5f, 0.5f));
    const Shape y{2, 6, padded[2], padded[3]};  // 3x3 with pads 1 keeps the spatial dims
    g.AddLayer("Conv", "conv", {"p", "w"}, {"y"}, {y},
               {{"kernel_shape", Ints{3, 3}}, {"pads", Ints{1, 1, 1, 1}}});
    g.MarkOutput("y");
    const auto notes = ExpectFusedUnfusedAndReferenceAgree(g, cpu_ref(), cpu_acc());
    ASSERT_EQ(notes.size(), 2u);
    if (foldable)
      EXPECT_THAT(notes[0], HasSubstr("folded into the padding of Conv node 'conv'"));
    else
      EXPECT_THAT(notes[0], HasSubstr("fill + reorder"));
  }
}

// Sub/Div with the first operand broadcasting and Add of two blocked tensors inside a run.
TEST_F(CpuAccFusionTest, BinaryOpsInsideARunMatchCpuRef) {
  Rng rng(51);
  TestGraph g;
  g.SetInput("x", DrawTensor({2, 16, 6, 6}, rng, -1.0f, 1.0f));
  const Shape y = AddConvBn(g, rng, "x", "a", 16, 1);
  AddConvBn(g, rng, "x", "b", 16, 1);
  // Sigmoids: the sum is positive, a divisor far from 0.
  g.AddLayer("Sigmoid", "ra", {"a"}, {"a_r"}, {y});
  g.AddLayer("Sigmoid", "rb", {"b"}, {"b_r"}, {y});
  g.AddLayer("Add", "add", {"a_r", "b_r"}, {"s"}, {y});  // two blocked tensors
  g.AddConstant("row", DrawTensor({1, 16, 1, 1}, rng, 0.5f, 1.5f));
  g.AddLayer("Div", "div", {"row", "s"}, {"q"}, {y});  // the first operand broadcasts
  g.AddConstant("col", DrawTensor({6, 1}, rng, -1.0f, 1.0f));
  g.AddLayer("Sub", "sub", {"q", "col"}, {"d"}, {y});
  g.MarkOutput("d");
  const auto notes = ExpectFusedUnfusedAndReferenceAgree(g, cpu_ref(), cpu_acc());
  ASSERT_EQ(notes.size(), g.layers().size());
  EXPECT_THAT(notes[7], HasSubstr("input 0 broadcast by"));
}

// Dropout inside a run is the same bytes as its input in whatever layout it has (blocked after
// a convolution): the pool after it, an output that is the Dropout itself, and an output read
// through it from a boundary input all keep CpuRef's values.
TEST_F(CpuAccFusionTest, DropoutKeepsItsInputsLayoutInsideARun) {
  Rng rng(81);
  TestGraph g;
  g.SetInput("x", DrawTensor({2, 16, 8, 8}, rng, -1.0f, 1.0f));
  const Shape y = AddConvBn(g, rng, "x", "c", 16, 1);
  g.AddLayer("Dropout", "drop", {"c"}, {"d"}, {y});
  g.AddLayer("MaxPool", "pool", {"d"}, {"p"}, {{2, 16, 4, 4}},
             {{"kernel_shape", Ints{2, 2}}, {"strides", Ints{2, 2}}});
  g.AddLayer("Dropout", "drop_input", {"x"}, {"x_copy"}, {{2, 16, 8, 8}});
  g.MarkOutput("p");
  g.MarkOutput("d");
  g.MarkOutput("x_copy");
  const auto notes = ExpectFusedUnfusedAndReferenceAgree(g, cpu_ref(), cpu_acc());
  ASSERT_EQ(notes.size(), g.layers().size());
  EXPECT_THAT(notes[2], HasSubstr("the same bytes as its input"));
}

// ---- the two-thread policy -------------------------------------------------------------------

// With intra_op_threads 2, a layer below the work thresholds runs on one thread and a large one
// on two; placement notes say which. (Release only: under sanitizers libgomp's worker threads
// are not instrumented (TSan) or crash LeakSanitizer at exit (ASan), see cpu_acc_backend_test.)
TEST_F(CpuAccFusionTest, SmallLayersRunOnOneThreadLargeOnesOnTwo) {
#if defined(BACKPLANE_TSAN_BUILD) || defined(BACKPLANE_ASAN_BUILD)
  GTEST_SKIP() << "libgomp threads under a sanitizer";
#else
  BACKPLANE_REQUIRE_CPUS(2);
  // The per-layer rule, without the batch split that may replace it (batch_split.hpp).
  ASSERT_TRUE(
      cpu_acc()
          .UpdateOptions({{"intra_op_threads", int64_t{2}}, {"batch_split", std::string("never")}})
          .ok());
  Rng rng(61);
  TestGraph g;
  g.SetInput("small", DrawTensor({1, 4, 6, 6}, rng, -1.0f, 1.0f));
  AddConvBn(g, rng, "small", "s", 4, 1);  // 2 * 144 * 36 FLOPs: far below
  g.SetInput("large", DrawTensor({4, 32, 28, 28}, rng, -1.0f, 1.0f));
  AddConvBn(g, rng, "large", "l", 32, 1);  // 2 * 100352 * 288 FLOPs: far above
  g.MarkOutput("s");
  g.MarkOutput("l");
  const auto notes = ExpectFusedUnfusedAndReferenceAgree(g, cpu_ref(), cpu_acc());
  ASSERT_TRUE(
      cpu_acc()
          .UpdateOptions({{"intra_op_threads", int64_t{1}}, {"batch_split", std::string("auto")}})
          .ok());
  ASSERT_EQ(notes.size(), 4u);
  EXPECT_THAT(notes[0], HasSubstr("on 1 thread (too little work for more)"));
  EXPECT_THAT(notes[2], HasSubstr("on 2 threads"));
#endif
}

// The rule as docs/performance.md states it, on seeded random layers: a Conv of at least 1 MFLOP,
// a MatMul of at least 0.5 MFLOP, or another layer of at least 64K output elements, runs on
// intra_op_threads threads; anything smaller on one. The work is computed here, independently of
// the compiler.
TEST_F(CpuAccFusionTest, TwoThreadPolicyFollowsTheDocumentedThresholds) {
#if defined(BACKPLANE_TSAN_BUILD) || defined(BACKPLANE_ASAN_BUILD)
  GTEST_SKIP() << "libgomp threads under a sanitizer";
#else
  BACKPLANE_REQUIRE_CPUS(2);
  const unsigned seed = 71;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  // The per-layer rule, without the batch split that may replace it (batch_split.hpp).
  ASSERT_TRUE(
      cpu_acc()
          .UpdateOptions({{"intra_op_threads", int64_t{2}}, {"batch_split", std::string("never")}})
          .ok());
  for (int iteration = 0; iteration < 40; ++iteration) {
    TestGraph g;
    double work = 0, threshold = 0;
    const int kind = DrawInt(rng, 0, 2);
    if (kind == 0) {  // Conv k x k, c -> m channels, stride 1, no padding
      const int64_t c = DrawInt(rng, 1, 32), m = DrawInt(rng, 1, 32), k = DrawInt(rng, 1, 3);
      const int64_t h = DrawInt(rng, k, 40), n = DrawInt(rng, 1, 2);
      const Shape y{n, m, h - k + 1, h - k + 1};
      g.SetInput("x", DrawTensor({n, c, h, h}, rng, -1.0f, 1.0f));
      g.AddConstant("w", DrawTensor({m, c, k, k}, rng, -1.0f, 1.0f));
      g.AddLayer("Conv", "layer", {"x", "w"}, {"y"}, {y}, {{"kernel_shape", Ints{k, k}}});
      work = 2.0 * static_cast<double>(ElementCount(y)) * static_cast<double>(c * k * k);
      threshold = 1e6;
    } else if (kind == 1) {  // MatMul [m, k] x [k, n]
      const int64_t m = DrawInt(rng, 1, 64), k = DrawInt(rng, 1, 512), n = DrawInt(rng, 1, 256);
      g.SetInput("a", DrawTensor({m, k}, rng, -1.0f, 1.0f));
      g.AddConstant("b", DrawTensor({k, n}, rng, -1.0f, 1.0f));
      g.AddLayer("MatMul", "layer", {"a", "b"}, {"y"}, {{m, n}});
      work = 2.0 * static_cast<double>(m * k * n);
      threshold = 0.5e6;
    } else {  // an element-wise layer
      const Shape shape{DrawInt(rng, 1, 4), DrawInt(rng, 1, 64), DrawInt(rng, 1, 64),
                        DrawInt(rng, 1, 32)};
      g.SetInput("x", DrawTensor(shape, rng, -1.0f, 1.0f));
      g.AddLayer(DrawChance(rng, 0.5) ? "Relu" : "HardSwish", "layer", {"x"}, {"y"}, {shape});
      work = static_cast<double>(ElementCount(shape));
      threshold = 64e3;
    }
    g.MarkOutput("y");
    std::vector<std::string> notes;
    auto result = g.RunCompiled(cpu_acc(), &notes);
    ASSERT_TRUE(result.ok()) << result.error().ToString() << g.Describe();
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_THAT(notes[0], HasSubstr(work >= threshold ? "on 2 threads" : "on 1 thread"))
        << "case " << iteration << ", work " << work << g.Describe();
  }
  ASSERT_TRUE(
      cpu_acc()
          .UpdateOptions({{"intra_op_threads", int64_t{1}}, {"batch_split", std::string("auto")}})
          .ok());
#endif
}

}  // namespace
}  // namespace backplane::cpu_acc_test
