// A network loaded on one runtime: each node bound to the first backend in the preference list
// that supports it, and run either by a workload of its own or, when its backend compiled the run
// of consecutive layers it belongs to (SDK 1.1), by that run's one workload. With dynamic input
// dimensions, each input shape a request brings gets a shape program on first use (below).
// Private to runtime/src.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "backplane/loader/backend_instance.hpp"
#include "backplane/loader/reaper.hpp"
#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"
#include "shape_program_builder.hpp"
#include "shape_program_cache.hpp"

namespace backplane {

// What a binding does with input shapes it has not seen, kept by the bindings that replace it
// on a hot swap (each starts its own cache; the counters carry over).
struct ShapeProgramOptions {
  std::size_t capacity = 0;  // 0: no shape programs
  std::shared_ptr<ShapeProgramCounters> counters = std::make_shared<ShapeProgramCounters>();
  // Where programs are destroyed (their workloads are backend code: loading rule 6); null: by
  // whoever drops the last reference.
  std::shared_ptr<loader::Reaper> reaper;
  // Where programs are built, off the request path (the Runtime's). Null or shut down, or a
  // LoadedNetwork not owned by a shared_ptr: the first request at a shape builds it itself.
  std::weak_ptr<ShapeProgramBuilder> builder;
};

// Shape programs. A network exported with a symbolic batch dimension has dynamic shapes at load
// time; a backend like CpuAcc declines to compile runs of such layers, and each request would run
// one primitive per layer and infer every value's shape anew. So each input shape a request
// brings gets, on first use, a program: every value's shape inferred once, and each run that its
// backend declined at load time offered again (CompileSubgraph) with that shape's concrete
// dimensions. Where the backend compiles it, the program runs the compiled workload; where it
// declines again or fails, the program shares the run's load-time per-layer workloads (a failure
// is logged once per program and kept in it, so it is not retried per request). A run the backend
// compiled at load time, dimensions unknown, is kept: that backend said it runs every shape, and
// a second program per shape would cost memory for no promised gain.
// Costs and traps:
//  - the first request at a new shape claims its program and hands the build (every compile) to
//    the Runtime's ShapeProgramBuilder thread; it and the requests of that shape arriving before
//    the program is published run the load-time workloads at that shape (shape inference per
//    request), never wait and never compile it a second time. The program appears once the
//    builder gets to it (after the builds queued before it): docs/performance.md measures both;
//  - the build holds only a weak_ptr to its LoadedNetwork: a network unloaded or swapped out
//    before its build starts is not built for; a build running holds it, and its last
//    reference, dropped on the build's thread, hands it to the reaper like any other (rule 6);
//  - a client that sends a new shape per request makes every request pay a compile and evict a
//    program: the capacity bounds memory, not that cost;
//  - programs live in a bounded LRU cache; an evicted program lives on while requests run it
//    (shared_ptr), and is destroyed on the reaper like the network itself;
//  - a program belongs to one binding (one set of generations): a hot swap prepares a new
//    LoadedNetwork with an empty cache, and the old programs go with the old binding.
//
// Thread-safe: Execute may run concurrently; each call has its own working memory. Immutable
// after Create but for the shape program cache, which has its own short lock.
// enable_shared_from_this: a queued build refers to its network by weak_ptr.
class LoadedNetwork : public std::enable_shared_from_this<LoadedNetwork> {
 public:
  // `backends` in preference order. Fails naming the node and every backend's reason when no
  // backend supports a node, and naming the backend and the layers when a backend fails to
  // compile a run of layers (anything but declining with kUnimplemented).
  // `network` is shared with the networks that replace this one on a new generation.
  using Backends = std::vector<std::shared_ptr<loader::BackendInstance>>;
  // `network_options`: the network's own options per backend id (NetworkOptions::
  // backend_options), checked by each backend it names among `backends` before anything is
  // prepared (a refusal fails Create naming the backend), and given to every workload.
  // `instances`: the network's limit on executions at once, shared by every binding of it (null:
  // a limit of its own, with none set).
  static Result<std::unique_ptr<LoadedNetwork>> Create(
      std::shared_ptr<const Network> network, const Backends& backends,
      ShapeProgramOptions shape_programs = {}, OptionsByBackend network_options = {},
      std::shared_ptr<scheduler::ConcurrencyLimit> instances = nullptr);
  ~LoadedNetwork();

