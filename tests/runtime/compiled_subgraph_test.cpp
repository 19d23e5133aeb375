// SDK 1.1 compiled subgraphs, host side: which runs of layers a backend is offered, with which
// boundary; compiled, declined, failing and throwing backends; a 1.0 backend never called through
// the new entry; a compiled run re-prepared on a hot swap.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "backplane/runtime/runtime.hpp"
#include "runtime/swap_test_util.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using testing::ChainNetwork;
using ::testing::ElementsAre;
using testing::Fixture;
using ::testing::HasSubstr;
using testing::TempDir;

Tensor Floats(Shape shape, const std::vector<float>& values) {
  Tensor tensor(TensorInfo{DataType::kFloat32, std::move(shape)});
  std::memcpy(tensor.data(), values.data(), values.size() * sizeof(float));
  return tensor;
}

// Two runs on the compiling backend around a Mul that only CpuRef runs, with a constant, a value
// read across the Mul (a) and a network output produced inside the first run (b):
//   r1: a = Relu(x)    add1: b = Add(a, k)    [CpuRef] m: c = Mul(b, b)
//   r2: d = Relu(c)    add2: y = Add(d, a)    outputs y, b
Network TwoRunsNetwork() {
  const TensorInfo info{DataType::kFloat32, {4}};
  Network network{.name = "two_runs"};
  network.inputs = {{"x", info}};
  network.outputs = {{"y", info}, {"b", info}};
  network.nodes = {
      {.name = "r1", .op_type = "Relu", .inputs = {"x"}, .outputs = {"a"}},
      {.name = "add1", .op_type = "Add", .inputs = {"a", "k"}, .outputs = {"b"}},
      {.name = "m", .op_type = "Mul", .inputs = {"b", "b"}, .outputs = {"c"}},
      {.name = "r2", .op_type = "Relu", .inputs = {"c"}, .outputs = {"d"}},
      {.name = "add2", .op_type = "Add", .inputs = {"d", "a"}, .outputs = {"y"}},
  };
  network.constants.emplace("k", Floats({4}, {1, 1, 1, 1}));
  for (const char* name : {"x", "k", "a", "b", "c", "d", "y"})
    network.values.emplace(name, info);
  return network;
}

std::vector<std::vector<float>> Outputs(Runtime& runtime, NetworkId id, std::vector<float> input,
                                        Shape shape) {
  const ConstTensorView view{{DataType::kFloat32, std::move(shape)}, input.data()};
  auto outputs = runtime.Execute(id, {&view, 1});
  EXPECT_TRUE(outputs.ok()) << outputs.error().ToString();
  std::vector<std::vector<float>> values;
  if (outputs.ok()) {
    for (const Tensor& output : outputs.value()) {
      const auto elements = output.Elements<float>();
      values.emplace_back(elements.begin(), elements.end());
    }
  }
  return values;
}

int64_t IntOption(Runtime& runtime, std::string_view backend, std::string_view key) {
  auto value = runtime.Backend(backend)->GetOption(key);
  EXPECT_TRUE(value.ok()) << value.error().ToString();
  return value.ok() ? std::get<int64_t>(value.value()) : -1;
}

std::string StringOption(Runtime& runtime, std::string_view backend, std::string_view key) {
  auto value = runtime.Backend(backend)->GetOption(key);
  EXPECT_TRUE(value.ok()) << value.error().ToString();
  return value.ok() ? std::get<std::string>(value.value()) : "";
}

class CompiledSubgraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"Subgraph", "SubgraphApi10", "SubgraphFails", "SubgraphThrows"}) {
      fs::create_symlink(Fixture(name), dir_ / ("Test_" + std::string(name) + "_backend.so"));
    }
    fs::create_symlink(testing::CpuRefBackend(), dir_ / "Backplane_CpuRef_backend.so");
    auto runtime = Runtime::Create({.backend_paths = std::vector{dir_.path()}});
    ASSERT_TRUE(runtime.ok()) << runtime.error().ToString();
    runtime_ = std::move(runtime).value();
  }
  Result<NetworkId> Load(Network network, std::vector<std::string> preferences) {
    return runtime_->LoadNetwork(std::move(network), {.backend_preferences = preferences});
  }

  TempDir dir_;
  std::unique_ptr<Runtime> runtime_;
};

