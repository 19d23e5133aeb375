// CpuAcc as a backend: options, refusals with reasons, compiled runs of real networks (MNIST,
// an MLP, a LeNet) with their layer notes, concurrency, dynamic shapes.
#include <gmock/gmock.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "backplane/onnx/network.hpp"
#include "cpu_acc_test_util.hpp"
#include "sanitizer_build.hpp"
#include "test_util.hpp"

namespace backplane::cpu_acc_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Ints = std::vector<int64_t>;

using CpuAccBackendTest = CpuAccTest;

TEST_F(CpuAccBackendTest, DescribesAndValidatesIntraOpThreads) {
  const auto options = cpu_acc().DescribeOptions();
  ASSERT_EQ(options.size(), 2u);
  EXPECT_EQ(options[0].name, "intra_op_threads");
  EXPECT_EQ(options[0].type, OptionType::kInt64);
  EXPECT_EQ(std::get<int64_t>(options[0].default_value), 1);
  EXPECT_EQ(options[1].name, "batch_split");
  EXPECT_EQ(options[1].type, OptionType::kString);
  EXPECT_EQ(std::get<std::string>(options[1].default_value), "auto");
  Status split = cpu_acc().UpdateOptions({{"batch_split", std::string("sometimes")}});
  EXPECT_EQ(split.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(split.message(), HasSubstr("'batch_split' must be auto, always or never, got "
                                         "'sometimes'"));
  EXPECT_EQ(cpu_acc().UpdateOptions({{"batch_split", int64_t{1}}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(std::get<std::string>(cpu_acc().GetOption("batch_split").value()), "auto");

  Status zero = cpu_acc().UpdateOptions({{"intra_op_threads", int64_t{0}}});
  EXPECT_EQ(zero.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.message(), HasSubstr("must be 1 to "));  // CpuAccThreadsTest: the bound
  EXPECT_THAT(zero.message(), HasSubstr("got 0"));
  EXPECT_EQ(cpu_acc().UpdateOptions({{"intra_op_threads", true}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu_acc().UpdateOptions({{"intra_op_thread", int64_t{2}}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(std::get<int64_t>(cpu_acc().GetOption("intra_op_threads").value()), 1);

  // Under sanitizers, 1. TSan: libgomp is not instrumented, its worker threads' hand-offs look
  // like races. ASan: LeakSanitizer's exit-time tracer crashes (signal 11, "LeakSanitizer has
  // encountered a fatal error") when libgomp's idle worker threads are still alive (measured).
#if defined(BACKPLANE_TSAN_BUILD) || defined(BACKPLANE_ASAN_BUILD)
  constexpr int64_t kThreads = 1;
#else
  const int64_t kThreads = std::min(2, FindUsableCpus().count);
#endif
  ASSERT_TRUE(cpu_acc().UpdateOptions({{"intra_op_threads", kThreads}}).ok());
  EXPECT_EQ(std::get<int64_t>(cpu_acc().GetOption("intra_op_threads").value()), kThreads);
  // Workloads created now run with that many OpenMP threads; their results do not change.
  std::mt19937 rng(5);
  TestGraph graph;
  graph.AddInput("x", {4, 3, 17, 17}, rng);
  graph.AddLayer("MaxPool", "pool", {"x"}, {"y"}, {{4, 3, 8, 8}},
                 {{"kernel_shape", Ints{3, 3}}, {"strides", Ints{2, 2}}});
  graph.MarkOutput("y");
  auto want = graph.RunPerLayer(cpu_ref());
  auto got = graph.RunPerLayer(cpu_acc());
  ASSERT_TRUE(cpu_acc().UpdateOptions({{"intra_op_threads", int64_t{1}}}).ok());
  ASSERT_TRUE(want.ok() && got.ok());
  std::string mismatch;
  EXPECT_TRUE(AllClose(got->at("y").values, want->at("y").values, &mismatch)) << mismatch;
}

// SDK 1.3: CheckOptions, which the host asks before it prepares a network with values of its
// own, refuses what UpdateOptions refuses, in the same words (naming the option), and applies
// nothing.
TEST_F(CpuAccBackendTest, CheckOptionsRefusesWhatUpdateOptionsRefuses) {
  const IBackend& backend = cpu_acc().backend();
  const int64_t too_many = FindUsableCpus().count + 1;
  for (const BackendOptions& options :
       {BackendOptions{{"batch_split", std::string("sometimes")}},
        BackendOptions{{"intra_op_threads", int64_t{0}}},
        BackendOptions{{"intra_op_threads", too_many}}, BackendOptions{{"intra_op_threads", true}},
        BackendOptions{{"intra_op_thread", int64_t{1}}}}) {
    SCOPED_TRACE(options.begin()->first + "=" + ToString(options.begin()->second));
    const Status checked = backend.CheckOptions(options);
    EXPECT_EQ(checked.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(checked.message(), cpu_acc().UpdateOptions(options).message());
    EXPECT_EQ(cpu_acc().CheckNetworkOptions(options).message(), checked.message());
  }
  EXPECT_THAT(backend.CheckOptions({{"batch_split", std::string("sometimes")}}).message(),
              HasSubstr("option 'batch_split' must be auto, always or never, got 'sometimes'"));
  const Status zero = backend.CheckOptions({{"intra_op_threads", int64_t{0}}});
  EXPECT_THAT(zero.message(), HasSubstr("option 'intra_op_threads' must be 1 to "));
  EXPECT_THAT(zero.message(), HasSubstr("got 0"));

  const BackendOptions accepted{{"intra_op_threads", int64_t{1}},
                                {"batch_split", std::string("never")}};
  EXPECT_TRUE(backend.CheckOptions(accepted).ok());
  EXPECT_EQ(std::get<std::string>(cpu_acc().GetOption("batch_split").value()), "auto")
      << "checking applies nothing";
  EXPECT_EQ(std::get<int64_t>(cpu_acc().GetOption("intra_op_threads").value()), 1);
}

// SDK 1.3: the ...WithOptions calls given every option at the instance's values (here the
// declared defaults) prepare what the 1.0 and 1.1 calls prepare: the same notes, the same bytes.
TEST_F(CpuAccBackendTest, PreparingWithTheInstanceValuesEqualsPreparingWithout) {
  IBackend& backend = cpu_acc().backend();
  const BackendOptions options = cpu_acc().EffectiveOptions();
  EXPECT_EQ(options, (BackendOptions{{"batch_split", std::string("auto")},
                                     {"intra_op_threads", int64_t{1}}}));
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> weight(-0.5f, 0.5f);
  FloatTensor w{{8, 8, 3, 3}, std::vector<float>(8 * 8 * 3 * 3)};
  for (float& value : w.values)
    value = weight(rng);
  TestGraph graph;
  graph.AddInput("x", {1, 8, 12, 12}, rng);
  const void* w_data = graph.AddConstant("w", std::move(w));
  graph.AddLayer("Conv", "conv", {"x", "w"}, {"y"}, {{1, 8, 10, 10}},
                 {{"kernel_shape", Ints{3, 3}}});
  graph.AddLayer("Relu", "relu", {"y"}, {"z"}, {{1, 8, 10, 10}});
  graph.MarkOutput("z");
  const SubgraphDesc run = graph.Subgraph();
  const std::vector<ConstTensorView> inputs = graph.InputViews();
  auto execute = [&](IWorkload& workload, std::span<const ConstTensorView> given,
                     const TensorInfo& info) {
    std::vector<float> out(static_cast<std::size_t>(info.ElementCount()), NAN);
    const TensorView view{info, out.data()};
    EXPECT_TRUE(workload.Execute(given, {&view, 1}).ok());
    return out;
  };

  auto plain = backend.CompileSubgraph(run);
  auto with = backend.CompileSubgraphWithOptions(run, options);
  ASSERT_TRUE(plain.ok()) << plain.error().ToString();
  ASSERT_TRUE(with.ok()) << with.error().ToString();
  EXPECT_EQ(with->layer_notes, plain->layer_notes);
  EXPECT_EQ(execute(*with->workload, inputs, run.output_infos[0]),
            execute(*plain->workload, inputs, run.output_infos[0]));

  const OperatorDesc& conv = run.layers[0];
  auto layer_plain = backend.CreateWorkload(conv);
  auto layer_with = backend.CreateWorkloadWithOptions(conv, options);
  ASSERT_TRUE(layer_plain.ok()) << layer_plain.error().ToString();
  ASSERT_TRUE(layer_with.ok()) << layer_with.error().ToString();
  const ConstTensorView conv_inputs[] = {inputs[0], {conv.inputs[1], w_data}};
  EXPECT_EQ(execute(*layer_with.value(), conv_inputs, conv.outputs[0]),
            execute(*layer_plain.value(), conv_inputs, conv.outputs[0]));
}

OperatorDesc Op(std::string type, std::vector<Shape> inputs, std::vector<Shape> outputs,
                AttributeMap attributes = {}) {
  OperatorDesc op{.op_type = std::move(type), .name = "n", .attributes = std::move(attributes)};
  for (auto& shape : inputs) {
    op.inputs.push_back({DataType::kFloat32, std::move(shape)});
    op.constant_inputs.push_back(nullptr);
  }
  for (auto& shape : outputs)
    op.outputs.push_back({DataType::kFloat32, std::move(shape)});
  return op;
}

TEST_F(CpuAccBackendTest, RefusesWhatOneDnnCannotDoWithTheReason) {
  struct Case {
    OperatorDesc op;
    std::string reason;
  };
  OperatorDesc int_add = Op("Add", {{2}, {2}}, {{2}});
  int_add.inputs[0].type = DataType::kInt64;
  OperatorDesc reshape = Op("Reshape", {{2, 3}, {2}}, {{3, 2}});
  reshape.inputs[1].type = DataType::kInt64;
  const Case cases[] = {
      {Op("MaxPool", {{1, 1, 4, 4}}, {{1, 1, 2, 2}, {1, 1, 2, 2}}, {{"kernel_shape", Ints{2, 2}}}),
       "Indices is not supported"},
      {Op("Conv", {{1, 1, 3, 3, 3, 3}, {1, 1, 1, 1, 1, 1}}, {{1, 1, 3, 3, 3, 3}}),
       "1 to 3 spatial dims"},
      {Op("BatchNormalization", {{1, 2}, {2}, {2}, {2}, {2}}, {{1, 2}, {2}, {2}},
          {{"training_mode", int64_t{1}}}),
       "training_mode=1"},
      {Op("Dropout", {{2, 3}}, {{2, 3}, {2, 3}}), "the mask output (output 1)"},
      {reshape, "constant INT64"},
      {int_add, "FP32 only"},
      {Op("AveragePool", {{1, 1, 5, 5}}, {{1, 1, 3, 3}},
          {{"kernel_shape", Ints{2, 2}},
           {"strides", Ints{2, 2}},
           {"ceil_mode", int64_t{1}},
           {"count_include_pad", int64_t{1}}}),
       "count_include_pad=1"},
      {Op("Relu", {{0, 3}}, {{0, 3}}), "empty tensor"},
      {Op("LSTM", {{1}}, {{1}}), "does not implement op LSTM"},
  };
  for (const Case& c : cases) {
    const Status status = cpu_acc().IsSupported(c.op);
    EXPECT_EQ(status.code(), StatusCode::kUnimplemented) << Describe(c.op);
    EXPECT_THAT(status.message(), HasSubstr(c.reason)) << Describe(c.op);
  }
}

// The whole network as one run (what the host will offer once it calls CompileSubgraph).
SubgraphDesc WholeNetwork(const Network& network) {
  SubgraphDesc graph;
  for (const Node& node : network.nodes) {
    OperatorDesc op{.op_type = node.op_type, .name = node.name, .attributes = node.attributes};
    std::vector<std::string> inputs;
    for (const auto& input : node.inputs) {
      inputs.push_back(input);
      if (input.empty()) {
        op.inputs.push_back({});
        op.constant_inputs.push_back(nullptr);
        continue;
      }
      op.inputs.push_back(network.values.at(input));
      auto constant = network.constants.find(input);
      op.constant_inputs.push_back(constant == network.constants.end() ? nullptr
                                                                       : constant->second.data());
    }
    for (const auto& output : node.outputs)
      op.outputs.push_back(network.values.at(output));
    graph.layers.push_back(std::move(op));
    graph.layer_inputs.push_back(std::move(inputs));
    graph.layer_outputs.push_back(node.outputs);
  }
  for (const auto& input : network.inputs) {
    graph.inputs.push_back(input.name);
    graph.input_infos.push_back(input.info);
  }
  for (const auto& output : network.outputs) {
    graph.outputs.push_back(output.name);
    graph.output_infos.push_back(output.info);
  }
  return graph;
}

TEST_F(CpuAccBackendTest, CompilesMnistWholeWithFusedNotes) {
  const fs::path mnist = kData / "models" / "mnist";
  BACKPLANE_REQUIRE_PATH(mnist);
  auto test_case = LoadOnnxTestCase(mnist, 0);
  ASSERT_TRUE(test_case.ok()) << test_case.error().ToString();
  const Network& network = test_case->network;
  auto compiled = cpu_acc().CompileSubgraph(WholeNetwork(network));
  ASSERT_TRUE(compiled.ok()) << compiled.error().ToString();
  const auto& notes = compiled->layer_notes;
  ASSERT_EQ(notes.size(), network.nodes.size());
  std::string all;
  for (std::size_t i = 0; i < notes.size(); ++i)
    all += "\n  " + network.nodes[i].name + " (" + network.nodes[i].op_type + "): " + notes[i];
  RecordProperty("notes", all);
  // Conv + Add + Relu twice, MatMul + Add: 5 layers fused away; the Reshape is a view.
  EXPECT_EQ(std::count_if(notes.begin(), notes.end(),
                          [](const std::string& n) { return n.starts_with("fused into"); }),
            5)
      << all;
  EXPECT_THAT(all, HasSubstr("(Conv+Add+Relu)"));
  EXPECT_THAT(all, HasSubstr("(MatMul+Add)"));
  EXPECT_THAT(all, HasSubstr("no copy"));

  auto reference = runtime().LoadNetwork(test_case->network, {.backend_preferences = {"CpuRef"}});
  ASSERT_TRUE(reference.ok());
  std::vector<ConstTensorView> inputs{test_case->inputs[0].View()};
  auto want = runtime().Execute(reference.value(), inputs);
  ASSERT_TRUE(want.ok());
  const auto& expected = (*want)[0];

  // Many requests at once on the one workload: each with its own outputs, all equal.
  constexpr int kThreads = 4;
  const int runs = Iterations(100);
  std::vector<std::thread> threads;
  std::vector<std::string> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < runs; ++r) {
        std::vector<float> logits(10, NAN);
        const TensorView output{{DataType::kFloat32, {1, 10}}, logits.data()};
        Status status = compiled->workload->Execute(inputs, {&output, 1});
        std::string mismatch;
        if (!status.ok()) {
          failures[t] = status.ToString();
          return;
        }
        const auto want_values = expected.Elements<float>();
        if (!AllClose(logits, {want_values.begin(), want_values.end()}, &mismatch)) {
          failures[t] = mismatch;
          return;
        }
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  for (const auto& failure : failures)
    EXPECT_EQ(failure, "");
  EXPECT_TRUE(runtime().UnloadNetwork(reference.value()).ok());
}

TEST_F(CpuAccBackendTest, DeclinesRunsWithDynamicShapes) {
  std::mt19937 rng(1);
  TestGraph graph;
  graph.AddInput("x", {2, 4}, rng);
  graph.AddLayer("Relu", "relu", {"x"}, {"y"}, {{-1, 4}});
  graph.AddLayer("Sigmoid", "sigmoid", {"y"}, {"z"}, {{-1, 4}});
  graph.MarkOutput("z");
  auto compiled = cpu_acc().CompileSubgraph(graph.Subgraph());
  ASSERT_FALSE(compiled.ok());
  EXPECT_EQ(compiled.error().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(compiled.error().message(), HasSubstr("static shapes only"));
}

// A layer with a dynamic batch gets primitives per shape on first use.
TEST_F(CpuAccBackendTest, RunsALayerWithADynamicBatchPerShape) {
  std::mt19937 rng(2);
  TestGraph graph;
  graph.AddConstant("w", {{4, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}});
  graph.AddConstant("c", {{3}, {0.5f, -0.5f, 1}});
  graph.AddInput("x", {1, 4}, rng);
  graph.AddLayer("Gemm", "gemm", {"x", "w", "c"}, {"y"}, {{-1, 3}});
  OperatorDesc op = graph.layers()[0].op;
  op.inputs[0].shape = {-1, 4};
  auto reference = cpu_ref().CreateWorkload(op);
  auto workload = cpu_acc().CreateWorkload(op);
  ASSERT_TRUE(workload.ok()) << workload.error().ToString();
  for (int64_t batch : {1, 5, 1, 3}) {
    std::vector<float> x(batch * 4);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = 0.25f * static_cast<float>(i) - 1.0f;
    std::vector<ConstTensorView> inputs{{{DataType::kFloat32, {batch, 4}}, x.data()},
                                        {op.inputs[1], op.constant_inputs[1]},
                                        {op.inputs[2], op.constant_inputs[2]}};
    std::vector<float> want(batch * 3), got(batch * 3);
    const TensorView want_view{{DataType::kFloat32, {batch, 3}}, want.data()};
    const TensorView got_view{{DataType::kFloat32, {batch, 3}}, got.data()};
    ASSERT_TRUE(reference.value()->Execute(inputs, {&want_view, 1}).ok());
    Status status = workload.value()->Execute(inputs, {&got_view, 1});
    ASSERT_TRUE(status.ok()) << status.ToString();
    std::string mismatch;
    EXPECT_TRUE(AllClose(got, want, &mismatch)) << "batch " << batch << ": " << mismatch;
  }
}

TEST_F(CpuAccBackendTest, ExecuteRefusesTensorsOfOtherShapes) {
  const OperatorDesc op = Op("Relu", {{2, 3}}, {{2, 3}});
  auto workload = cpu_acc().CreateWorkload(op);
  ASSERT_TRUE(workload.ok());
  std::vector<float> x(6), y(4);
  const ConstTensorView input{{DataType::kFloat32, {2, 3}}, x.data()};
  const TensorView output{{DataType::kFloat32, {2, 2}}, y.data()};
  Status status = workload.value()->Execute({&input, 1}, {&output, 1});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("output 0 allocated as [2,2], compiled for FP32 [2,3]"));
}

// ---- timings of compiled runs (run with --gtest_also_run_disabled_tests) ---------------------

// y = relu(x W + b) ... as Gemm + Relu layers (the MLP 784-512-512-10 of the ORT comparison).
void AddDense(TestGraph& g, std::mt19937& rng, const std::string& name, const std::string& in,
              int64_t batch, int64_t inputs, int64_t outputs, bool relu, std::string* out) {
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(inputs)));
  FloatTensor w{{inputs, outputs}, std::vector<float>(inputs * outputs)};
  for (float& v : w.values)
    v = normal(rng);
  g.AddConstant(name + "_w", std::move(w));
  g.AddConstant(name + "_b", {{outputs}, std::vector<float>(outputs, 0.1f)});
  g.AddLayer("Gemm", name, {in, name + "_w", name + "_b"}, {name + "_h"}, {{batch, outputs}});
  *out = name + "_h";
  if (relu) {
    g.AddLayer("Relu", name + "_relu", {*out}, {name + "_a"}, {{batch, outputs}});
    *out = name + "_a";
  }
}

void MakeMlp(TestGraph& g, std::mt19937& rng, int64_t batch) {
  g.AddInput("x", {batch, 784}, rng);
  std::string current = "x";
  AddDense(g, rng, "fc1", current, batch, 784, 512, true, &current);
  AddDense(g, rng, "fc2", current, batch, 512, 512, true, &current);
  AddDense(g, rng, "fc3", current, batch, 512, 10, false, &current);
  g.MarkOutput(current);
}

void MakeLeNet(TestGraph& g, std::mt19937& rng, int64_t batch) {
  std::uniform_real_distribution<float> value(-0.2f, 0.2f);
  auto random = [&](Shape shape) {
    FloatTensor t{shape, std::vector<float>(ElementCount(shape))};
    for (float& v : t.values)
      v = value(rng);
    return t;
  };
  g.AddInput("x", {batch, 1, 28, 28}, rng);
  g.AddConstant("c1w", random({6, 1, 5, 5}));
  g.AddConstant("c1b", random({6}));
  g.AddConstant("c2w", random({16, 6, 5, 5}));
  g.AddConstant("c2b", random({16}));
  const AttributeMap pool{{"kernel_shape", Ints{2, 2}}, {"strides", Ints{2, 2}}};
  g.AddLayer("Conv", "conv1", {"x", "c1w", "c1b"}, {"c1"}, {{batch, 6, 28, 28}},
             {{"kernel_shape", Ints{5, 5}}, {"pads", Ints{2, 2, 2, 2}}});
  g.AddLayer("Relu", "relu1", {"c1"}, {"r1"}, {{batch, 6, 28, 28}});
  g.AddLayer("MaxPool", "pool1", {"r1"}, {"p1"}, {{batch, 6, 14, 14}}, pool);
  g.AddLayer("Conv", "conv2", {"p1", "c2w", "c2b"}, {"c2"}, {{batch, 16, 10, 10}},
             {{"kernel_shape", Ints{5, 5}}});
  g.AddLayer("Relu", "relu2", {"c2"}, {"r2"}, {{batch, 16, 10, 10}});
  g.AddLayer("MaxPool", "pool2", {"r2"}, {"p2"}, {{batch, 16, 5, 5}}, pool);
  g.AddLayer("Flatten", "flatten", {"p2"}, {"f"}, {{batch, 400}}, {{"axis", int64_t{1}}});
  std::string current = "f";
  AddDense(g, rng, "fc1", current, batch, 400, 120, true, &current);
  AddDense(g, rng, "fc2", current, batch, 120, 84, true, &current);
  AddDense(g, rng, "fc3", current, batch, 84, 10, false, &current);
  g.MarkOutput(current);
}

TEST_F(CpuAccBackendTest, CompiledMlpAndLeNetMatchCpuRefLayerByLayer) {
  // Batch 32: LeNet's convolutions are large enough that the compiler times oneDNN's
  // implementations and picks one (compiler.cpp, kTuneFlops).
  for (int64_t batch : {1, 3, 32}) {
    for (bool lenet : {false, true}) {
      if (batch == 32 && !lenet)
        continue;
      std::mt19937 rng(static_cast<unsigned>(batch) + (lenet ? 100 : 0));
      TestGraph graph;
      if (lenet)
        MakeLeNet(graph, rng, batch);
      else
        MakeMlp(graph, rng, batch);
      auto want = graph.RunPerLayer(cpu_ref());
      std::vector<std::string> notes;
      auto got = graph.RunCompiled(cpu_acc(), &notes);
      ASSERT_TRUE(want.ok()) << want.error().ToString();
      ASSERT_TRUE(got.ok()) << got.error().ToString();
      const std::string& name = graph.outputs()[0];
      std::string mismatch;
      EXPECT_TRUE(AllClose(got->at(name).values, want->at(name).values, &mismatch))
          << (lenet ? "LeNet" : "MLP") << " batch " << batch << ": " << mismatch;
      // Every Relu rides on the layer before it.
      for (std::size_t i = 0; i < notes.size(); ++i) {
        if (graph.layers()[i].op.op_type == "Relu") {
          EXPECT_THAT(notes[i], HasSubstr("fused into")) << graph.layers()[i].op.name;
        }
      }
    }
  }
}

// ---- Weights laid out once per backend instance (backends/cpu_acc/constant_cache.hpp) ----

// Gemm Y = X W, W the constant `w` ([k, n]), X [-1, k]: the per-layer workload compiles a
// program for each batch it meets (RunsALayerWithADynamicBatchPerShape).
OperatorDesc SymbolicBatchGemm(const std::vector<float>& w, int64_t k, int64_t n) {
  OperatorDesc op{.op_type = "Gemm", .name = "gemm"};
  op.inputs = {{DataType::kFloat32, {-1, k}}, {DataType::kFloat32, {k, n}}};
  op.outputs = {{DataType::kFloat32, {-1, n}}};
  op.constant_inputs = {nullptr, w.data()};
  return op;
}

std::vector<float> Ramp(std::size_t count, float step, float offset) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i)
    values[i] = offset + step * static_cast<float>(i % 97);
  return values;
}

// Runs the Gemm of `op` on `batch` rows (fixed values); its output, and in `want` X W computed
// here.
std::vector<float> RunGemm(loader::Workload& workload, const OperatorDesc& op, int64_t batch,
                           std::vector<float>* want) {
  const int64_t k = op.inputs[1].shape[0], n = op.inputs[1].shape[1];
  const std::vector<float> x = Ramp(static_cast<std::size_t>(batch * k), 0.01f, -0.4f);
  const auto* w = static_cast<const float*>(op.constant_inputs[1]);
  want->assign(static_cast<std::size_t>(batch * n), 0.0f);
  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t i = 0; i < k; ++i)
        sum += static_cast<double>(x[r * k + i]) * w[i * n + j];
      (*want)[r * n + j] = static_cast<float>(sum);
    }
  }
  std::vector<float> got(want->size());
  const std::vector<ConstTensorView> inputs{{{DataType::kFloat32, {batch, k}}, x.data()},
                                            {op.inputs[1], op.constant_inputs[1]}};
  const TensorView output{{DataType::kFloat32, {batch, n}}, got.data()};
  if (Status status = workload.Execute(inputs, {&output, 1}); !status.ok())
    ADD_FAILURE() << "batch " << batch << ": " << status.ToString();
  return got;
}

// A layer met at six more batch sizes keeps six more programs, not six more copies of its 8 MB
// of weights laid out for oneDNN (before: 56 MB of resident memory a program for the wide MLP).
TEST_F(CpuAccBackendTest, ProgramsOfManyBatchSizesShareOneCopyOfTheWeights) {
  constexpr int64_t k = 1024, n = 2048;
  const std::vector<float> w = Ramp(static_cast<std::size_t>(k * n), 0.001f, -0.05f);
  const OperatorDesc op = SymbolicBatchGemm(w, k, n);
  auto workload = cpu_acc().CreateWorkload(op);
  ASSERT_TRUE(workload.ok()) << workload.error().ToString();
  std::vector<std::vector<float>> got(9), want(9);
  // Batch 1 and 2 first: oneDNN may want other layouts for one or two rows.
  for (int64_t batch : {1, 2})
    got[batch] = RunGemm(**workload, op, batch, &want[batch]);
  ReleaseFreedMemory();  // so that new programs cannot hide in memory freed before
  const int64_t before = testing::ProcStatusBytes(getpid(), "VmRSS").value();
  // Only the programs: the answers (and, under TSan, their shadow) are computed after.
  for (int64_t batch = 3; batch <= 8; ++batch) {
    std::vector<float> x = Ramp(static_cast<std::size_t>(batch * k), 0.01f, -0.4f);
    std::vector<float> y(static_cast<std::size_t>(batch * n));
    const std::vector<ConstTensorView> inputs{{{DataType::kFloat32, {batch, k}}, x.data()},
                                              {op.inputs[1], op.constant_inputs[1]}};
    const TensorView output{{DataType::kFloat32, {batch, n}}, y.data()};
    ASSERT_TRUE((*workload)->Execute(inputs, {&output, 1}).ok());
  }
  ReleaseFreedMemory();  // what compiling used and freed is not a program's
  const int64_t grown = testing::ProcStatusBytes(getpid(), "VmRSS").value() - before;
  const int64_t weight_bytes = k * n * static_cast<int64_t>(sizeof(float));
  EXPECT_LT(grown, weight_bytes / 2) << "6 programs grew the resident set by " << grown
                                     << " bytes; the weights are " << weight_bytes;
  // And every batch size computes with them.
  for (int64_t batch = 1; batch <= 8; ++batch) {
    if (batch > 2)
      got[batch] = RunGemm(**workload, op, batch, &want[batch]);
    std::string mismatch;
    EXPECT_TRUE(AllClose(got[batch], want[batch], &mismatch))
        << "batch " << batch << ": " << mismatch;
  }
}

// Weights are found by their address, which is sound only while a program holds them: once the
// last is gone, new bytes at the same address (the next network's) are laid out anew, and two
// networks alive at once each compute with their own.
TEST_F(CpuAccBackendTest, WeightsAtAnAddressReusedAfterTheirProgramsAreGoneAreLaidOutAnew) {
  constexpr int64_t k = 64, n = 48;
  std::vector<float> w = Ramp(static_cast<std::size_t>(k * n), 0.01f, -0.3f);
  const OperatorDesc op = SymbolicBatchGemm(w, k, n);
  std::vector<float> want;
  std::string mismatch;
  {
    auto first = cpu_acc().CreateWorkload(op);
    ASSERT_TRUE(first.ok()) << first.error().ToString();
    for (int64_t batch : {4, 1})
      EXPECT_TRUE(AllClose(RunGemm(**first, op, batch, &want), want, &mismatch)) << mismatch;
  }
  // The same address, other bytes: what a network loaded where an unloaded one lived sees.
  std::ranges::copy(Ramp(w.size(), -0.02f, 0.5f), w.begin());
  auto second = cpu_acc().CreateWorkload(op);
  ASSERT_TRUE(second.ok()) << second.error().ToString();
  const std::vector<float> other_w = Ramp(w.size(), 0.03f, -1.0f);
  const OperatorDesc other_op = SymbolicBatchGemm(other_w, k, n);
  auto other = cpu_acc().CreateWorkload(other_op);
  ASSERT_TRUE(other.ok()) << other.error().ToString();
  for (int64_t batch : {4, 1, 3}) {
    EXPECT_TRUE(AllClose(RunGemm(**second, op, batch, &want), want, &mismatch))
        << "batch " << batch << ": " << mismatch;
    EXPECT_TRUE(AllClose(RunGemm(**other, other_op, batch, &want), want, &mismatch))
        << "the other network, batch " << batch << ": " << mismatch;
  }
}

double MedianMicroseconds(loader::Workload& workload, std::span<const ConstTensorView> inputs,
                          std::span<const TensorView> outputs, int runs) {
  std::vector<double> times;
  for (int r = 0; r < runs + 20; ++r) {
    const auto start = std::chrono::steady_clock::now();
    if (!workload.Execute(inputs, outputs).ok())
      return -1;
    const auto end = std::chrono::steady_clock::now();
    if (r >= 20)  // warm-up
      times.push_back(std::chrono::duration<double, std::micro>(end - start).count());
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

double TimeCompiled(loader::BackendInstance& backend, const SubgraphDesc& subgraph,
                    const std::vector<ConstTensorView>& inputs, const Shape& output_shape,
                    int runs) {
  auto compiled = backend.CompileSubgraph(subgraph);
  if (!compiled.ok()) {
    ADD_FAILURE() << compiled.error().ToString();
    return -1;
  }
  std::vector<float> y(ElementCount(output_shape));
  const TensorView output{{DataType::kFloat32, output_shape}, y.data()};
  return MedianMicroseconds(*compiled->workload, inputs, {&output, 1}, runs);
}

// Single-thread medians of whole compiled runs (what the host gets once it calls
// CompileSubgraph), printed for the record. ONNX Runtime's figures for the same models are in
// docs/performance.md ("CpuAcc against ONNX Runtime"); compare with bench/ort_compare.sh, which
// times both sides in one run on the same machine, not with this test's numbers.
TEST_F(CpuAccBackendTest, DISABLED_PrintsCompiledRunTimings) {
  for (int64_t batch : {1, 64}) {
    for (bool lenet : {false, true}) {
      std::mt19937 rng(7);
      TestGraph graph;
      if (lenet)
        MakeLeNet(graph, rng, batch);
      else
        MakeMlp(graph, rng, batch);
      const double us = TimeCompiled(cpu_acc(), graph.Subgraph(), graph.InputViews(),
                                     graph.ShapeOf(graph.outputs()[0]), batch == 1 ? 5000 : 500);
      std::printf("%-6s b%-3lld compiled run, 1 thread: median %8.1f us\n", lenet ? "LeNet" : "MLP",
                  static_cast<long long>(batch), us);
    }
  }
  const fs::path mnist = kData / "models" / "mnist";
  BACKPLANE_REQUIRE_PATH(mnist);
  auto test_case = LoadOnnxTestCase(mnist, 0);
  ASSERT_TRUE(test_case.ok());
  const std::vector<ConstTensorView> inputs{test_case->inputs[0].View()};
  const double us =
      TimeCompiled(cpu_acc(), WholeNetwork(test_case->network), inputs, {1, 10}, 5000);
  std::printf("MNIST  b1   compiled run, 1 thread: median %8.1f us\n", us);
}

}  // namespace
}  // namespace backplane::cpu_acc_test
