#include "loaded_network.hpp"

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

  for (const Node& node : net.nodes) {
    OperatorDesc desc{.op_type = node.op_type, .name = node.name, .attributes = node.attributes};
    Step step{.node = &node};
    for (const auto& input : node.inputs) {
      if (input.empty()) {
        step.inputs.push_back(-1);
        desc.inputs.push_back({});
        desc.constant_inputs.push_back(nullptr);
        continue;
      }
      step.inputs.push_back(slot_of(input));
      auto info = net.values.find(input);
      desc.inputs.push_back(info == net.values.end() ? TensorInfo{} : info->second);
      auto constant = net.constants.find(input);
      desc.constant_inputs.push_back(constant == net.constants.end() ? nullptr
                                                                     : constant->second.data());
    }
    for (const auto& output : node.outputs) {
      step.outputs.push_back(slot_of(output));
      auto info = net.values.find(output);
      desc.outputs.push_back(info == net.values.end() ? TensorInfo{} : info->second);
    }

    // ArmNN's Optimize: the first backend in preference order whose support query accepts it.
    std::string refusals;
    for (const auto& backend : backends) {
      Status supported = backend->IsSupported(desc);
      if (supported.ok()) {
        auto workload = backend->CreateWorkload(desc);
        if (workload.ok()) {
          step.workload = std::move(workload).value();
          loaded->placement_.push_back(
              {node.name, node.op_type, backend->id(), backend->generation_number()});
          break;
        }
        supported = workload.error();
      }
      refusals += "\n  " + backend->id() + ": " + supported.message();
    }
    if (step.workload == nullptr) {
      return Unimplemented("node '" + node.name + "' (" + node.op_type +
                           ") is supported by no backend in the preference list" +
                           (backends.empty() ? std::string(" (the list is empty)") : ":") +
                           refusals);
    }
    loaded->steps_.push_back(std::move(step));
  }
  for (const auto& output : net.outputs)
    loaded->output_slots_.push_back(slot_of(output.name));
  return loaded;
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
    if (inputs[i].data == nullptr && got.ElementCount() > 0) {
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
    if (!status.ok()) {
      return Status(status.code(), "node '" + step.node->name + "' (" + step.node->op_type +
                                       ") on backend " + step.workload->instance().id() + ": " +
                                       status.message());
    }
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
