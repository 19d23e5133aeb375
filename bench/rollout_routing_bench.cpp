// What per-request rollout routing costs: Runtime::Execute of a two-Identity network on the test
// fixture backend (a request that costs next to nothing to run, so that the routing is a visible
// part of it), with no rollout under way, beside a rollout that does not concern the network, and
// in a rollout on either generation.
//
//   build/release/bin/backplane_bench_rollout_routing --benchmark_repetitions=10
//       --benchmark_report_aggregates_only=true
//
// Rows (one request per iteration, on the calling thread, as a synchronous caller runs it):
//   BM_ExecuteNoRollout            the backend has no candidate: what every request pays when no
//                                  rollout is under way.
//   BM_ExecuteBesideRollout        the runtime has a candidate of the backend, but the network was
//                                  loaded after it arrived, so it is not bound on it.
//   BM_ExecuteInRollout/0          the network is bound on the candidate, 0 % of requests go to it:
//                                  routed, metered (latency histogram), run on the stable one.
//   BM_ExecuteInRollout/100        the same with every request on the candidate.
//   BM_RouteNoRollout              RolloutRouter::Route alone, no rollout: the request path's whole
//                                  routing cost when none is under way.
//   BM_RoutesLoadNoRollout         for comparison, the lookup the request path made for the same
//                                  answer before the router: a load of the published routes (a
//                                  lock and a shared_ptr copy) and a walk of the empty map.
// Each runs with one and two client threads. To compare two builds of the runtime, build this
// target on each and run bench/rollout_routing_bench.sh BEFORE AFTER, which runs the two binaries
// alternately and prints each row's median over every run.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <memory>

#include "backplane/core/published.hpp"
#include "backplane/runtime/runtime.hpp"
#include "rollout_router.hpp"
#include "runtime/swap_test_util.hpp"
#include "test_util.hpp"

namespace {

namespace fs = std::filesystem;
using namespace backplane;

constexpr char kId[] = "TestValid";

// One registry (progressive deploys) and runtime over a directory serving fixture Valid.
struct Served {
  testing::TempDir dir;
  std::shared_ptr<BackendRegistry> registry;
  std::unique_ptr<Runtime> runtime;
  NetworkId bound = 0;   // loaded before any candidate arrived
  NetworkId beside = 0;  // loaded after: not bound on the candidate

  void Publish(std::string_view fixture) {
    const fs::path temporary = dir / ".incoming";
    testing::CopyFile(testing::Fixture(fixture), temporary);
    fs::rename(temporary, dir / "Test_Valid_backend.so");
  }
};

std::unique_ptr<Served> Serve(bool with_candidate) {
  auto served = std::make_unique<Served>();
  served->Publish("Valid");
  auto registry = BackendRegistry::Create({.backend_paths = std::vector{served->dir.path()},
                                           .settle_time = std::chrono::milliseconds(0),
                                           .deploy_policy = DeployPolicy::kProgressive});
  if (!registry.ok())
    return nullptr;
  served->registry = std::move(registry).value();
  auto runtime =
      Runtime::Create({.registry = served->registry, .scheduler = {.max_in_flight = 1024}});
  if (!runtime.ok())
    return nullptr;
  served->runtime = std::move(runtime).value();
  auto bound = served->runtime->LoadNetwork(testing::TwoLayerIdentityNetwork());
  if (!bound.ok())
    return nullptr;
  served->bound = bound.value();
  if (with_candidate) {
    served->Publish("ValidNext");
    auto outcome = served->registry->Reload(kId);
    if (!outcome.ok() || outcome->action != DeployOutcome::Action::kCandidate)
      return nullptr;
  }
  auto beside = served->runtime->LoadNetwork(testing::TwoLayerIdentityNetwork());
  if (!beside.ok())
    return nullptr;
  served->beside = beside.value();
  return served;
}

Served* Idle() {
  static Served* served = Serve(false).release();
  return served;
}

Served* InRollout() {
  static Served* served = Serve(true).release();
  return served;
}

void RunRequests(benchmark::State& state, Served* served, NetworkId network) {
  if (served == nullptr) {
    state.SkipWithError("fixture backends not available");
    return;
  }
  const std::vector<float> input(4, 5.0f);
  const ConstTensorView view{{DataType::kFloat32, {4}}, input.data()};
  for (auto _ : state) {
    auto outputs = served->runtime->Execute(network, {&view, 1});
    if (!outputs.ok()) {
      state.SkipWithError(outputs.error().message().c_str());
      break;
    }
    benchmark::DoNotOptimize(outputs);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_ExecuteNoRollout(benchmark::State& state) {
  RunRequests(state, Idle(), Idle() != nullptr ? Idle()->bound : 0);
}

void BM_ExecuteBesideRollout(benchmark::State& state) {
  RunRequests(state, InRollout(), InRollout() != nullptr ? InRollout()->beside : 0);
}

void BM_ExecuteInRollout(benchmark::State& state) {
  Served* served = InRollout();
  if (served != nullptr && state.thread_index() == 0) {
    const Status set = served->runtime->SetRolloutTraffic(
        kId, {.candidate_percent = static_cast<double>(state.range(0))});
    if (!set.ok())
      state.SkipWithError(set.message().c_str());
  }
  RunRequests(state, served, served != nullptr ? served->bound : 0);
}

void BM_RouteNoRollout(benchmark::State& state) {
  static const RolloutRouter router({});
  NetworkId id = 1;
  for (auto _ : state) {
    RoutedRequest routed = router.Route(id, nullptr, {}, 0);
    benchmark::DoNotOptimize(routed);
  }
}

void BM_RoutesLoadNoRollout(benchmark::State& state) {
  static const Published<CandidateRoutes> routes;
  NetworkId id = 1;
  for (auto _ : state) {
    const auto loaded = routes.Load();
    bool found = false;
    for (const auto& [backend_id, route] : *loaded)
      found = found || route->candidate.networks.contains(id);
    benchmark::DoNotOptimize(found);
  }
}

BENCHMARK(BM_RouteNoRollout)->Threads(1)->Threads(2);
BENCHMARK(BM_RoutesLoadNoRollout)->Threads(1)->Threads(2);
BENCHMARK(BM_ExecuteNoRollout)->Unit(benchmark::kNanosecond)->UseRealTime()->Threads(1)->Threads(2);
BENCHMARK(BM_ExecuteBesideRollout)
    ->Unit(benchmark::kNanosecond)
    ->UseRealTime()
    ->Threads(1)
    ->Threads(2);
BENCHMARK(BM_ExecuteInRollout)
    ->Arg(0)
    ->Arg(100)
    ->Unit(benchmark::kNanosecond)
    ->UseRealTime()
    ->Threads(1)
    ->Threads(2);

}  // namespace

// Both runtimes set up before the first benchmark, so that none pays for a load.
int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv))
    return 1;
  Idle();
  InRollout();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
