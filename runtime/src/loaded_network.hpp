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
  static Result<std::unique_ptr<LoadedNetwork>> Create(
      std::shared_ptr<const Network> network,
      const std::vector<std::shared_ptr<loader::BackendInstance>>& backends);

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
  explicit LoadedNetwork(std::shared_ptr<const Network> network) : network_(std::move(network)) {}
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
