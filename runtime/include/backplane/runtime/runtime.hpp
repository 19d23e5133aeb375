// Runtime: the embedder's entry point (ArmNN's IRuntime). Holds one instance of every available
// backend, created by that backend's factory for this runtime alone; runtimes share the loaded
// libraries through the registry and the loader.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/published.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/loader/backend_instance.hpp"
#include "backplane/onnx/network.hpp"
#include "backplane/registry/backend_registry.hpp"
#include "backplane/runtime/rollout.hpp"
#include "backplane/scheduler/concurrency_limit.hpp"
#include "backplane/scheduler/request_scheduler.hpp"

namespace backplane {

// What a runtime does with its loaded networks when a new generation of a backend they use
// becomes active (docs/hot-reload.md, "What happens during a swap" and "Policies").
enum class SwapPolicy {
  // Re-prepare each affected network on the new generation, then switch it atomically; requests
  // already running finish on the old one. A network that fails to prepare rejects the new
  // generation. The server's default.
  kMigrate,
  // Loaded networks stay on the generation they were loaded with until unloaded; only networks
  // loaded afterwards use the new one.
  kPin,
};

// Before a migration switches, run a probe through the network on both generations and refuse
// the new one when any output element differs by more than `tolerance` (bug-fix deploys that
// must not change results).
struct SwapValidation {
  double tolerance = 0.0;
};

// A request that was running on a backend generation whose worker process died (isolation/).
struct CrashedRequest {
  NetworkId network = 0;
  std::span<const ConstTensorView> inputs;  // in the network's input order; valid for the call
  const Status& error;  // reason CRASHED; names the backend, generation, file and how it died
};

// Option values per backend id.
using OptionsByBackend = std::map<std::string, BackendOptions, std::less<>>;

// One call's option values per backend id (SDK 1.4, the ExecuTorch RFC's options at execute):
// Execute's and ExecuteAsync's `call_options`. Only options a backend declares per call
// (IBackend::DescribeCallOptions) may be given. For that call alone, each workload on the backend
// runs with every declared option at its effective value: the call's, else the network's
// (NetworkOptions::backend_options), else the runtime's (RuntimeOptions::backend_options,
// UpdateBackendOptions), else the declared default. Checked before the request runs: a backend id
// this runtime does not have, a key the backend does not declare, a value of another type, a key
// not taken per call or a thread count beyond the usable CPUs is kInvalidArgument naming backend
// and key, and nothing runs. Values for a backend on which no layer of the network runs are
// checked and otherwise ignored (a network may move between backends by a swap).
using CallOptions = OptionsByBackend;

struct RuntimeOptions {
  // Backend directories; nullopt means DefaultBackendPaths(). Ignored when `registry` is given.
  std::optional<std::vector<std::filesystem::path>> backend_paths;
  // false: only static (linked-in) backends. Ignored when `registry` is given.
  bool dynamic_backends = true;
  // Options per backend id, applied right after each instance is created. An id that no backend
  // has, an unknown key or a wrong type fails Create.
  OptionsByBackend backend_options;
  // Share a registry between runtimes; null creates one from the fields above.
  std::shared_ptr<BackendRegistry> registry;
  // Backend preference list for networks loaded without one; empty: every backend, by id.
  std::vector<std::string> default_preferences;
  // The TBB arena and the limit on requests in flight (beyond it: refused, never queued).
  scheduler::SchedulerOptions scheduler;
  SwapPolicy swap_policy = SwapPolicy::kMigrate;
  // Per backend id: validate migrated networks before a new generation of it becomes active.
  std::map<std::string, SwapValidation, std::less<>> swap_validation;
  // Told of each request whose run failed because a backend's worker process died under it
  // (reason CRASHED), before the runtime runs it again: what an author needs to replay it.
  // Called on the thread that ran the request; must not block or call Execute.
  std::function<void(const CrashedRequest&)> on_crashed_request;
  // How long a request whose stable generation's worker died waits for its network to move (onto
  // the restarted worker, a rollback, another backend) before failing with the crash. It holds
  // its execution slot meanwhile.
  std::chrono::milliseconds crash_retry_wait{2000};
};

// How many shape programs a network with dynamic input dimensions keeps by default: a server
// sees a handful of batch sizes, and each program of a backend like CpuAcc holds its own
// reordered copy of the weights (docs/performance.md, "Shape programs", measures both).
inline constexpr std::size_t kDefaultShapeProgramCapacity = 8;

struct NetworkOptions {
  // Backend ids, most preferred first; each layer goes to the first that supports it. Empty: the
  // runtime's default preferences.
  std::vector<std::string> backend_preferences;
  // For a network with dynamic input dimensions: how many input shapes keep a shape program (the
  // inferred shapes, and the runs its backends declined at load time compiled at that shape), the
  // least recently used evicted beyond it. 0: no programs, shapes inferred on every request.
  std::size_t shape_program_capacity = kDefaultShapeProgramCapacity;
  // This network's own option values per backend id (the ExecuTorch RFC's per-program options; a
  // served model's "backend_options"): its workloads on that backend are prepared with them over
  // the runtime's values (RuntimeOptions::backend_options, UpdateBackendOptions). Checked at load
  // by the backend (IBackend::CheckOptions, SDK 1.3): an unknown key, a wrong type or a value out
  // of range fails the load (kInvalidArgument naming backend and key); a backend built against
  // SDK 1.2 or older takes none (kFailedPrecondition). Values for a backend this runtime does not
  // have are kept unchecked, with a warning, as preferences are. Kept across swaps, rollbacks,
  // candidates and option updates: every binding of the network is prepared with them.
  OptionsByBackend backend_options;
  // How many executions of this network may run at once (Triton's instance_group count; a
  // served model's "instances"); 0: no limit of its own. With the network's backend options it
  // says how the network uses the cores: a wide network as 1 instance of 2 intra-op threads, a
  // small one as 2 instances of 1. Requests beyond it wait in arrival order, not refused: a
  // synchronous Execute blocks its caller's thread before it joins the arena, an ExecuteAsync
  // waits as a callback and is queued in the arena only when its turn comes, so it holds no arena
  // thread meanwhile. A waiting request still counts among max_in_flight, and its deadline still
  // applies (kDeadlineExceeded, not run). The limit belongs to the network, not to one binding:
  // it holds across swaps, option updates and a rollout's candidate binding, whose requests take
  // turns with the stable ones. Read and changed with GetNetworkInstances/SetNetworkInstances.
  std::size_t instances = 0;
};

// A network's limit on executions at once, and how many run and wait now.
using InstanceCounts = scheduler::ConcurrencyLimit::Counts;

// Where one layer runs. There is one per layer of the network, in node order, whether or not the
// layer ran inside a compiled subgraph.
struct LayerPlacement {
  std::string node;
  std::string op_type;
  std::string backend_id;
  uint64_t generation = 0;  // 0 for a static backend
  // SDK 1.1: true when the backend compiled the run of layers this one belongs to into one
  // workload (IBackend::CompileSubgraph); `subgraph` then names the run's first layer, so that
  // the layers sharing it ran as one workload.
  bool compiled = false;
  std::string subgraph;
  // What the backend said about this layer when it compiled the run (CompiledSubgraph::
  // layer_notes), e.g. "fused into conv1 (Conv+Add+Relu)"; for a layer that reads only
  // constants, computed once when the network loaded and skipped by requests, "folded: computed
  // once at load" (after the backend's note, if any); "" otherwise.
  std::string note;
  // A network with dynamic input dimensions: true when this layer belongs to a run of layers that
  // its backend declined to compile at load time, with dimensions still unknown, and that is
  // offered to it again with each input shape's concrete dimensions, on the runtime's builder
  // thread, once the first request of that shape arrives (NetworkOptions::
  // shape_program_capacity). Whether it compiled at a given shape is in GetShapePrograms.
  bool compiled_per_input_shape = false;
  // Why the layer is not on a backend earlier in the preference list: each backend asked before
  // the one it runs on, with its refusal, as "\n  ID: reason" (the list a load error gives when no
  // backend takes the layer); "" when the first backend asked took it.
  std::string fallback_reason;
  // Every option the backend declares, at the value this layer's workload was prepared with: the
  // network's own, else the runtime's, else the default (NetworkOptions::backend_options). A
  // backend built against SDK 1.2 or older gets the runtime's values only.
  BackendOptions options;
};

// The shape programs of one loaded network (docs/performance.md, "Shape programs"). Counters
// cover every generation the network was bound to; `programs` only the current binding's cache,
// which a hot swap starts afresh.
struct ShapeProgramStats {
  std::size_t capacity = 0;  // 0: disabled, or the network has no dynamic input dimension
  uint64_t hits = 0;         // requests that ran a cached program
  // Requests at a shape without a program ready: the first builds it (and pays the compile), the
  // ones arriving while it builds run the load-time workloads.
  uint64_t misses = 0;
  uint64_t compiles = 0;  // programs built, one per shape (each compiles every run it can)
  // Runs a backend failed to compile at a concrete shape with an error (logged once per program);
  // they run on the load-time workloads at that shape.
  uint64_t compile_failures = 0;
  uint64_t evictions = 0;
  struct Program {
    std::vector<Shape> input_shapes;  // in the order of the network's inputs
    std::size_t compiled_layers = 0;  // layers running in runs compiled at these shapes
    std::string failures;             // why runs failed to compile at these shapes; "" if none
  };
  std::vector<Program> programs;  // cached now, most recently used first
};

class LoadedNetwork;
class ShapeProgramBuilder;
class RolloutRouter;
struct RoutedRequest;

// Thread-safe. Follows the registry's generations: when a backend id gets a new generation (or
// loses its file), the runtime prepares its side off the request path and switches atomically
// (see SwapPolicy); a request always runs wholly on the generations it started with.
class Runtime : private BackendSubscriber {
 public:
  // Fails (kFailedPrecondition) when no backend is available at all: a runtime that cannot run
  // anything is a configuration error best reported at once.
  static Result<std::unique_ptr<Runtime>> Create(RuntimeOptions options = {});
  ~Runtime();

