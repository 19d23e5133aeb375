// A network loaded on one runtime: each node bound to the first backend in the preference list
// that supports it, and run either by a workload of its own or, when its backend compiled the run
// of consecutive layers it belongs to (SDK 1.1), by that run's one workload. Private to
// runtime/src.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backplane/loader/backend_instance.hpp"
#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"

namespace backplane {

// Thread-safe: Execute may run concurrently; each call has its own working memory. Immutable
// after Create.
class LoadedNetwork {
 public:
  // `backends` in preference order. Fails naming the node and every backend's reason when no
  // backend supports a node, and naming the backend and the layers when a backend fails to
  // compile a run of layers (anything but declining with kUnimplemented).
  // `network` is shared with the networks that replace this one on a new generation.
  using Backends = std::vector<std::shared_ptr<loader::BackendInstance>>;
  static Result<std::unique_ptr<LoadedNetwork>> Create(std::shared_ptr<const Network> network,
                                                       const Backends& backends);

  const Network& network() const { return *network_; }
  const std::shared_ptr<const Network>& shared_network() const { return network_; }
  // Whether any layer runs on backend `id`.
  bool Uses(std::string_view id) const;
  const std::vector<LayerPlacement>& placement() const { return placement_; }

  // Runs one request. `inputs` in the order of network().inputs; returns the outputs in the
  // order of network().outputs.
  Result<std::vector<Tensor>> Execute(std::span<const ConstTensorView> inputs) const;

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
  struct Run {  // planned layers [begin, end), consecutive and on one backend instance
    std::size_t begin;
    std::size_t end;
  };
  explicit LoadedNetwork(std::shared_ptr<const Network> network) : network_(std::move(network)) {}

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

  Status ValidateInputs(std::span<const ConstTensorView> inputs) const;
  std::string Describe(const Step& step) const;

  // Declaration order matters: steps_ (workloads) are destroyed before network_, whose constant
  // tensors the workloads may point into.
  const std::shared_ptr<const Network> network_;
  bool has_dynamic_shapes_ = false;
  std::vector<std::string> slot_names_;  // slot -> value name
  std::map<std::string, int, std::less<>> slots_;
  std::vector<const Tensor*> constants_;  // slot -> constant, or null
  std::vector<int> input_slots_;
  std::vector<int> output_slots_;
  std::vector<Step> steps_;
  std::vector<LayerPlacement> placement_;
};

}  // namespace backplane