  const Network& network() const { return *network_; }
  const std::shared_ptr<const Network>& shared_network() const { return network_; }
  // Whether any layer runs on backend `id`.
  bool Uses(std::string_view id) const;
  // The generation of backend `id` its layers run on; 0 when none does (or the backend is static).
  uint64_t GenerationOn(std::string_view id) const;
  const std::vector<LayerPlacement>& placement() const { return placement_; }
  // What a binding that replaces this one is created with.
  const ShapeProgramOptions& shape_program_options() const { return shape_program_options_; }
  const OptionsByBackend& network_options() const { return network_options_; }
  // Taken for each execution by the runtime (not by Execute below: a shadow run, a crash's re-run
  // and the swap-validation probe run without a turn of their own).
  const std::shared_ptr<scheduler::ConcurrencyLimit>& instances() const { return instances_; }
  ShapeProgramStats shape_program_stats() const;

  // What a call may give a backend this network runs on (SDK 1.4): its declared options, and the
  // names of those it takes per call. Asked of each backend once per Create, so that checking a
  // request's options calls no backend code.
  struct CallOptionRules {
    std::vector<OptionDescriptor> declared;
    std::vector<std::string> per_call;  // IBackend::DescribeCallOptions
  };
  // `values` for backend `backend_id` against its `rules`: each declared, of the declared type,
  // taken per call, thread counts within the usable CPUs. kInvalidArgument naming backend and key.
  static Status CheckCallOptionValues(const BackendOptions& values, const CallOptionRules& rules,
                                      std::string_view backend_id);
  // Null when no layer runs on backend `id`.
  const CallOptionRules* CallOptionRulesFor(std::string_view id) const;
  // A call's values for the backends this binding runs on (the others are not looked at): each
  // declared by its backend, of the declared type, taken per call, thread counts within the
  // usable CPUs. kInvalidArgument naming backend and key.
  Status CheckCallOptions(const CallOptions& call_options) const;

  // Runs one request. `inputs` in the order of network().inputs; returns the outputs in the
  // order of network().outputs. `call_options` (null: none): this call's values per backend id,
  // checked first (CheckCallOptions: a refusal runs nothing); each workload on a backend they
  // name runs with them over the values it was prepared with (IWorkload::ExecuteWithOptions),
  // the others as without. Every binding of a request checks them itself (a rollout's arms, a
  // run again after a crash, a shadow run): two generations may declare different options.
  Result<std::vector<Tensor>> Execute(std::span<const ConstTensorView> inputs,
                                      const CallOptions* call_options = nullptr) const;

 private:
  // One workload and the slots it reads and writes. A compiled subgraph is a step like any
  // other: its inputs and outputs are the run's boundary values, and the values inside the run
  // get no slot memory at all, so Execute has no special case for it.
  struct Step {
    const Node* node;          // the layer, or the first layer of a compiled run
    std::size_t layers = 1;    // network nodes [node, node + layers) that this step runs
    std::vector<int> inputs;   // value slots; -1 for an omitted optional input
    std::vector<int> outputs;  // value slots
    std::unique_ptr<loader::Workload> workload;
  };
  struct PlannedLayer;
  struct Liveness;
  struct Boundary;
  struct ShapeProgram;
  struct PendingBuild;
  struct DeclinedRun;
  struct Run {  // planned layers [begin, end), consecutive and on one backend instance
    std::size_t begin;
    std::size_t end;
  };
  explicit LoadedNetwork(std::shared_ptr<const Network> network);

  // Create's steps, in the order it takes them.
  // Every value name gets one slot, in the order first seen, so that Execute indexes, not looks up.
  int SlotOf(const std::string& name);
  // The inputs are numbered first: Execute puts the caller's views into their slots.
  void NumberInputs();
  // Placement (ArmNN's Optimize): each node on the first backend whose support query accepts it,
  // with no workload yet, so that a run of layers may still be compiled whole.
  Result<std::vector<PlannedLayer>> Place(const Backends& backends);
  // The outputs are numbered after placement, so that slots keep the order they always had.
  void NumberOutputs();
  // Who reads each value last and what the caller reads: a compiled run must write a value it
  // produces exactly when a later layer or the caller reads it.
  Liveness FindLiveness(const std::vector<PlannedLayer>& planned) const;
  // The maximal runs of consecutive layers on one backend instance; what may be compiled as one.
  static std::vector<Run> PartitionRuns(const std::vector<PlannedLayer>& planned);
  // One layer's own workload, falling back to the next backend in preference order that supports
  // it when its backend cannot create it after all (as before SDK 1.1).
  Status CreateLayerStep(std::size_t i, std::vector<PlannedLayer>& planned,
                         const Backends& backends);
  // The run's layers and boundary, as the backend sees them. Inputs: the non-constant values the
  // run reads and does not produce, in the order it first reads them. Outputs: the values it
  // produces that a later layer or the caller reads, in the order it produces them. Shapes are
  // the load-time ones (negative: dynamic). Moves the layers' descriptions out of `planned`.
  Boundary BoundaryOf(const Run& run, std::vector<PlannedLayer>& planned,
                      const Liveness& liveness) const;
  // Offers a run of two or more layers to its backend (SDK 1.1): compiled, it is one step; declined
  // (kUnimplemented), each layer gets its own; any other failure fails the load, naming the run.
  Status CompileRun(const Run& run, std::vector<PlannedLayer>& planned, const Liveness& liveness,
                    const Backends& backends);

