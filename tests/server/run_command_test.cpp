// `backplane run`, run as a user runs it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "backplane/onnx/network.hpp"
#include "onnx/model_builder.hpp"
#include "sanitizer_build.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

const fs::path kData = BACKPLANE_SHARED_DATA;

// The real executable, as a user runs it (stdout and stderr).
testing::CommandResult RunBackplane(const std::string& arguments) {
  return testing::RunCommand(std::string(BACKPLANE_EXECUTABLE) + " " + arguments + " 2>&1");
}

// Backends: a directory holding only CpuRef.
class RunCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BACKPLANE_REQUIRE_PATH(kData / "onnx-node");
    fs::create_symlink(testing::CpuRefBackend(), backends_ / "Backplane_CpuRef_backend.so");
  }
  std::string Backends() const { return "--backends " + backends_.path().string(); }
  testing::TempDir backends_;
};

TEST_F(RunCommandTest, TestDataPassesAndSaysWhereEachLayerRan) {
  const fs::path gemm = kData / "onnx-node" / "test_gemm_all_attributes";
  testing::CommandResult result =
      RunBackplane("run " + (gemm / "model.onnx").string() + " --test-data " + gemm.string() + " " +
                   Backends() + " --repeat 3");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("Gemm                 on CpuRef (generation"));
  // Microseconds with one decimal; the placement after the runs (what they compiled shows).
  EXPECT_THAT(result.output,
              ContainsRegex("time per run: median [0-9]+\\.[0-9] µs, min [0-9]+\\.[0-9] µs, "
                            "max [0-9]+\\.[0-9] µs over 3 run\\(s\\)\n"));
  EXPECT_LT(result.output.find("time per run"), result.output.find("layer "));
  EXPECT_THAT(result.output, HasSubstr("test_data_set_0 output 0 (y): pass, max abs error"));
  EXPECT_THAT(result.output, Not(HasSubstr("why not")));  // CpuRef was the first asked
}

TEST_F(RunCommandTest, MismatchingTestDataFailsWithExitOne) {
  // MNIST's expected outputs are one-hot labels, not logits: a comparison must fail.
  const fs::path mnist = kData / "models" / "mnist";
  testing::CommandResult result = RunBackplane("run " + (mnist / "model.onnx").string() +
                                               " --test-data " + mnist.string() + " " + Backends());
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output, HasSubstr("FAIL, max abs error"));
  EXPECT_THAT(result.output, HasSubstr("differ from the test data beyond atol"));
}

TEST_F(RunCommandTest, WritesOutputsThatMatchTheExpectedOnes) {
  const fs::path conv = kData / "onnx-node" / "test_conv_with_strides_padding";
  testing::TempDir out;
  testing::CommandResult result =
      RunBackplane("run " + (conv / "model.onnx").string() + " --input " +
                   (conv / "test_data_set_0" / "input_0.pb").string() + " --input " +
                   (conv / "test_data_set_0" / "input_1.pb").string() + " --output-dir " +
                   out.path().string() + " " + Backends());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto written = ReadTensorProtoFile(out / "output_0.pb");
  auto expected = ReadTensorProtoFile(conv / "test_data_set_0" / "output_0.pb");
  ASSERT_TRUE(written.ok() && expected.ok());
  ASSERT_EQ(written->info(), expected->info());
  const auto a = written->Elements<float>();
  const auto b = expected->Elements<float>();
  for (std::size_t i = 0; i < b.size(); ++i)
    EXPECT_NEAR(a[i], b[i], 1e-4 + 1e-3 * std::abs(b[i]));
}

TEST_F(RunCommandTest, BadModelsAndInputsExitOneNamingTheProblem) {
  testing::TempDir dir;
  testing::WriteFile(dir / "model.onnx", "not a protobuf at all");
  testing::CommandResult garbage =
      RunBackplane("run " + (dir / "model.onnx").string() + " " + Backends());
  EXPECT_EQ(garbage.exit_code, 1);
  EXPECT_THAT(garbage.output, HasSubstr("is not a valid ONNX model"));

  const fs::path relu = kData / "onnx-node" / "test_relu";
  testing::CommandResult missing_input =
      RunBackplane("run " + (relu / "model.onnx").string() + " " + Backends());
  EXPECT_EQ(missing_input.exit_code, 1);
  EXPECT_THAT(missing_input.output, HasSubstr("has 1 input(s) (x), 0 input file(s) given"));

  testing::CommandResult unknown_backend =
      RunBackplane("run " + (relu / "model.onnx").string() + " --prefer GpuAcc --input " +
                   (relu / "test_data_set_0" / "input_0.pb").string() + " " + Backends());
  EXPECT_EQ(unknown_backend.exit_code, 1);
  EXPECT_THAT(unknown_backend.output, HasSubstr("GpuAcc names no backend"));
}