TEST_F(CompiledSubgraphTest, RunOfLayersOnOneBackendRunsAsOneCompiledWorkload) {
  auto id = Load(ChainNetwork(), {"TestSubgraph"});
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  EXPECT_EQ(IntOption(*runtime_, "TestSubgraph", "compile_calls"), 1);
  EXPECT_EQ(StringOption(*runtime_, "TestSubgraph", "subgraphs"), "[x]->[y]")
      << "h and s stay inside the run";

  const auto placement = runtime_->GetPlacement(id.value()).value();
  ASSERT_EQ(placement.size(), 3u) << "one placement per original layer";
  const char* names[] = {"relu", "add", "copy"};
  for (std::size_t i = 0; i < placement.size(); ++i) {
    EXPECT_EQ(placement[i].node, names[i]);
    EXPECT_EQ(placement[i].backend_id, "TestSubgraph");
    EXPECT_GT(placement[i].generation, 0u);
    EXPECT_TRUE(placement[i].compiled);
    EXPECT_EQ(placement[i].subgraph, "relu");
    EXPECT_EQ(placement[i].note, "fused into relu (Relu+Add+Identity)");
  }

  EXPECT_THAT(Outputs(*runtime_, id.value(), {-2, -1, 1, 2}, {4}),
              ElementsAre(ElementsAre(-2, -1, 2, 4)));
  EXPECT_THAT(Outputs(*runtime_, id.value(), {3, 0, -5, 0.5f}, {4}),
              ElementsAre(ElementsAre(6, 0, -5, 1)));
  EXPECT_EQ(IntOption(*runtime_, "TestSubgraph", "compiled_executions"), 2)
      << "each request ran the compiled workload once";
}

TEST_F(CompiledSubgraphTest, BoundaryIsWhatTheRunReadsAndWhatIsReadAfterIt) {
  auto id = Load(TwoRunsNetwork(), {"TestSubgraph", "CpuRef"});
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  // Run 1 reads x (k is a constant) and must write a (read by add2) and b (read by m, and a
  // network output). Run 2 reads c and a, in the order it first reads them; d stays inside.
  EXPECT_EQ(StringOption(*runtime_, "TestSubgraph", "subgraphs"), "[x]->[a,b];[c,a]->[y]");

  const auto placement = runtime_->GetPlacement(id.value()).value();
  ASSERT_EQ(placement.size(), 5u);
  EXPECT_EQ(placement[2].node, "m");
  EXPECT_EQ(placement[2].backend_id, "CpuRef");
  EXPECT_FALSE(placement[2].compiled);
  EXPECT_EQ(placement[2].subgraph, "");
  EXPECT_EQ(placement[2].note, "");
  for (std::size_t i : {0u, 1u})
    EXPECT_EQ(placement[i].note, "fused into r1 (Relu+Add)") << i;
  for (std::size_t i : {3u, 4u}) {
    EXPECT_EQ(placement[i].subgraph, "r2") << i;
    EXPECT_EQ(placement[i].note, "fused into r2 (Relu+Add)") << i;
  }

  // a = [0,0,1,2], b = a+1 = [1,1,2,3], c = b*b = [1,1,4,9], y = relu(c) + a = [1,1,5,11].
  EXPECT_THAT(Outputs(*runtime_, id.value(), {-2, -1, 1, 2}, {4}),
              ElementsAre(ElementsAre(1, 1, 5, 11), ElementsAre(1, 1, 2, 3)));
}

TEST_F(CompiledSubgraphTest, DynamicShapesReachTheCompiledWorkloadPerRequest) {
  auto id = Load(ChainNetwork({-1}), {"TestSubgraph"});
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  EXPECT_TRUE(runtime_->GetPlacement(id.value()).value().at(0).compiled);
  EXPECT_THAT(Outputs(*runtime_, id.value(), {-1, 2, 3}, {3}), ElementsAre(ElementsAre(-1, 4, 6)));
  EXPECT_THAT(Outputs(*runtime_, id.value(), {1, -2, 3, -4, 5}, {5}),
              ElementsAre(ElementsAre(2, -2, 6, -4, 10)));
}