  std::vector<std::string> BackendIds() const;
  // This runtime's instance of backend `id`, or null.
  std::shared_ptr<loader::BackendInstance> Backend(std::string_view id) const;

  // Validated by the backend: an unknown key or a wrong type applies nothing. Reaches the
  // candidate and baseline generations of a rollout of `id` too, and every binding of the
  // networks re-prepared on them (a good build must not diverge because only the stable one
  // changed its outputs).
  // Takes effect on the networks already loaded, whether the backend reads the option at Execute or
  // when it prepares a workload: before returning, every network bound to the backend's current
  // instance is re-prepared with the new values off the request path and switched atomically, as a
  // swap switches (requests in flight finish on the old bindings; none fails). A network that does
  // not prepare with them fails the update (kFailedPrecondition naming it) and the old values are
  // restored. Networks pinned to an older generation (SwapPolicy::kPin) keep that generation's
  // options. Options set here (or at Create) are given to every later generation too. Costs one
  // preparation of each such network: an update is a control-plane call, not a per-request one.
  Status UpdateBackendOptions(std::string_view id, const BackendOptions& changes);

  // The RFC's per-program update: `changes` over network `id`'s own options for backend
  // `backend_id` (NetworkOptions::backend_options), checked by the backend first, then that
  // network alone re-prepared off the request path and switched atomically (its candidate and
  // baseline bindings too, during a rollout); requests in flight finish on the old binding.
  // All-or-nothing: a refusal (kInvalidArgument naming the key, kFailedPrecondition for a backend
  // older than SDK 1.3 or a network that does not prepare with them) changes nothing. kNotFound for
  // an unknown network or backend; kFailedPrecondition for a network pinned to an older generation
  // (SwapPolicy::kPin: re-preparing would move it).
  Status UpdateNetworkOptions(NetworkId id, std::string_view backend_id,
                              const BackendOptions& changes);
  // Network `id`'s own option values per backend, as loaded and updated since (not the
  // effective values: those are in each LayerPlacement).
  Result<OptionsByBackend> GetNetworkOptions(NetworkId id) const;
  // Network `id`'s limit on executions at once (NetworkOptions::instances), with the executions
  // running and the requests waiting for a turn now; kNotFound for an unknown network.
  Result<InstanceCounts> GetNetworkInstances(NetworkId id) const;
  // Changes that limit at once, without re-preparing anything: a higher one (or 0) starts waiting
  // requests now, a lower one lets the executions running finish and starts nobody until fewer
  // than it run. kNotFound for an unknown network.
  Status SetNetworkInstances(NetworkId id, std::size_t instances);

