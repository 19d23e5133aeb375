#include "loaded_network.hpp"

#include <algorithm>
#include <cstring>

namespace backplane {

namespace {

bool IsDynamic(const TensorInfo& info) {
  for (int64_t dim : info.shape) {
    if (dim < 0)
      return true;
  }
  return false;
}

// Import holds every shape to core's bound on element counts, but an embedder may hand
// LoadNetwork a Network it built itself. Execute allocates each value by its shape and backends
// size their loops by it, so a shape whose count wraps ([2^62+1, 4] is 4 elements in int64) or a
// constant whose data is shorter than its shape must not get that far.
Status CheckShapes(const Network& network) {
  // Without a dynamic input, Execute allocates every value by its load-time shape: each must be
  // concrete (a negative dimension would size a Tensor as a huge size_t).
  const bool dynamic = std::any_of(network.inputs.begin(), network.inputs.end(),
                                   [](const ValueInfo& input) { return IsDynamic(input.info); });
  for (const auto& [name, info] : network.values) {
    const std::string what = "value '" + name + "'";
    if (dynamic) {
      BACKPLANE_RETURN_IF_ERROR(CheckKnownElementCount(info.shape, what));
    } else if (auto count = CheckedElementCount(info.shape, what); !count.ok()) {
      return count.error();
    }
  }
  for (const auto& input : network.inputs)
    BACKPLANE_RETURN_IF_ERROR(
        CheckKnownElementCount(input.info.shape, "input '" + input.name + "'"));
  for (const auto& output : network.outputs) {
    BACKPLANE_RETURN_IF_ERROR(
        CheckKnownElementCount(output.info.shape, "output '" + output.name + "'"));
  }
  for (const auto& [name, tensor] : network.constants) {
    const std::string what = "constant '" + name + "'";
    auto bytes = CheckedByteSize(tensor.info(), what);
    if (!bytes.ok())
      return bytes.error();
    if (tensor.bytes().size() != *bytes) {
      return InvalidArgument(what + " holds " + std::to_string(tensor.bytes().size()) +
                             " bytes, its shape " + ToString(tensor.info().shape) + " of " +
                             std::string(ToString(tensor.info().type)) + " needs " +
                             std::to_string(*bytes));
    }
  }
  return Status::Ok();
}

}  // namespace

bool LoadedNetwork::Uses(std::string_view id) const {
  for (const auto& layer : placement_) {
    if (layer.backend_id == id)
      return true;
  }
  return false;
}

Result<std::unique_ptr<LoadedNetwork>> LoadedNetwork::Create(
    std::shared_ptr<const Network> network,
    const std::vector<std::shared_ptr<loader::BackendInstance>>& backends) {
  BACKPLANE_RETURN_IF_ERROR(CheckShapes(*network));
  std::unique_ptr<LoadedNetwork> loaded(new LoadedNetwork(std::move(network)));
  const Network& net = *loaded->network_;

  auto slot_of = [&](const std::string& name) {
    auto [it, inserted] =
        loaded->slots_.emplace(name, static_cast<int>(loaded->slot_names_.size()));
    if (inserted) {
      loaded->slot_names_.push_back(name);
      auto constant = net.constants.find(name);
      loaded->constants_.push_back(constant == net.constants.end() ? nullptr : &constant->second);
    }
    return it->second;
  };
  for (const auto& input : net.inputs) {
    loaded->input_slots_.push_back(slot_of(input.name));
    loaded->has_dynamic_shapes_ = loaded->has_dynamic_shapes_ || IsDynamic(input.info);
  }

  // 1. Placement (ArmNN's Optimize): each node on the first backend in preference order whose
  //    support query accepts it. No workload is created yet: a run of layers may be compiled.
  struct PlannedLayer {
    OperatorDesc desc;
    std::vector<int> inputs;   // value slots; -1 for an omitted optional input
    std::vector<int> outputs;  // value slots
    std::size_t backend = 0;   // index into `backends`
    std::string refusals;      // why each backend tried so far did not take it
  };
  std::vector<PlannedLayer> planned(net.nodes.size());
  for (std::size_t i = 0; i < net.nodes.size(); ++i) {
    const Node& node = net.nodes[i];
    PlannedLayer& layer = planned[i];
    layer.desc = {.op_type = node.op_type, .name = node.name, .attributes = node.attributes};
    for (const auto& input : node.inputs) {
      if (input.empty()) {
        layer.inputs.push_back(-1);
        layer.desc.inputs.push_back({});
        layer.desc.constant_inputs.push_back(nullptr);
        continue;
      }
      layer.inputs.push_back(slot_of(input));
      auto info = net.values.find(input);
      layer.desc.inputs.push_back(info == net.values.end() ? TensorInfo{} : info->second);
      auto constant = net.constants.find(input);
      layer.desc.constant_inputs.push_back(
          constant == net.constants.end() ? nullptr : constant->second.data());
    }
    for (const auto& output : node.outputs) {
      layer.outputs.push_back(slot_of(output));
      auto info = net.values.find(output);
      layer.desc.outputs.push_back(info == net.values.end() ? TensorInfo{} : info->second);
    }
    layer.backend = backends.size();
    for (std::size_t b = 0; b < backends.size(); ++b) {
      Status supported = backends[b]->IsSupported(layer.desc);
      if (supported.ok()) {
        layer.backend = b;
        break;
      }
      layer.refusals += "\n  " + backends[b]->id() + ": " + supported.message();
    }
    if (layer.backend == backends.size()) {
      return Unimplemented("node '" + node.name + "' (" + node.op_type +
                           ") is supported by no backend in the preference list" +
                           (backends.empty() ? std::string(" (the list is empty)") : ":") +
                           layer.refusals);
    }
  }
  for (const auto& output : net.outputs)
    loaded->output_slots_.push_back(slot_of(output.name));

  // Who reads each value last, and which values leave the network: a run must write a value it
  // produces exactly when a later layer or the caller reads it.
  constexpr std::size_t kNoReader = 0;  // reader indices below are node index + 1
  std::vector<std::size_t> last_reader(loaded->slot_names_.size(), kNoReader);
  std::vector<bool> network_output(loaded->slot_names_.size(), false);
  for (std::size_t i = 0; i < planned.size(); ++i) {
    for (int slot : planned[i].inputs) {
      if (slot >= 0)
        last_reader[slot] = i + 1;
    }
  }
  for (int slot : loaded->output_slots_)
    network_output[slot] = true;

  // 2. Workloads. One layer: its own workload, and when its backend cannot create it after all,
  //    the next backend in preference order that supports it (as before SDK 1.1).
  auto create_layer = [&](std::size_t i) -> Status {
    const Node& node = net.nodes[i];
    PlannedLayer& layer = planned[i];
    for (std::size_t b = layer.backend; b < backends.size(); ++b) {
      const auto& backend = backends[b];
      Status supported = b == layer.backend ? Status::Ok() : backend->IsSupported(layer.desc);
      if (supported.ok()) {
        auto workload = backend->CreateWorkload(layer.desc);
        if (workload.ok()) {
          loaded->steps_.push_back({.node = &node,
                                    .inputs = std::move(layer.inputs),
                                    .outputs = std::move(layer.outputs),
                                    .workload = std::move(workload).value()});
          loaded->placement_.push_back(
              {node.name, node.op_type, backend->id(), backend->generation_number()});
          return Status::Ok();
        }
        supported = workload.error();
      }
      layer.refusals += "\n  " + backend->id() + ": " + supported.message();
    }
    return Unimplemented("node '" + node.name + "' (" + node.op_type +
                         ") is supported by no backend in the preference list:" + layer.refusals);
  };

  // A run is a maximal sequence of two or more nodes that are consecutive in the network's node
  // order (a topological order) and placed on the same backend instance. Consecutive, not
  // connected: two independent branches that the order interleaves on one backend are one run,
  // since the boundary below describes any such set exactly and a backend that wants chains only
  // can decline; a chain that the order interrupts with another backend's layer is two runs.
  // Because the run is consecutive, its one workload can run where its first layer would have:
  // everything it reads is ready, and nothing before its last layer's successor reads what it
  // writes.
  for (std::size_t begin = 0; begin < planned.size();) {
    std::size_t end = begin + 1;
    while (end < planned.size() && planned[end].backend == planned[begin].backend)
      ++end;
    if (end - begin < 2) {
      BACKPLANE_RETURN_IF_ERROR(create_layer(begin));
      begin = end;
      continue;
    }
    loader::BackendInstance& backend = *backends[planned[begin].backend];

    // The boundary. Inputs: the non-constant values the run reads and does not produce, in the
    // order it first reads them (topological order: nothing in the run reads a value a later
    // layer of the run produces). Outputs: the values it produces that a layer after the run or
    // the caller reads, in the order it produces them. The shapes are the load-time ones
    // (negative: dynamic); Execute passes each request's own, as for any workload.
    SubgraphDesc subgraph;
    std::vector<int> input_slots;
    std::vector<int> output_slots;
    std::vector<bool> produced(loaded->slot_names_.size(), false);
    for (std::size_t i = begin; i < end; ++i) {
      PlannedLayer& layer = planned[i];
      const Node& node = net.nodes[i];
      for (int slot : layer.inputs) {
        if (slot < 0 || produced[slot] || loaded->constants_[slot] != nullptr ||
            std::find(input_slots.begin(), input_slots.end(), slot) != input_slots.end()) {
          continue;
        }
        input_slots.push_back(slot);
      }
      for (int slot : layer.outputs) {
        produced[slot] = true;
        if (last_reader[slot] > end || network_output[slot])
          output_slots.push_back(slot);
      }
      subgraph.layer_inputs.push_back(node.inputs);
      subgraph.layer_outputs.push_back(node.outputs);
      subgraph.layers.push_back(std::move(layer.desc));  // moved back below if declined
    }
    auto info_of = [&](int slot) {
      auto info = net.values.find(loaded->slot_names_[slot]);
      return info == net.values.end() ? TensorInfo{} : info->second;
    };
    for (int slot : input_slots) {
      subgraph.inputs.push_back(loaded->slot_names_[slot]);
      subgraph.input_infos.push_back(info_of(slot));
    }
    for (int slot : output_slots) {
      subgraph.outputs.push_back(loaded->slot_names_[slot]);
      subgraph.output_infos.push_back(info_of(slot));
    }

    // The backend's answer. BackendInstance never calls a backend built against API 1.0: it
    // declines for it, and the run gets per-layer workloads as it always did.
    auto compiled = backend.CompileSubgraph(subgraph);
    if (!compiled.ok()) {
      if (compiled.error().code() != StatusCode::kUnimplemented) {
        std::string layers;
        for (std::size_t i = begin; i < end; ++i) {
          layers += (layers.empty() ? "'" : ", '") + net.nodes[i].name + "' (" +
                    net.nodes[i].op_type + ")";
        }
        return compiled.error().WithContext(
            "backend " + backend.id() + " failed to compile the run of layers " + layers + ": ");
      }
      for (std::size_t i = begin; i < end; ++i) {
        planned[i].desc = std::move(subgraph.layers[i - begin]);
        BACKPLANE_RETURN_IF_ERROR(create_layer(i));
      }
      begin = end;
      continue;
    }
    loader::CompiledWorkload workload = std::move(compiled).value();
    for (std::size_t i = begin; i < end; ++i) {
      const Node& node = net.nodes[i];
      loaded->placement_.push_back({.node = node.name,
                                    .op_type = node.op_type,
                                    .backend_id = backend.id(),
                                    .generation = backend.generation_number(),
                                    .compiled = true,
                                    .subgraph = net.nodes[begin].name,
                                    .note = std::move(workload.layer_notes[i - begin])});
    }
    loaded->steps_.push_back({.node = &net.nodes[begin],
                              .layers = end - begin,
                              .inputs = std::move(input_slots),
                              .outputs = std::move(output_slots),
                              .workload = std::move(workload.workload)});
    begin = end;
  }
  return loaded;
}

std::string LoadedNetwork::Describe(const Step& step) const {
  const std::string& backend = step.workload->instance().id();
  if (step.layers == 1)
    return "node '" + step.node->name + "' (" + step.node->op_type + ") on backend " + backend;
  const Node& last = step.node[step.layers - 1];
  return "the " + std::to_string(step.layers) + " layers '" + step.node->name + "' to '" +
         last.name + "' compiled by backend " + backend;
}

Status LoadedNetwork::ValidateInputs(std::span<const ConstTensorView> inputs) const {
  const auto& expected = network_->inputs;
  if (inputs.size() != expected.size()) {
    std::string names;
    for (const auto& input : expected)
      names += (names.empty() ? "" : ", ") + input.name;
    return InvalidArgument("network " + network_->name + " takes " +
                           std::to_string(expected.size()) + " input(s) (" + names + "), got " +
                           std::to_string(inputs.size()));
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const TensorInfo& want = expected[i].info;
    const TensorInfo& got = inputs[i].info;
    if (got.type != want.type) {
      return InvalidArgument("input '" + expected[i].name + "' must be " +
                             std::string(ToString(want.type)) + ", got " +
                             std::string(ToString(got.type)));
    }
    bool shape_ok = got.shape.size() == want.shape.size();
    for (std::size_t d = 0; shape_ok && d < got.shape.size(); ++d) {
      shape_ok = got.shape[d] >= 0 && (want.shape[d] < 0 || want.shape[d] == got.shape[d]);
    }
    if (!shape_ok) {
      return InvalidArgument("input '" + expected[i].name + "' must have shape " +
                             ToString(want.shape) + " (negative: any size), got " +
                             ToString(got.shape));
    }
    // Dynamic dimensions let a request's shape multiply past int64; bounded before anything
    // (shape inference, the allocation of the values that follow) counts its elements.
    auto count = CheckedElementCount(got.shape, "input '" + expected[i].name + "'");
    if (!count.ok())
      return count.error();
    if (inputs[i].data == nullptr && *count > 0) {
      return InvalidArgument("input '" + expected[i].name + "' has no data");
    }
  }
  return Status::Ok();
}

Result<std::vector<Tensor>> LoadedNetwork::Execute(std::span<const ConstTensorView> inputs) const {
  BACKPLANE_RETURN_IF_ERROR(ValidateInputs(inputs));

  // Shapes: fixed at load time, or inferred for this request's dynamic dimensions.
  const std::map<std::string, TensorInfo, std::less<>>* values = &network_->values;
  std::map<std::string, TensorInfo, std::less<>> request_values;
  if (has_dynamic_shapes_) {
    std::vector<TensorInfo> input_infos;
    for (const auto& input : inputs)
      input_infos.push_back(input.info);
    auto inferred = InferShapes(*network_, input_infos);
    if (!inferred.ok())
      return std::move(inferred).error();
    request_values = std::move(inferred).value();
    values = &request_values;
  }

  // Per-request working memory: one tensor per non-constant value, views into the inputs.
  std::vector<Tensor> owned(slot_names_.size());
  std::vector<ConstTensorView> views(slot_names_.size());
  for (std::size_t slot = 0; slot < constants_.size(); ++slot) {
    if (constants_[slot] != nullptr)
      views[slot] = constants_[slot]->View();
  }
  for (std::size_t i = 0; i < input_slots_.size(); ++i)
    views[input_slots_[i]] = inputs[i];

  std::vector<ConstTensorView> step_inputs;
  std::vector<TensorView> step_outputs;
  for (const Step& step : steps_) {
    step_inputs.clear();
    step_outputs.clear();
    for (int slot : step.inputs)
      step_inputs.push_back(slot < 0 ? ConstTensorView{} : views[slot]);
    for (int slot : step.outputs) {
      auto info = values->find(slot_names_[slot]);
      if (info == values->end()) {
        return Internal("node '" + step.node->name + "': no shape inferred for output '" +
                        slot_names_[slot] + "'");
      }
      owned[slot] = Tensor(info->second);
      views[slot] = owned[slot].View();
      step_outputs.push_back(owned[slot].MutableView());
    }
    Status status = step.workload->Execute(step_inputs, step_outputs);
    if (!status.ok())
      return Status(status.code(), Describe(step) + ": " + status.message());
  }

  std::vector<Tensor> outputs;
  for (int slot : output_slots_) {
    if (!owned[slot].bytes().empty() || owned[slot].info().type != DataType::kUndefined) {
      outputs.push_back(owned[slot]);  // a copy: one value may be two outputs
    } else {
      // A graph output that is a graph input or a constant: copy its view.
      const ConstTensorView& view = views[slot];
      Tensor copy(view.info);
      if (view.data != nullptr)
        std::memcpy(copy.data(), view.data, copy.bytes().size());
      outputs.push_back(std::move(copy));
    }
  }
  return outputs;
}

}  // namespace backplane