// SDK 1.1: a run of layers that its backend compiled into one workload still prints one line per
// original layer, with what the backend did to it after the usual prefix; a layer that ran on
// its own prints exactly as before.
TEST_F(RunCommandTest, CompiledLayersKeepOneLineEachAndSayTheyWereFused) {
  fs::create_symlink(testing::Fixture("Subgraph"), backends_ / "Test_Subgraph_backend.so");
  testing::TempDir dir;
  testing::ModelBuilder model;  // y = (Relu(x) + x)^2: Relu and Add on TestSubgraph, Mul on CpuRef
  model.Input("x", {4}).Output("y", {4});
  model.Node("Relu", {"x"}, {"h"}, "relu");
  model.Node("Add", {"h", "x"}, {"s"}, "add");
  model.Node("Mul", {"s", "s"}, {"y"}, "square");
  testing::WriteFile(dir / "model.onnx", model.Serialize());
  Tensor x(TensorInfo{DataType::kFloat32, {4}});
  const float values[] = {-2, -1, 1, 2};
  std::memcpy(x.data(), values, sizeof(values));
  ASSERT_TRUE(WriteTensorProtoFile(dir / "x.pb", x, "x").ok());

  testing::CommandResult result = RunBackplane(
      "run " + (dir / "model.onnx").string() + " --input " + (dir / "x.pb").string() +
      " --prefer TestSubgraph,CpuRef --output-dir " + (dir / "out").string() + " " + Backends());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output,
              ContainsRegex("layer relu +Relu +on TestSubgraph \\(generation [0-9]+\\) "
                            "\\[fused into relu \\(Relu\\+Add\\)\\]\n"));
  EXPECT_THAT(result.output,
              ContainsRegex("layer add +Add +on TestSubgraph \\(generation [0-9]+\\) "
                            "\\[fused into relu \\(Relu\\+Add\\)\\]\n"));
  EXPECT_THAT(
      result.output,
      ContainsRegex("layer square +Mul +on CpuRef \\(generation [0-9]+\\)\n"
                    "  why not TestSubgraph: TestSubgraph runs Identity, Relu, Add only\n"));
  auto y = ReadTensorProtoFile(dir / "out" / "output_0.pb");
  ASSERT_TRUE(y.ok()) << y.error().ToString();
  EXPECT_THAT(y->Elements<float>(), ::testing::ElementsAre(4, 1, 4, 16));
}

// x = (-2, -1, 1, 2), FP32[4], as a TensorProto file.
void WriteInputX(const fs::path& file) {
  Tensor x(TensorInfo{DataType::kFloat32, {4}});
  const float values[] = {-2, -1, 1, 2};
  std::memcpy(x.data(), values, sizeof(values));
  ASSERT_TRUE(WriteTensorProtoFile(file, x, "x").ok());
}

// dir/model.onnx: y = Identity(x) over FP32[4]; dir/x.pb: its input.
void WriteIdentityModel(const fs::path& dir) {
  testing::ModelBuilder model;
  model.Input("x", {4}).Output("y", {4});
  model.Node("Identity", {"x"}, {"y"}, "copy");
  testing::WriteFile(dir / "model.onnx", model.Serialize());
  WriteInputX(dir / "x.pb");
}

// Every backend asked before the one a layer runs on says why not, in the order asked: one that
// refuses the operator, and one that claims it and then fails to create its workload.
TEST_F(RunCommandTest, SaysWhyEachLayerIsNotOnTheBackendsPreferredBeforeIt) {
  fs::create_symlink(testing::Fixture("Subgraph"), backends_ / "Test_Subgraph_backend.so");
  fs::create_symlink(testing::Fixture("ValidNoWorkloads"), backends_ / "Test_Valid_backend.so");
  testing::TempDir dir;
  testing::ModelBuilder model;  // Identity: TestValid claims it, fails; TestSubgraph takes it
  model.Input("x", {4}).Output("y", {4});
  model.Node("Identity", {"x"}, {"h"}, "copy");
  model.Node("Mul", {"h", "h"}, {"y"}, "square");  // refused by both, on CpuRef
  testing::WriteFile(dir / "model.onnx", model.Serialize());
  WriteInputX(dir / "x.pb");
  testing::CommandResult result =
      RunBackplane("run " + (dir / "model.onnx").string() + " --input " + (dir / "x.pb").string() +
                   " --prefer TestValid,TestSubgraph,CpuRef " + Backends());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(
      result.output,
      ContainsRegex("layer copy +Identity +on TestSubgraph \\(generation [0-9]+\\)\n"
                    "  why not TestValid: TestValid cannot create a workload for copy\n"
                    "layer square +Mul +on CpuRef \\(generation [0-9]+\\)\n"
                    "  why not TestValid: TestValid runs Identity only, not Mul\n"
                    "  why not TestSubgraph: TestSubgraph runs Identity, Relu, Add only\n"));
}