  const BackendRegistry& registry() const { return *registry_; }
  BackendRegistry& registry() { return *registry_; }

  // ---- Progressive rollout (docs/hot-reload.md) ---------------------------------------------
  // While backend `id` has a candidate generation (DeployPolicy::kProgressive), every network
  // loaded before it arrived that runs on the id's active generation is bound on both, and on
  // the rollout's baseline generation too when the registry loaded one (BackendChange::
  // baseline); a request runs wholly on one of them, chosen when it starts by `traffic` (nothing
  // goes to the candidate or the baseline until this is called). kNotFound when this runtime has
  // no candidate of `id`.
  Status SetRolloutTraffic(std::string_view id, const RolloutTraffic& traffic);
  // The counters of the rollout of `id` since its candidate arrived; nullopt when none.
  std::optional<RolloutStats> GetRolloutStats(std::string_view id) const;

  // Binds every layer of `network` to a backend (ArmNN's Optimize + LoadNetwork), calling each
  // backend context's BeforeLoadNetwork / AfterLoadNetwork (without the runtime's state lock, so
  // that a hook may call this runtime's readers; see backend_mutex_). Fails naming the layer no
  // backend supports, with every backend's reason. Each run of two or more consecutive layers
  // placed on one backend is offered to it whole (SDK 1.1 CompileSubgraph): a backend that compiles
  // it runs it as one workload; one that declines (or is built against 1.0) gets one workload per
  // layer. A backend that fails to compile a run fails the load, naming it and the layers. With
  // dynamic input dimensions, a run declined at load time is offered again per input shape, off
  // the request path, once the first request of that shape arrives (NetworkOptions::
  // shape_program_capacity); a failure there only logs, and the run goes layer by layer at that
  // shape.
  Result<NetworkId> LoadNetwork(Network network, NetworkOptions options = {});
  // Calls BeforeUnloadNetwork on every context first; when one refuses, the network stays loaded
  // and the error says which backend and why. Requests in flight finish on the old bindings.
  Status UnloadNetwork(NetworkId id);
  Result<std::vector<LayerPlacement>> GetPlacement(NetworkId id) const;
  Result<ShapeProgramStats> GetShapePrograms(NetworkId id) const;
  Result<std::shared_ptr<const Network>> GetNetwork(NetworkId id) const;