// The fixture reports API 1.0 and answers CompileSubgraph with a workload that writes -777: were
// the host to call it, the outputs would show it.
TEST_F(CompiledSubgraphTest, OneZeroBackendIsNeverOfferedASubgraph) {
  EXPECT_EQ(runtime_->Backend("TestSubgraphApi10")->api_version(), (BackendApiVersion{1, 0}));
  auto id = Load(ChainNetwork(), {"TestSubgraphApi10"});
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  for (const auto& layer : runtime_->GetPlacement(id.value()).value()) {
    EXPECT_EQ(layer.backend_id, "TestSubgraphApi10");
    EXPECT_FALSE(layer.compiled) << layer.node;
    EXPECT_EQ(layer.note, "") << layer.node;
  }
  EXPECT_THAT(Outputs(*runtime_, id.value(), {-2, -1, 1, 2}, {4}),
              ElementsAre(ElementsAre(-2, -1, 2, 4)));
  EXPECT_EQ(IntOption(*runtime_, "TestSubgraphApi10", "compile_calls"), 0);
}

// CpuRef is built against 1.2 and keeps IBackend's default CompileSubgraph: it declines.
TEST_F(CompiledSubgraphTest, DecliningBackendGetsOneWorkloadPerLayer) {
  auto id = Load(ChainNetwork(), {"CpuRef"});
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  for (const auto& layer : runtime_->GetPlacement(id.value()).value()) {
    EXPECT_EQ(layer.backend_id, "CpuRef");
    EXPECT_FALSE(layer.compiled) << layer.node;
  }
  EXPECT_THAT(Outputs(*runtime_, id.value(), {-2, -1, 1, 2}, {4}),
              ElementsAre(ElementsAre(-2, -1, 2, 4)));
}

TEST_F(CompiledSubgraphTest, SingleLayerIsNeverOffered) {
  Network network = ChainNetwork();
  network.nodes.resize(1);  // relu alone: x -> h
  network.outputs = {{"h", network.values.at("h")}};
  auto id = Load(std::move(network), {"TestSubgraph"});
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  EXPECT_FALSE(runtime_->GetPlacement(id.value()).value().at(0).compiled);
  EXPECT_EQ(IntOption(*runtime_, "TestSubgraph", "compile_calls"), 0);
  EXPECT_THAT(Outputs(*runtime_, id.value(), {-2, 3, 0, 1}, {4}),
              ElementsAre(ElementsAre(0, 3, 0, 1)));
}

TEST_F(CompiledSubgraphTest, CompileErrorFailsTheLoadNamingTheBackendAndTheLayers) {
  auto id = Load(ChainNetwork(), {"TestSubgraphFails", "CpuRef"});
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code(), StatusCode::kInvalidArgument) << "the backend's own code";
  EXPECT_EQ(id.error().message(),
            "network chain: backend TestSubgraphFails failed to compile the run of layers 'relu' "
            "(Relu), 'add' (Add), 'copy' (Identity): TestSubgraphFails has no registers left");
  // The runtime carries on.
  auto other = Load(ChainNetwork(), {"TestSubgraph"});
  ASSERT_TRUE(other.ok()) << other.error().ToString();
  EXPECT_THAT(Outputs(*runtime_, other.value(), {1, 1, 1, 1}, {4}),
              ElementsAre(ElementsAre(2, 2, 2, 2)));
}

TEST_F(CompiledSubgraphTest, ThrowingCompileIsAnErrorAndTheProcessCarriesOn) {
  auto id = Load(ChainNetwork(), {"TestSubgraphThrows"});
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code(), StatusCode::kInternal);
  EXPECT_THAT(id.error().message(),
              HasSubstr("backend TestSubgraphThrows failed to compile the run of layers 'relu'"));
  EXPECT_THAT(
      id.error().message(),
      HasSubstr(
          "backend TestSubgraphThrows threw from CompileSubgraphWithOptions: the compiler fell "
          "over (exceptions must not escape backend code)"));
  EXPECT_EQ(IntOption(*runtime_, "TestSubgraphThrows", "compile_calls"), 1);
  auto other = Load(ChainNetwork(), {"TestSubgraph"});
  ASSERT_TRUE(other.ok()) << other.error().ToString();
  EXPECT_THAT(Outputs(*runtime_, other.value(), {1, 1, 1, 1}, {4}),
              ElementsAre(ElementsAre(2, 2, 2, 2)));
}