// Options of each type, given as a user types them, reach the backend (it reads them back) before
// anything runs.
TEST_F(RunCommandTest, OptionsOfEachTypeReachTheBackendAndArePrintedAsItReadsThemBack) {
  fs::create_symlink(testing::Fixture("Valid"), backends_ / "Test_Valid_backend.so");
  testing::TempDir dir;
  WriteIdentityModel(dir.path());
  // The shell passes 'TestValid.label=two words' as one argument, as a user's shell would.
  testing::CommandResult result = RunBackplane(
      "run " + (dir / "model.onnx").string() + " --input " + (dir / "x.pb").string() +
      " --prefer TestValid --option TestValid.limit=3 --option TestValid.scale=2 --option "
      "TestValid.verbose=true --option 'TestValid.label=two words' " +
      Backends());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("option TestValid.limit = 3\n"
                                       "option TestValid.scale = 2.000000\n"
                                       "option TestValid.verbose = true\n"
                                       "option TestValid.label = \"two words\"\n"));
  EXPECT_LT(result.output.find("option TestValid.label"), result.output.find("time per run"));
  EXPECT_THAT(result.output, ContainsRegex("layer copy +Identity +on TestValid"));
  // After the layers, every option of their backend at the value they were prepared with.
  EXPECT_THAT(result.output,
              HasSubstr("options on TestValid: call_offset=0.000000, execute_offset=0.000000, "
                        "label=\"two words\", "
                        "limit=3, prepared_offset=0.000000, scale=2.000000, verbose=true, "
                        "worker_threads=1\n"));
  EXPECT_LT(result.output.find("layer copy"), result.output.find("options on TestValid"));
}

// Every way an --option can be wrong exits 1 before anything loads, naming the --option and why.
TEST_F(RunCommandTest, BadOptionsExitOneNamingTheOptionAndWhy) {
  fs::create_symlink(testing::Fixture("Valid"), backends_ / "Test_Valid_backend.so");
  testing::TempDir dir;
  WriteIdentityModel(dir.path());
  const std::string run =
      "run " + (dir / "model.onnx").string() + " --input " + (dir / "x.pb").string() + " ";
  const std::pair<std::string, std::string> cases[] = {
      {"GpuAcc.threads=2",
       "--option GpuAcc.threads=2: no backend GpuAcc in this runtime (have: CpuRef, TestValid)"},
      {"TestValid.limits=2",
       "--option TestValid.limits=2: backend TestValid has no option 'limits' (known: verbose, "
       "limit, scale, label, prepared_offset, execute_offset, worker_threads, call_offset)"},
      {"TestValid.limit=two",
       "--option TestValid.limit=two: backend TestValid option 'limit' is int64, got \"two\""},
      {"TestValid.limit=2.5",
       "--option TestValid.limit=2.5: backend TestValid option 'limit' is int64, got 2.5"},
      {"TestValid.limit=",
       "--option TestValid.limit=: backend TestValid option 'limit' is int64, "
       "got \"\""},
      {"TestValid.verbose=1",
       "--option TestValid.verbose=1: backend TestValid option 'verbose' is bool, got 1"},
      {"TestValid.verbose=yes",
       "--option TestValid.verbose=yes: backend TestValid option 'verbose' is bool, got \"yes\""},
      {"TestValid.scale=fast",
       "--option TestValid.scale=fast: backend TestValid option 'scale' is double, got \"fast\""},
      {"TestValid.limit=3 --option TestValid.limit=4",
       "--option TestValid.limit=4: the option was already given as TestValid.limit=3"},
  };
  for (const auto& [option, message] : cases) {
    testing::CommandResult result = RunBackplane(run + "--option " + option + " " + Backends());
    EXPECT_EQ(result.exit_code, 1) << option << "\n" << result.output;
    EXPECT_THAT(result.output, HasSubstr("backplane run: " + message + "\n")) << option;
    EXPECT_THAT(result.output, Not(HasSubstr("time per run"))) << option;
  }
}