  // Runs one request on the calling thread, never handed to a worker (see RequestScheduler::
  // RunOnCallerThread): while fewer callers than the arena's threads are in it, the request's
  // parallel kernels use the arena; beyond that they run serially on the caller. Thread-safe: call
  // it from as many threads as you like; admission counts it among max_in_flight like a queued
  // request (kResourceExhausted when full, at once). Beyond the network's instances it waits for
  // its turn on the calling thread, before it joins the arena (NetworkOptions::instances). Inputs
  // in the order of the network's inputs; outputs in the order of its outputs. The network's
  // bindings are held for the call, so a swap during it never unmaps the code it runs, and their
  // last release goes to the reaper. `routing_key` (a request id): during a rollout, requests with
  // the same key run on the same generation while its share stays or grows; empty, each request is
  // drawn afresh. `call_options`: this call's per-call option values (CallOptions); a rollout's
  // arms, its shadow run and a run again after a crash all run with them.
  Result<std::vector<Tensor>> Execute(NetworkId id, std::span<const ConstTensorView> inputs,
                                      std::string_view routing_key = {},
                                      const CallOptions& call_options = {});
  // The same with inputs by name (as an inference API receives them): an unknown or missing
  // name is kInvalidArgument naming it and the network's inputs.
  using NamedInputs = std::map<std::string, ConstTensorView, std::less<>>;
  Result<std::vector<Tensor>> ExecuteByName(NetworkId id, const NamedInputs& inputs);
  // Queues one request in the runtime's arena (beyond the network's instances, once its turn
  // comes: NetworkOptions::instances); `done` runs on a TBB worker with the outputs or the error
  // (kDeadlineExceeded when the deadline passed before it started). A refusal
  // (kNotFound, kResourceExhausted when full) calls `done` at once on the caller's thread. An
  // exception from `done` is logged and swallowed. Never destroy the Runtime inside `done`: the
  // destructor waits for that very request.
  // `call_options` as Execute's; a refusal of them goes to `done` like any error of the request.
  using ExecuteCallback = std::function<void(Result<std::vector<Tensor>>)>;
  void ExecuteAsync(NetworkId id, std::vector<Tensor> inputs, ExecuteCallback done,
                    std::optional<scheduler::Clock::time_point> deadline = std::nullopt,
                    CallOptions call_options = {});
  std::future<Result<std::vector<Tensor>>> ExecuteAsync(
      NetworkId id, std::vector<Tensor> inputs,
      std::optional<scheduler::Clock::time_point> deadline = std::nullopt,
      CallOptions call_options = {});
  // The same for a request whose inputs are still to be made, say parsed from a transport's
  // body: `make_inputs` runs first, on the TBB worker, so that the parse is part of the request
  // (admitted, bounded, off the caller's thread); its error goes to `done` as the request's.
  // The inputs are released before `done` runs.
  using InputsFactory = std::function<Result<std::vector<Tensor>>()>;
  // `routing_key` and `call_options`, when given, are asked after `make_inputs` (a request id
  // and the request's options are in the body).
  void ExecuteAsync(NetworkId id, InputsFactory make_inputs, ExecuteCallback done,
                    std::optional<scheduler::Clock::time_point> deadline = std::nullopt,
                    std::function<std::string()> routing_key = {},
                    std::function<CallOptions()> call_options = {});