  // Keeps a run that its backend declined while some of its dimensions were unknown, to offer it
  // again per input shape; called before its per-layer steps are created from `planned`. Returns
  // whether it kept it (only with dynamic shapes somewhere in the run, and a capacity).
  bool KeepDeclinedRun(const Run& run, const Boundary& boundary,
                       const std::vector<PlannedLayer>& planned,
                       std::shared_ptr<loader::BackendInstance> backend);
  // After Create's steps: the steps in order, the load-time shapes by slot, the program cache.
  void FinishPlan();
  // A step that reads only constants computes the same values for every request (a
  // DequantizeLinear of int8 weights no backend fused, a Reshape of a constant): it runs once
  // here, its outputs join the constants (folded_), and no request runs it. Only at static
  // shapes. A declined run offered again per shape that compiles computes it inside the run as
  // before; uncompiled, its steps are taken without the folded ones. A step that fails here
  // stays, to fail each request as it would have.
  void FoldConstantSteps();
  bool IsFolded(const Step& step) const { return folded_steps_.contains(&step); }

  Status ValidateInputs(std::span<const ConstTensorView> inputs) const;
  // Every value's shape at this request's input shapes, by slot (kUndefined: none inferred).
  Result<std::vector<TensorInfo>> InferSlotShapes(std::span<const ConstTensorView> inputs) const;
  // The program for `shapes`: each declined run offered again with concrete dimensions.
  std::shared_ptr<const ShapeProgram> BuildShapeProgram(const InputShapes& shapes,
                                                        std::vector<TensorInfo> slot_shapes) const;
  // Per backend id a call gives values for: every declared option at this call's value (the
  // call's, else what the backend's workloads here were prepared with). Few entries: searched.
  using MergedCallOptions = std::vector<std::pair<std::string_view, BackendOptions>>;
  MergedCallOptions MergeCallOptions(const CallOptions& call_options) const;
  // The request itself, over `steps` with value shapes `slot_shapes`; `merged` (null: none) as
  // MergeCallOptions made it.
  Result<std::vector<Tensor>> RunSteps(std::span<const Step* const> steps,
                                       const std::vector<TensorInfo>& slot_shapes,
                                       std::span<const ConstTensorView> inputs,
                                       const MergedCallOptions* merged) const;
  std::string Describe(const Step& step) const;
  // The network's own options for backend `id`; empty when it has none.
  const BackendOptions& NetworkOptionsFor(std::string_view id) const;
  // What `backend`'s workloads of this network are prepared with, for the placement (asked of
  // each backend once per Create).
  const BackendOptions& EffectiveOptionsOn(const loader::BackendInstance& backend);

  // Declaration order matters: steps_ (workloads) are destroyed before network_, whose constant
  // tensors the workloads may point into.
  const std::shared_ptr<const Network> network_;
  bool has_dynamic_shapes_ = false;
  std::vector<std::string> slot_names_;  // slot -> value name
  std::map<std::string, int, std::less<>> slots_;
  std::vector<const Tensor*> constants_;  // slot -> constant (network's or folded_), or null
  std::deque<Tensor> folded_;             // outputs of folded steps; a deque keeps addresses
  std::set<const Step*> folded_steps_;
  std::vector<int> input_slots_;
  std::vector<int> output_slots_;
  std::vector<Step> steps_;
  std::vector<LayerPlacement> placement_;
  // Set by FinishPlan.
  std::vector<const Step*> load_time_steps_;  // &steps_[i], what a request without program runs
  std::vector<TensorInfo> load_time_shapes_;  // slot -> the network's (static) shape
  std::vector<DeclinedRun> declined_runs_;    // what a shape program offers again
  ShapeProgramOptions shape_program_options_;
  OptionsByBackend network_options_;
  std::shared_ptr<scheduler::ConcurrencyLimit> instances_;
  OptionsByBackend effective_options_;  // by backend id, filled as Create places layers
  std::map<std::string, CallOptionRules, std::less<>> call_option_rules_;  // filled alike
  // Null without dynamic inputs or at capacity 0. Declared last: programs (whose steps point into
  // steps_) are released first.
  std::unique_ptr<ShapeProgramCache<ShapeProgram>> shape_programs_;
};

}  // namespace backplane