// A value of the right type that is refused (CpuAcc's threads must be 1 to the usable CPUs); and
// one it takes, with which the model still computes the right answer.
TEST_F(RunCommandTest, CpuAccThreadsOptionIsCheckedByTheBackendAndApplied) {
  BACKPLANE_REQUIRE_PATH(fs::path(BACKPLANE_CPU_ACC));
  fs::create_symlink(BACKPLANE_CPU_ACC, backends_ / "Backplane_CpuAcc_backend.so");
  const fs::path gemm = kData / "onnx-node" / "test_gemm_all_attributes";
  const std::string run = "run " + (gemm / "model.onnx").string() + " --test-data " +
                          gemm.string() + " --prefer CpuAcc,CpuRef " + Backends();
  testing::CommandResult refused = RunBackplane(run + " --option CpuAcc.intra_op_threads=0");
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_THAT(refused.output,
              ContainsRegex("backplane run: --option CpuAcc.intra_op_threads=0: backend CpuAcc "
                            "option 'intra_op_threads' must be 1 to [0-9]+ \\(the CPUs this "
                            "process may use: [0-9]+ by affinity, [^)]*\\), got 0\n"));
  // 2, but 1 under the sanitizers: LeakSanitizer's tracer crashes at exit ("LeakSanitizer has
  // encountered a fatal error") while libgomp's idle worker threads are alive (as in
  // CpuAccBackendTest).
#if defined(BACKPLANE_TSAN_BUILD) || defined(BACKPLANE_ASAN_BUILD)
  const std::string threads = "1";
#else
  const std::string threads = FindUsableCpus().count >= 2 ? "2" : "1";
#endif
  testing::CommandResult taken = RunBackplane(run + " --option CpuAcc.intra_op_threads=" + threads);
  ASSERT_EQ(taken.exit_code, 0) << taken.output;
  EXPECT_THAT(taken.output, HasSubstr("option CpuAcc.intra_op_threads = " + threads + "\n"));
  EXPECT_THAT(taken.output, ContainsRegex("Gemm +on CpuAcc"));
  EXPECT_THAT(taken.output, HasSubstr("test_data_set_0 output 0 (y): pass"));
}

// A symbolic batch: the first run at a shape runs before its shape program is built, so with
// --repeat it is timed apart and the program awaited: every repeated run hits the program. With
// one run there is nothing to wait for.
TEST_F(RunCommandTest, RepeatedRunsOfASymbolicShapeAreTimedOnItsShapeProgram) {
  testing::TempDir dir;
  testing::ModelBuilder model;  // y = Relu(x) + x over FP32[N,4]
  model.Input("x", {-1, 4}).Output("y", {-1, 4});
  model.Node("Relu", {"x"}, {"h"}, "relu");
  model.Node("Add", {"h", "x"}, {"y"}, "add");
  testing::WriteFile(dir / "model.onnx", model.Serialize());
  Tensor x(TensorInfo{DataType::kFloat32, {2, 4}});
  const float values[] = {-2, -1, 1, 2, 3, -4, 5, -6};
  std::memcpy(x.data(), values, sizeof(values));
  ASSERT_TRUE(WriteTensorProtoFile(dir / "x.pb", x, "x").ok());
  const std::string run = "run " + (dir / "model.onnx").string() + " --input " +
                          (dir / "x.pb").string() + " " + Backends();

  testing::CommandResult repeated = RunBackplane(run + " --repeat 5");
  ASSERT_EQ(repeated.exit_code, 0) << repeated.output;
  EXPECT_THAT(repeated.output,
              ContainsRegex("first run: [0-9]+\\.[0-9] µs, before its input shape's program was "
                            "built; the program was ready [0-9]+\\.[0-9] ms after it began\n"
                            "time per run: median [^\n]* over 5 run\\(s\\)\n"));
  EXPECT_THAT(repeated.output, HasSubstr("hits 5, misses 1, compiles 1"));

  testing::CommandResult once = RunBackplane(run);
  ASSERT_EQ(once.exit_code, 0) << once.output;
  EXPECT_THAT(once.output, Not(HasSubstr("first run")));
  EXPECT_THAT(once.output, HasSubstr("over 1 run(s)"));
  EXPECT_THAT(once.output, HasSubstr("hits 0, misses 1"));
}

TEST_F(RunCommandTest, UsageErrorsExitTwo) {
  EXPECT_EQ(RunBackplane("run").exit_code, 2);
  EXPECT_EQ(RunBackplane("run model.onnx --repeat 0").exit_code, 2);
  EXPECT_EQ(RunBackplane("run model.onnx --input a.pb --test-data dir").exit_code, 2);
  // --option that is not ID.KEY=VALUE: a usage error, named.
  for (const char* option : {"threads=2", "CpuAcc.threads", ".threads=2", "CpuAcc.=2", "="}) {
    testing::CommandResult result = RunBackplane(std::string("run model.onnx --option ") + option);
    EXPECT_EQ(result.exit_code, 2) << option << "\n" << result.output;
    EXPECT_THAT(result.output, HasSubstr(std::string("--option: ") + option +
                                         ": want ID.KEY=VALUE (a backend id, one of its option "
                                         "names, the value)"))
        << option;
  }
  // One value per --option: the model after it stays the model.
  testing::CommandResult model_after =
      RunBackplane("run --option TestValid.limit=3 " + (kData / "no-such.onnx").string());
  EXPECT_EQ(model_after.exit_code, 1) << model_after.output;
  EXPECT_THAT(model_after.output, Not(HasSubstr("MODEL is required")));
}

}  // namespace
}  // namespace backplane