 private:
  struct BackendSlot {
    std::shared_ptr<loader::BackendInstance> instance;
    std::unique_ptr<IBackendContext> context;  // destroyed before the instance (declared after)
  };
  using BackendMap = std::map<std::string, BackendSlot, std::less<>>;
  // A progressive rollout's trial arms' slots: its candidate's, and its baseline's when the change
  // brought one (BackendChange::baseline), created and bound alike.
  struct RolloutSlots {
    BackendSlot candidate;
    std::optional<BackendSlot> baseline;
  };
  using NetworkMap = std::map<NetworkId, std::shared_ptr<const LoadedNetwork>>;
  using Instances = std::vector<std::shared_ptr<loader::BackendInstance>>;
  using InstanceMap = std::map<std::string, std::shared_ptr<loader::BackendInstance>, std::less<>>;
  // Backend ids and their contexts (with the instance each belongs to, whose generation a crash
  // in a hook names), for calling hooks with backend_mutex_ held but not mutex_.
  struct HookedContext {
    std::string backend_id;
    IBackendContext* context;
    const loader::BackendInstance* instance;
  };
  using ContextList = std::vector<HookedContext>;
  // slot_change.hpp: a generation change prepared by one path, committed by one of two policies
  // (replace the active slot, or bind beside it as a rollout's candidate).
  class SlotChange;
  // A network that a change re-prepares, and the preference list it is prepared with.
  struct Affected {
    NetworkId id;
    std::shared_ptr<const LoadedNetwork> network;
    std::vector<std::string> preferences;
  };
  using MovedNetworks = std::map<NetworkId, std::shared_ptr<const LoadedNetwork>>;

  Runtime(std::shared_ptr<BackendRegistry> registry, RuntimeOptions& options);
  Result<std::shared_ptr<const LoadedNetwork>> FindNetwork(NetworkId id) const;

  void AttachBackends() BACKPLANE_REQUIRES(mutex_);
  // From here to ValidateOnProbe, network_binding.cpp: what every path that binds networks
  // shares (a load, an option update, either policy of a slot change).
  // A slot for `instance` with this runtime's options for it applied, and its context. Calls
  // backend code: never with mutex_ held once the runtime is shared.
  static Result<BackendSlot> CreateSlot(std::shared_ptr<loader::BackendInstance> instance,
                                        const BackendOptions* options);
  // The network's preference list as given, or the default one; `arriving` is an id being
  // added that the default list ("every backend") must include.
  std::vector<std::string> PreferencesOf(NetworkId id, std::string_view arriving = {}) const
      BACKPLANE_REQUIRES(mutex_);
  InstanceMap CurrentInstances() const BACKPLANE_REQUIRES(mutex_);
  // Valid while backend_mutex_ is held: no slot is replaced without it.
  ContextList CurrentContexts() const BACKPLANE_REQUIRES(mutex_);
  std::shared_ptr<const LoadedNetwork> Reaped(std::unique_ptr<LoadedNetwork> network) const;
  // The instances for `preferences`, in order, from `instances`. Ids missing from it are appended
  // to `missing`: a preference list like "GpuAcc,CpuRef" must work on machines without GpuAcc, as
  // ArmNN's Optimize skips unavailable backends.
  static Instances InstancesFor(const std::vector<std::string>& preferences,
                                const InstanceMap& instances, std::string* missing = nullptr);
  // The loaded networks with a layer on backend `id`.
  std::vector<Affected> NetworksUsing(std::string_view id) const BACKPLANE_REQUIRES(mutex_);
  // The one way a loaded network gets new bindings (a generation change, a withdrawal, an
  // option update): prepared anew on `instances` (backend code: call without mutex_), then
  // switched by PublishMoved, one pointer store per network.
  // `network_options`: the network's own options to prepare with, when they change (null: its
  // current ones).
  Result<std::shared_ptr<const LoadedNetwork>> Reprepare(
      const Affected& network, const InstanceMap& instances,
      const OptionsByBackend* network_options = nullptr) const;
  void PublishMoved(const MovedNetworks& moved) BACKPLANE_REQUIRES(mutex_);
  // Runs the swap-validation probe through both networks as requests of this runtime (admitted
  // like any other, in its arena); kValidationFailed naming the first output that differs.
  Status ValidateOnProbe(const LoadedNetwork& current, const LoadedNetwork& candidate,
                         std::string_view backend_id, double tolerance);

