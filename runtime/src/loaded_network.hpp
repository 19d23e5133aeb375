// A network loaded on one runtime: each node bound to a workload of the first backend in the
// preference list that supports it. Private to core/src.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"
#include "backplane/loader/backend_instance.hpp"

namespace backplane {

// Thread-safe: Execute may run concurrently; each call has its own working memory. Immutable
// after Create.
class LoadedNetwork {
 public:
  // `backends` in preference order. Fails naming the node and every backend's reason when no
  // backend supports a node.
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
  struct Step {
    const Node* node;
    std::vector<int> inputs;   // value slots; -1 for an omitted optional input
    std::vector<int> outputs;  // value slots
    std::unique_ptr<loader::Workload> workload;
  };
  explicit LoadedNetwork(std::shared_ptr<const Network> network) : network_(std::move(network)) {}
  Status ValidateInputs(std::span<const ConstTensorView> inputs) const;

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