// A compiled run is re-prepared on a new generation exactly like per-layer workloads: the swap
// compiles it again on the new instance, requests before and after see the old and the new
// build, and the replaced generation leaves the process.
TEST(CompiledSubgraphSwapTest, HotSwapCompilesTheRunAgainOnTheNewGeneration) {
  TempDir shadow_root;
  TempDir dir;
  auto publish = [&](std::string_view fixture) {
    const fs::path temporary = dir / ".incoming";
    testing::CopyFile(Fixture(fixture), temporary);
    fs::rename(temporary, dir / "Test_Subgraph_backend.so");
  };
  auto loader = loader::Loader::Create({.shadow_root = shadow_root.path()});
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  publish("Subgraph");
  auto registry = BackendRegistry::Create({.backend_paths = std::vector{dir.path()},
                                           .loader = loader.share(),
                                           .settle_time = std::chrono::milliseconds{0}});
  ASSERT_TRUE(registry.ok()) << registry.error().ToString();
  auto created = Runtime::Create({.registry = registry.share()});
  ASSERT_TRUE(created.ok()) << created.error().ToString();
  Runtime& runtime = *created.value();

  // Identity then Identity: each Identity adds the build's offset (0, then 1000).
  Network network = ChainNetwork();
  network.nodes[0].op_type = "Identity";
  network.nodes[1] = {.name = "add", .op_type = "Identity", .inputs = {"h"}, .outputs = {"s"}};
  auto id = runtime.LoadNetwork(std::move(network));
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  const uint64_t old_generation = registry->Describe("TestSubgraph")->active_generation;
  EXPECT_THAT(Outputs(runtime, id.value(), {1, 2, 3, 4}, {4}),
              ElementsAre(ElementsAre(1, 2, 3, 4)));
  EXPECT_EQ(IntOption(runtime, "TestSubgraph", "compiled_executions"), 1);

  publish("SubgraphNext");
  auto rescan = registry->Rescan();
  ASSERT_EQ(rescan.outcomes.size(), 1u);
  ASSERT_EQ(rescan.outcomes[0].action, DeployOutcome::Action::kActivated)
      << rescan.outcomes[0].message;
  const uint64_t new_generation = registry->Describe("TestSubgraph")->active_generation;
  EXPECT_GT(new_generation, old_generation);

  EXPECT_THAT(Outputs(runtime, id.value(), {1, 2, 3, 4}, {4}),
              ElementsAre(ElementsAre(3001, 3002, 3003, 3004)))
      << "three Identity layers of the new build";
  for (const auto& layer : runtime.GetPlacement(id.value()).value()) {
    EXPECT_EQ(layer.generation, new_generation) << layer.node;
    EXPECT_TRUE(layer.compiled) << layer.node;
    EXPECT_EQ(layer.note, "fused into relu (Identity+Identity+Identity)") << layer.node;
  }
  EXPECT_EQ(runtime.Backend("TestSubgraph")->generation_number(), new_generation);
  EXPECT_EQ(IntOption(runtime, "TestSubgraph", "compile_calls"), 1) << "compiled on the new one";
  EXPECT_EQ(IntOption(runtime, "TestSubgraph", "compiled_executions"), 1);

  loader->WaitForUnloads();
  const auto status = registry->Describe("TestSubgraph").value();
  ASSERT_GE(status.generations.size(), 2u);
  EXPECT_EQ(status.generations[1].generation, old_generation);
  EXPECT_EQ(status.generations[1].state, GenerationState::kUnloaded);
  EXPECT_FALSE(testing::IsCodeMapped(std::to_string(old_generation) + "-Test_Subgraph_backend.so"));
}

}  // namespace
}  // namespace backplane