  // slot_change.cpp: every generation change, active or candidate, takes this one path.
  Result<std::unique_ptr<PreparedChange>> PrepareChange(const BackendChange& change) override;

  // The part of a call's options that no binding checks (LoadedNetwork::CheckCallOptions checks
  // the backends it runs on): backend ids this runtime does not have, and values for backends
  // on which `network` runs no layer, checked against this runtime's instances.
  Status CheckCallOptionsElsewhere(const LoadedNetwork& network,
                                   const CallOptions& call_options) const;
  // Runs one request's inputs on the binding it was routed to (router_) and, during a rollout,
  // counts it and starts its shadow run. `inputs` owned by the caller (`owned` null) are copied
  // only when a shadow run needs them.
  Result<std::vector<Tensor>> ExecuteRouted(const RoutedRequest& routed,
                                            std::span<const ConstTensorView> inputs,
                                            std::vector<Tensor>* owned);
  // A run that failed because a worker died under it (reason CRASHED), run once more: a
  // candidate's on the stable binding at once, a stable generation's on the network's next
  // binding once the network has moved (crash_retry_wait at most).
  Result<std::vector<Tensor>> RunAgainAfterCrash(const RoutedRequest& routed,
                                                 std::span<const ConstTensorView> inputs,
                                                 Status crash) const;

  const std::shared_ptr<BackendRegistry> registry_;
  const std::vector<std::string> default_preferences_;
  const SwapPolicy swap_policy_;
  const std::map<std::string, SwapValidation, std::less<>> swap_validation_;
  const std::function<void(const CrashedRequest&)> on_crashed_request_;
  const std::chrono::milliseconds crash_retry_wait_;

  // Backend code of this runtime's slots takes turns on this: backend contexts are
  // thread-compatible. Held by LoadNetwork, UnloadNetwork and UpdateBackendOptions throughout,
  // and by a generation change from before its commit to the end of its AfterLoadNetwork hooks,
  // so no slot is replaced under a call. Taken before mutex_, which is never held while backend
  // code runs once the runtime is shared: a hook may call BackendIds, Backend, GetPlacement or
  // Execute, but must not load or unload networks (it would wait for its own turn).
  Mutex backend_mutex_;
  // The state below: taken briefly, to read it or to publish a change; a generation change's
  // commit holds it, with every other subscriber's, only for pointer stores. Requests read the
  // network map without it.
  mutable Mutex mutex_;
  BackendMap backends_ BACKPLANE_GUARDED_BY(mutex_);
  OptionsByBackend applied_options_ BACKPLANE_GUARDED_BY(mutex_);
  std::map<NetworkId, std::vector<std::string>> preferences_
      BACKPLANE_GUARDED_BY(mutex_);  // as given
  NetworkId next_network_id_ BACKPLANE_GUARDED_BY(mutex_) = 1;
  // Counts changes to the state above, so that a generation change prepared without the lock
  // can tell at commit time whether it still applies.
  uint64_t state_version_ BACKPLANE_GUARDED_BY(mutex_) = 0;
  Published<NetworkMap> networks_;
  // Progressive rollouts: each one's trial slots; the routes requests take are the router's,
  // published by the commits that change these slots (with mutex_ held). Outlives scheduler_:
  // requests use it. Its shadow runner, which runs no request of the scheduler's, is stopped
  // when it goes, before the trial slots.
  std::map<std::string, RolloutSlots, std::less<>> rollout_slots_ BACKPLANE_GUARDED_BY(mutex_);
  const std::unique_ptr<RolloutRouter> router_;

  // Builds shape programs off the request path; networks hold it by weak_ptr. The destructor
  // shuts it down first (queued builds dropped, the running one waited for).
  const std::shared_ptr<ShapeProgramBuilder> shape_program_builder_;
  // Destroyed first, waiting for requests in flight while everything they use still lives.
  scheduler::RequestScheduler scheduler_;
  // Destroyed before anything else: no generation change reaches a half-destroyed runtime.
  Subscription subscription_;
};

}  // namespace backplane
