#include "loaded_network.hpp"

#include <algorithm>
#include <cstring>

#include "backplane/core/backend_call_record.hpp"
#include "backplane/sdk/thread_limits.hpp"
#include "runtime_log.hpp"

namespace backplane {

namespace {

std::string DescribeInputShapes(const InputShapes& shapes) {
  std::string text;
  for (const Shape& shape : shapes)
    text += (text.empty() ? "" : ", ") + ToString(shape);
  return text;
}

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

uint64_t LoadedNetwork::GenerationOn(std::string_view id) const {
  for (const auto& layer : placement_) {
    if (layer.backend_id == id)
      return layer.generation;
  }
  return 0;
}

bool LoadedNetwork::Uses(std::string_view id) const {
  for (const auto& layer : placement_) {
    if (layer.backend_id == id)
      return true;
  }
  return false;
}

// A node placed on a backend, its workload not yet created: a run of layers may be compiled.
struct LoadedNetwork::PlannedLayer {
  OperatorDesc desc;
  std::vector<int> inputs;   // value slots; -1 for an omitted optional input
  std::vector<int> outputs;  // value slots
  std::size_t backend = 0;   // index into the preference-ordered backends
  std::string refusals;      // why each backend tried so far did not take it
};

// Who reads each value last, and which values leave the network.
struct LoadedNetwork::Liveness {
  static constexpr std::size_t kNoReader = 0;  // reader indices are node index + 1
  std::vector<std::size_t> last_reader;        // slot -> last reading node + 1, or kNoReader
  std::vector<bool> network_output;            // slot -> whether the caller reads it
};

// What a backend is offered for a run: the run's layers and their boundary values.
struct LoadedNetwork::Boundary {
  SubgraphDesc subgraph;
  std::vector<int> input_slots;
  std::vector<int> output_slots;
};

// A run its backend declined at load time with dimensions unknown: offered again per input shape.
struct LoadedNetwork::DeclinedRun {
  std::size_t first_step;  // its per-layer steps are steps_[first_step, first_step + layers)
  std::size_t layers;
  std::shared_ptr<loader::BackendInstance> backend;
  Boundary boundary;                                 // load-time shapes
  std::vector<std::vector<int>> layer_input_slots;   // per layer, parallel to its desc's inputs
  std::vector<std::vector<int>> layer_output_slots;  // per layer, parallel to its desc's outputs
};

// What Execute runs for one set of input shapes. Immutable once published to the cache, so that
// any number of requests run it at once (its workloads are thread-safe like every IWorkload).
struct LoadedNetwork::ShapeProgram {
  // First, so destroyed last: the compiled workloads may point into its constants, and a program
  // may be destroyed on the reaper after the LoadedNetwork that built it.
  std::shared_ptr<const Network> network;
  std::vector<TensorInfo> slot_shapes;  // slot -> shape at these input shapes
  std::vector<Step> compiled;           // the runs compiled at these shapes; never reallocated
  // The request's steps in order: &compiled[i], or the load-time steps (shared, not re-created)
  // of everything else. Valid while the LoadedNetwork lives, which every request using it holds.
  std::vector<const Step*> steps;
  std::size_t compiled_layers = 0;
  std::string failures;  // why runs failed to compile at these shapes, for the stats
};

// A program's build, queued on the ShapeProgramBuilder by the first request at its shape. Holds
// its network by weak_ptr, so that a queued build does not keep an unloaded or swapped-out network
// (and its backends' generation) alive: the build is cancelled when it finds it gone. Trap: the
// claim points into the network's cache, so it may be released only while a strong reference
// proves that cache alive; without one it is abandoned (the cache went with its network).
struct LoadedNetwork::PendingBuild {
  PendingBuild(std::weak_ptr<const LoadedNetwork> network,
               ShapeProgramCache<ShapeProgram>::Claim claim, InputShapes shapes,
               std::vector<TensorInfo> slot_shapes)
      : network(std::move(network)),
        claim(std::move(claim)),
        shapes(std::move(shapes)),
        slot_shapes(std::move(slot_shapes)) {}

  std::weak_ptr<const LoadedNetwork> network;
  ShapeProgramCache<ShapeProgram>::Claim claim;
  InputShapes shapes;
  std::vector<TensorInfo> slot_shapes;

  // On the builder thread. `alive` may be the last reference to the network: its deleter hands
  // it to the reaper (LoadedNetworks are reaped), so no backend code is destroyed here.
  void Build() {
    std::shared_ptr<const LoadedNetwork> alive = network.lock();
    if (alive == nullptr) {
      claim.Abandon();
      return;
    }
    const ScopedModelRun running(alive->network().name.c_str());  // `alive` holds it
    claim.Publish(alive->BuildShapeProgram(shapes, std::move(slot_shapes)));
  }
  // Refused by a full queue, dropped by a shutdown, or thrown out of Build: releases the claim
  // if its cache still lives, so that a later request of that shape claims it again.
  ~PendingBuild() {
    if (!claim)
      return;
    std::shared_ptr<const LoadedNetwork> alive = network.lock();
    if (alive == nullptr) {
      claim.Abandon();  // its cache went with the network
      return;
    }
    // Released here, while `alive` holds the cache: the member would only be destroyed after
    // `alive` is gone.
    auto released = std::move(claim);
  }
};

Result<std::unique_ptr<LoadedNetwork>> LoadedNetwork::Create(
    std::shared_ptr<const Network> network, const Backends& backends,
    ShapeProgramOptions shape_programs, OptionsByBackend network_options,
    std::shared_ptr<scheduler::ConcurrencyLimit> instances) {
  BACKPLANE_RETURN_IF_ERROR(CheckShapes(*network));
  std::unique_ptr<LoadedNetwork> loaded(new LoadedNetwork(std::move(network)));
  // The backend calls below (support queries, workloads, compiled runs) are for this model, as
  // a crash report says; the name is the network's, which `loaded` holds.
  const ScopedModelRun running(loaded->network().name.c_str());
  for (const auto& backend : backends) {
    if (auto own = network_options.find(backend->id()); own != network_options.end()) {
      Status accepted = backend->CheckNetworkOptions(own->second);
      if (!accepted.ok())
        return accepted.WithContext("its options for backend " + backend->id() + ": ");
    }
  }
  loaded->shape_program_options_ = std::move(shape_programs);
  loaded->network_options_ = std::move(network_options);
  loaded->instances_ =
      instances != nullptr ? std::move(instances) : scheduler::ConcurrencyLimit::Create(0);
  loaded->NumberInputs();
  auto planned = loaded->Place(backends);
  if (!planned.ok())
    return std::move(planned).error();
  loaded->NumberOutputs();
  const Liveness liveness = loaded->FindLiveness(planned.value());
  for (const Run& run : PartitionRuns(planned.value())) {
    BACKPLANE_RETURN_IF_ERROR(run.end - run.begin < 2
                                  ? loaded->CreateLayerStep(run.begin, planned.value(), backends)
                                  : loaded->CompileRun(run, planned.value(), liveness, backends));
  }
  loaded->FinishPlan();
  loaded->FoldConstantSteps();
  return loaded;
}

const BackendOptions& LoadedNetwork::NetworkOptionsFor(std::string_view id) const {
  static const BackendOptions kNone;
  const auto it = network_options_.find(id);
  return it == network_options_.end() ? kNone : it->second;
}

const BackendOptions& LoadedNetwork::EffectiveOptionsOn(const loader::BackendInstance& backend) {
  auto it = effective_options_.find(backend.id());
  if (it == effective_options_.end()) {
    it = effective_options_
             .emplace(backend.id(), backend.EffectiveOptions(NetworkOptionsFor(backend.id())))
             .first;
    call_option_rules_.insert_or_assign(
        backend.id(), CallOptionRules{backend.DescribeOptions(), backend.DescribeCallOptions()});
  }
  return it->second;
}

const LoadedNetwork::CallOptionRules* LoadedNetwork::CallOptionRulesFor(std::string_view id) const {
  auto it = call_option_rules_.find(id);
  return it == call_option_rules_.end() ? nullptr : &it->second;
}

Status LoadedNetwork::CheckCallOptions(const CallOptions& call_options) const {
  for (const auto& [backend_id, values] : call_options) {
    const CallOptionRules* rules = CallOptionRulesFor(backend_id);
    if (rules == nullptr || values.empty())
      continue;
    BACKPLANE_RETURN_IF_ERROR(CheckCallOptionValues(values, *rules, backend_id));
  }
  return Status::Ok();
}

Status LoadedNetwork::CheckCallOptionValues(const BackendOptions& values,
                                            const CallOptionRules& rules,
                                            std::string_view backend_id) {
  BACKPLANE_RETURN_IF_ERROR(
      ValidateCallOptions(values, rules.declared, rules.per_call, backend_id));
  return CheckThreadCounts(values, rules.declared, backend_id);
}

LoadedNetwork::MergedCallOptions LoadedNetwork::MergeCallOptions(
    const CallOptions& call_options) const {
  MergedCallOptions merged;
  for (const auto& [backend_id, values] : call_options) {
    auto prepared = effective_options_.find(backend_id);
    const CallOptionRules* rules = CallOptionRulesFor(backend_id);
    if (values.empty() || prepared == effective_options_.end() || rules == nullptr)
      continue;  // no layer of this binding runs there
    BackendOptions options = prepared->second;
    for (auto& [key, value] : WidenedCallOptions(values, rules->declared))
      options.insert_or_assign(key, std::move(value));
    merged.emplace_back(prepared->first, std::move(options));
  }
  return merged;
}

// Defined here, where DeclinedRun and ShapeProgram are complete.
LoadedNetwork::LoadedNetwork(std::shared_ptr<const Network> network)
    : network_(std::move(network)) {}
LoadedNetwork::~LoadedNetwork() = default;

void LoadedNetwork::FinishPlan() {
  for (const Step& step : steps_)
    load_time_steps_.push_back(&step);
  load_time_shapes_.resize(slot_names_.size());
  for (std::size_t slot = 0; slot < slot_names_.size(); ++slot) {
    if (auto info = network_->values.find(slot_names_[slot]); info != network_->values.end())
      load_time_shapes_[slot] = info->second;
  }
  if (has_dynamic_shapes_ && shape_program_options_.capacity > 0) {
    shape_programs_ = std::make_unique<ShapeProgramCache<ShapeProgram>>(
        shape_program_options_.capacity, shape_program_options_.counters);
  }
}

void LoadedNetwork::FoldConstantSteps() {
  for (const Step& step : steps_) {
    const bool reads_constants_only =
        std::all_of(step.inputs.begin(), step.inputs.end(),
                    [&](int slot) { return slot < 0 || constants_[slot] != nullptr; });
    const bool static_outputs =
        std::all_of(step.outputs.begin(), step.outputs.end(), [&](int slot) {
          return load_time_shapes_[slot].type != DataType::kUndefined &&
                 !IsDynamic(load_time_shapes_[slot]);
        });
    if (!reads_constants_only || !static_outputs)
      continue;
    std::vector<ConstTensorView> inputs;
    for (int slot : step.inputs)
      inputs.push_back(slot < 0 ? ConstTensorView{} : constants_[slot]->View());
    std::vector<Tensor> values;
    std::vector<TensorView> outputs;
    for (int slot : step.outputs)
      values.emplace_back(load_time_shapes_[slot]);
    for (Tensor& value : values)
      outputs.push_back(value.MutableView());
    if (Status computed = step.workload->Execute(inputs, outputs); !computed.ok()) {
      RuntimeLog().debug(
          "network {}: {} reads only constants but failed at load ({}); it runs "
          "per request",
          network_->name, Describe(step), computed.message());
      continue;
    }
    for (std::size_t k = 0; k < values.size(); ++k) {
      folded_.push_back(std::move(values[k]));
      constants_[step.outputs[k]] = &folded_.back();
    }
    folded_steps_.insert(&step);
    const std::size_t first = static_cast<std::size_t>(step.node - network_->nodes.data());
    for (std::size_t layer = first; layer < first + step.layers; ++layer) {
      std::string& note = placement_[layer].note;
      note = note.empty() ? "folded: computed once at load" : note + "; folded at load";
    }
  }
  if (folded_steps_.empty())
    return;
  std::erase_if(load_time_steps_, [&](const Step* step) { return IsFolded(*step); });
}

int LoadedNetwork::SlotOf(const std::string& name) {
  auto [it, inserted] = slots_.emplace(name, static_cast<int>(slot_names_.size()));
  if (inserted) {
    slot_names_.push_back(name);
    auto constant = network_->constants.find(name);
    constants_.push_back(constant == network_->constants.end() ? nullptr : &constant->second);
  }
  return it->second;
}

void LoadedNetwork::NumberInputs() {
  for (const auto& input : network_->inputs) {
    input_slots_.push_back(SlotOf(input.name));
    has_dynamic_shapes_ = has_dynamic_shapes_ || IsDynamic(input.info);
  }
}

void LoadedNetwork::NumberOutputs() {
  for (const auto& output : network_->outputs)
    output_slots_.push_back(SlotOf(output.name));
}

Result<std::vector<LoadedNetwork::PlannedLayer>> LoadedNetwork::Place(const Backends& backends) {
  const Network& net = *network_;
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
      layer.inputs.push_back(SlotOf(input));
      auto info = net.values.find(input);
      layer.desc.inputs.push_back(info == net.values.end() ? TensorInfo{} : info->second);
      auto constant = net.constants.find(input);
      layer.desc.constant_inputs.push_back(
          constant == net.constants.end() ? nullptr : constant->second.data());
    }
    for (const auto& output : node.outputs) {
      layer.outputs.push_back(SlotOf(output));
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
  return planned;
}

LoadedNetwork::Liveness LoadedNetwork::FindLiveness(
    const std::vector<PlannedLayer>& planned) const {
  Liveness liveness{
      .last_reader = std::vector<std::size_t>(slot_names_.size(), Liveness::kNoReader),
      .network_output = std::vector<bool>(slot_names_.size(), false)};
  for (std::size_t i = 0; i < planned.size(); ++i) {
    for (int slot : planned[i].inputs) {
      if (slot >= 0)
        liveness.last_reader[slot] = i + 1;
    }
  }
  for (int slot : output_slots_)
    liveness.network_output[slot] = true;
  return liveness;
}

// A run is a maximal sequence of nodes that are consecutive in the network's node order (a
// topological order) and placed on the same backend instance; one of two or more layers is
// offered for compiling. Consecutive, not connected: two independent branches that the order
// interleaves on one backend are one run, since the boundary describes any such set exactly and a
// backend that wants chains only can decline; a chain that the order interrupts with another
// backend's layer is two runs. Because the run is consecutive, its one workload can run where its
// first layer would have: everything it reads is ready, and nothing before its last layer's
// successor reads what it writes.
std::vector<LoadedNetwork::Run> LoadedNetwork::PartitionRuns(
    const std::vector<PlannedLayer>& planned) {
  std::vector<Run> runs;
  for (std::size_t begin = 0; begin < planned.size();) {
    std::size_t end = begin + 1;
    while (end < planned.size() && planned[end].backend == planned[begin].backend)
      ++end;
    runs.push_back({begin, end});
    begin = end;
  }
  return runs;
}

Status LoadedNetwork::CreateLayerStep(std::size_t i, std::vector<PlannedLayer>& planned,
                                      const Backends& backends) {
  const Node& node = network_->nodes[i];
  PlannedLayer& layer = planned[i];
  for (std::size_t b = layer.backend; b < backends.size(); ++b) {
    const auto& backend = backends[b];
    Status supported = b == layer.backend ? Status::Ok() : backend->IsSupported(layer.desc);
    if (supported.ok()) {
      auto workload = backend->CreateWorkload(layer.desc, NetworkOptionsFor(backend->id()));
      if (workload.ok()) {
        steps_.push_back({.node = &node,
                          .inputs = std::move(layer.inputs),
                          .outputs = std::move(layer.outputs),
                          .workload = std::move(workload).value()});
        placement_.push_back({.node = node.name,
                              .op_type = node.op_type,
                              .backend_id = backend->id(),
                              .generation = backend->generation_number(),
                              .fallback_reason = layer.refusals,
                              .options = EffectiveOptionsOn(*backend)});
        return Status::Ok();
      }
      supported = workload.error();
    }
    layer.refusals += "\n  " + backend->id() + ": " + supported.message();
  }
  return Unimplemented("node '" + node.name + "' (" + node.op_type +
                       ") is supported by no backend in the preference list:" + layer.refusals);
}

LoadedNetwork::Boundary LoadedNetwork::BoundaryOf(const Run& run,
                                                  std::vector<PlannedLayer>& planned,
                                                  const Liveness& liveness) const {
  const Network& net = *network_;
  Boundary boundary;
  std::vector<bool> produced(slot_names_.size(), false);
  for (std::size_t i = run.begin; i < run.end; ++i) {
    PlannedLayer& layer = planned[i];
    const Node& node = net.nodes[i];
    for (int slot : layer.inputs) {
      if (slot < 0 || produced[slot] || constants_[slot] != nullptr ||
          std::find(boundary.input_slots.begin(), boundary.input_slots.end(), slot) !=
              boundary.input_slots.end()) {
        continue;
      }
      boundary.input_slots.push_back(slot);
    }
    for (int slot : layer.outputs) {
      produced[slot] = true;
      if (liveness.last_reader[slot] > run.end || liveness.network_output[slot])
        boundary.output_slots.push_back(slot);
    }
    boundary.subgraph.layer_inputs.push_back(node.inputs);
    boundary.subgraph.layer_outputs.push_back(node.outputs);
    boundary.subgraph.layers.push_back(std::move(layer.desc));  // moved back if declined
  }
  auto info_of = [&](int slot) {
    auto info = net.values.find(slot_names_[slot]);
    return info == net.values.end() ? TensorInfo{} : info->second;
  };
  for (int slot : boundary.input_slots) {
    boundary.subgraph.inputs.push_back(slot_names_[slot]);
    boundary.subgraph.input_infos.push_back(info_of(slot));
  }
  for (int slot : boundary.output_slots) {
    boundary.subgraph.outputs.push_back(slot_names_[slot]);
    boundary.subgraph.output_infos.push_back(info_of(slot));
  }
  return boundary;
}

Status LoadedNetwork::CompileRun(const Run& run, std::vector<PlannedLayer>& planned,
                                 const Liveness& liveness, const Backends& backends) {
  const Network& net = *network_;
  loader::BackendInstance& backend = *backends[planned[run.begin].backend];
  Boundary boundary = BoundaryOf(run, planned, liveness);

  // BackendInstance never calls a backend built against API 1.0: it declines for it, and the run
  // gets per-layer workloads as it always did.
  auto compiled = backend.CompileSubgraph(boundary.subgraph, NetworkOptionsFor(backend.id()));
  if (!compiled.ok()) {
    if (compiled.error().code() != StatusCode::kUnimplemented) {
      std::string layers;
      for (std::size_t i = run.begin; i < run.end; ++i) {
        layers +=
            (layers.empty() ? "'" : ", '") + net.nodes[i].name + "' (" + net.nodes[i].op_type + ")";
      }
      return compiled.error().WithContext("backend " + backend.id() +
                                          " failed to compile the run of layers " + layers + ": ");
    }
    for (std::size_t i = run.begin; i < run.end; ++i)
      planned[i].desc = boundary.subgraph.layers[i - run.begin];
    const bool kept = KeepDeclinedRun(run, boundary, planned, backends[planned[run.begin].backend]);
    for (std::size_t i = run.begin; i < run.end; ++i)
      BACKPLANE_RETURN_IF_ERROR(CreateLayerStep(i, planned, backends));
    if (kept) {
      // A layer its backend could not create after all went to the next backend: the run is no
      // longer one backend's, and compiling it at a shape would move that layer back.
      const DeclinedRun& run_kept = declined_runs_.back();
      const auto first = steps_.begin() + static_cast<std::ptrdiff_t>(run_kept.first_step);
      if (!std::all_of(first, steps_.end(), [&](const Step& step) {
            return &step.workload->instance() == run_kept.backend.get();
          })) {
        declined_runs_.pop_back();
        return Status::Ok();
      }
      for (std::size_t i = placement_.size() - run_kept.layers; i < placement_.size(); ++i)
        placement_[i].compiled_per_input_shape = true;
    }
    return Status::Ok();
  }
  loader::CompiledWorkload workload = std::move(compiled).value();
  for (std::size_t i = run.begin; i < run.end; ++i) {
    const Node& node = net.nodes[i];
    placement_.push_back({.node = node.name,
                          .op_type = node.op_type,
                          .backend_id = backend.id(),
                          .generation = backend.generation_number(),
                          .compiled = true,
                          .subgraph = net.nodes[run.begin].name,
                          .note = std::move(workload.layer_notes[i - run.begin]),
                          .fallback_reason = planned[i].refusals,
                          .options = EffectiveOptionsOn(backend)});
  }
  steps_.push_back({.node = &net.nodes[run.begin],
                    .layers = run.end - run.begin,
                    .inputs = std::move(boundary.input_slots),
                    .outputs = std::move(boundary.output_slots),
                    .workload = std::move(workload.workload)});
  return Status::Ok();
}

bool LoadedNetwork::KeepDeclinedRun(const Run& run, const Boundary& boundary,
                                    const std::vector<PlannedLayer>& planned,
                                    std::shared_ptr<loader::BackendInstance> backend) {
  if (!has_dynamic_shapes_ || shape_program_options_.capacity == 0)
    return false;
  const auto& layers = boundary.subgraph.layers;
  const bool dynamic = std::any_of(layers.begin(), layers.end(), [](const OperatorDesc& layer) {
    return std::any_of(layer.inputs.begin(), layer.inputs.end(), IsDynamic) ||
           std::any_of(layer.outputs.begin(), layer.outputs.end(), IsDynamic);
  });
  if (!dynamic)  // declined at its final shapes: it would decline again
    return false;
  DeclinedRun kept{.first_step = steps_.size(),
                   .layers = run.end - run.begin,
                   .backend = std::move(backend),
                   .boundary = boundary};
  for (std::size_t i = run.begin; i < run.end; ++i) {
    kept.layer_input_slots.push_back(planned[i].inputs);
    kept.layer_output_slots.push_back(planned[i].outputs);
  }
  declined_runs_.push_back(std::move(kept));
  return true;
}

Result<std::vector<TensorInfo>> LoadedNetwork::InferSlotShapes(
    std::span<const ConstTensorView> inputs) const {
  std::vector<TensorInfo> input_infos;
  for (const auto& input : inputs)
    input_infos.push_back(input.info);
  auto inferred = InferShapes(*network_, input_infos);
  if (!inferred.ok())
    return std::move(inferred).error();
  std::vector<TensorInfo> slot_shapes(slot_names_.size());
  for (std::size_t slot = 0; slot < slot_names_.size(); ++slot) {
    if (auto info = inferred->find(slot_names_[slot]); info != inferred->end())
      slot_shapes[slot] = info->second;
  }
  return slot_shapes;
}

std::shared_ptr<const LoadedNetwork::ShapeProgram> LoadedNetwork::BuildShapeProgram(
    const InputShapes& shapes, std::vector<TensorInfo> slot_shapes) const {
  ShapeProgramCounters& counters = *shape_program_options_.counters;
  counters.compiles.fetch_add(1, std::memory_order_relaxed);
  auto program = std::make_unique<ShapeProgram>();
  program->network = network_;
  program->slot_shapes = std::move(slot_shapes);
  program->compiled.reserve(declined_runs_.size());  // steps point into it
  auto concrete = [&](int slot, const TensorInfo& load_time) {
    return slot < 0 || program->slot_shapes[slot].type == DataType::kUndefined
               ? load_time
               : program->slot_shapes[slot];
  };
  std::size_t next_step = 0;
  for (const DeclinedRun& run : declined_runs_) {
    for (; next_step < run.first_step; ++next_step) {
      if (!IsFolded(steps_[next_step]))
        program->steps.push_back(&steps_[next_step]);
    }
    SubgraphDesc subgraph = run.boundary.subgraph;
    bool known = true;
    for (std::size_t l = 0; l < subgraph.layers.size(); ++l) {
      OperatorDesc& layer = subgraph.layers[l];
      for (std::size_t k = 0; k < layer.inputs.size(); ++k) {
        if (!subgraph.layer_inputs[l][k].empty())
          layer.inputs[k] = concrete(run.layer_input_slots[l][k], layer.inputs[k]);
        known = known && !IsDynamic(layer.inputs[k]);
      }
      for (std::size_t k = 0; k < layer.outputs.size(); ++k) {
        layer.outputs[k] = concrete(run.layer_output_slots[l][k], layer.outputs[k]);
        known = known && !IsDynamic(layer.outputs[k]);
      }
    }
    for (std::size_t i = 0; i < subgraph.inputs.size(); ++i)
      subgraph.input_infos[i] = concrete(run.boundary.input_slots[i], subgraph.input_infos[i]);
    for (std::size_t i = 0; i < subgraph.outputs.size(); ++i)
      subgraph.output_infos[i] = concrete(run.boundary.output_slots[i], subgraph.output_infos[i]);
    if (!known)  // shape inference left a dimension unknown: nothing new to offer
      continue;

    const Node& first = *steps_[run.first_step].node;
    auto compiled = run.backend->CompileSubgraph(subgraph, NetworkOptionsFor(run.backend->id()));
    if (!compiled.ok()) {
      if (compiled.error().code() == StatusCode::kUnimplemented)
        continue;
      // Not the request's fault, and the load-time workloads run this shape correctly: warn
      // (once: the program keeps the failure) and carry on without the compiled run.
      counters.compile_failures.fetch_add(1, std::memory_order_relaxed);
      const Node& last = (&first)[run.layers - 1];
      const std::string why = "backend " + run.backend->id() + " failed to compile the " +
                              std::to_string(run.layers) + " layers '" + first.name + "' to '" +
                              last.name + "' at input shapes " + DescribeInputShapes(shapes) +
                              ": " + compiled.error().message();
      RuntimeLog().warn("network {}: {}; they run layer by layer at these shapes", network_->name,
                        why);
      program->failures += (program->failures.empty() ? "" : "; ") + why;
      continue;
    }
    program->compiled.push_back({.node = &first,
                                 .layers = run.layers,
                                 .inputs = run.boundary.input_slots,
                                 .outputs = run.boundary.output_slots,
                                 .workload = std::move(compiled->workload)});
    program->steps.push_back(&program->compiled.back());
    program->compiled_layers += run.layers;
    next_step += run.layers;
  }
  for (; next_step < steps_.size(); ++next_step) {
    if (!IsFolded(steps_[next_step]))
      program->steps.push_back(&steps_[next_step]);
  }
  // Its workloads are backend code: destroyed on the reaper, whoever lets go last (an eviction
  // on a request thread, the cache's destruction with the binding).
  return loader::MakeReaped<const ShapeProgram>(std::move(program), shape_program_options_.reaper);
}

ShapeProgramStats LoadedNetwork::shape_program_stats() const {
  const ShapeProgramCounters& counters = *shape_program_options_.counters;
  ShapeProgramStats stats{
      .capacity = shape_programs_ == nullptr ? 0 : shape_programs_->capacity(),
      .hits = counters.hits.load(std::memory_order_relaxed),
      .misses = counters.misses.load(std::memory_order_relaxed),
      .compiles = counters.compiles.load(std::memory_order_relaxed),
      .compile_failures = counters.compile_failures.load(std::memory_order_relaxed),
      .evictions = counters.evictions.load(std::memory_order_relaxed)};
  if (shape_programs_ != nullptr) {
    for (const auto& [shapes, program] : shape_programs_->Entries()) {
      stats.programs.push_back({.input_shapes = shapes,
                                .compiled_layers = program->compiled_layers,
                                .failures = program->failures});
    }
  }
  return stats;
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

Result<std::vector<Tensor>> LoadedNetwork::Execute(std::span<const ConstTensorView> inputs,
                                                   const CallOptions* call_options) const {
  // Whoever executes the network holds it, and so its name, until this returns.
  const ScopedModelRun running(network_->name.c_str());
  BACKPLANE_RETURN_IF_ERROR(ValidateInputs(inputs));
  // Merged once per call, and only for a call that gives values: a plain request pays a test.
  MergedCallOptions merged_options;
  if (call_options != nullptr && !call_options->empty()) {
    BACKPLANE_RETURN_IF_ERROR(CheckCallOptions(*call_options));
    merged_options = MergeCallOptions(*call_options);
  }
  const MergedCallOptions* merged = merged_options.empty() ? nullptr : &merged_options;
  if (!has_dynamic_shapes_)
    return RunSteps(load_time_steps_, load_time_shapes_, inputs, merged);
  if (shape_programs_ == nullptr) {
    auto slot_shapes = InferSlotShapes(inputs);
    if (!slot_shapes.ok())
      return std::move(slot_shapes).error();
    return RunSteps(load_time_steps_, slot_shapes.value(), inputs, merged);
  }

  InputShapes shapes;
  shapes.reserve(inputs.size());
  for (const auto& input : inputs)
    shapes.push_back(input.info.shape);
  auto found = shape_programs_->Find(shapes);
  if (found.program != nullptr)
    return RunSteps(found.program->steps, found.program->slot_shapes, inputs, merged);
  // A miss. Inferred before claiming anything durable: a shape the network cannot take is this
  // request's error, and dropping the claim lets the next request of that shape try again.
  auto slot_shapes = InferSlotShapes(inputs);
  if (!slot_shapes.ok())
    return std::move(slot_shapes).error();
  if (!found.claim)  // being built: run the load-time steps, do not wait
    return RunSteps(load_time_steps_, slot_shapes.value(), inputs, merged);
  std::shared_ptr<ShapeProgramBuilder> builder = shape_program_options_.builder.lock();
  std::weak_ptr<const LoadedNetwork> self = weak_from_this();
  if (builder != nullptr && !self.expired()) {
    // Off the request path. Refused (queue full, shutting down), the build is destroyed inside
    // Submit and releases the claim; this request runs the load-time steps either way.
    auto pending = std::make_shared<PendingBuild>(std::move(self), std::move(found.claim),
                                                  std::move(shapes), slot_shapes.value());
    builder->Submit([pending = std::move(pending)] { pending->Build(); });
    return RunSteps(load_time_steps_, slot_shapes.value(), inputs, merged);
  }
  // No builder (a LoadedNetwork outside a Runtime, or the Runtime is shutting down): built here.
  auto program = BuildShapeProgram(shapes, std::move(slot_shapes).value());
  found.claim.Publish(program);
  return RunSteps(program->steps, program->slot_shapes, inputs, merged);
}

Result<std::vector<Tensor>> LoadedNetwork::RunSteps(std::span<const Step* const> steps,
                                                    const std::vector<TensorInfo>& slot_shapes,
                                                    std::span<const ConstTensorView> inputs,
                                                    const MergedCallOptions* merged) const {
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
  for (const Step* step_ptr : steps) {
    const Step& step = *step_ptr;
    step_inputs.clear();
    step_outputs.clear();
    for (int slot : step.inputs)
      step_inputs.push_back(slot < 0 ? ConstTensorView{} : views[slot]);
    for (int slot : step.outputs) {
      const TensorInfo& info = slot_shapes[slot];
      if (info.type == DataType::kUndefined) {
        return Internal("node '" + step.node->name + "': no shape inferred for output '" +
                        slot_names_[slot] + "'");
      }
      owned[slot] = Tensor(info);
      views[slot] = owned[slot].View();
      step_outputs.push_back(owned[slot].MutableView());
    }
    const BackendOptions* options = nullptr;
    if (merged != nullptr) {
      for (const auto& [backend_id, values] : *merged) {
        if (backend_id == step.workload->instance().id())
          options = &values;
      }
    }
    Status status = options != nullptr ? step.workload->Execute(step_inputs, step_outputs, *options)
                                       : step.workload->Execute(step_inputs, step_outputs);
    // WithContext keeps the reason: CRASHED is what makes the runtime run a request again after
    // its worker died (and tell on_crashed_request).
    if (!status.ok())
      return status.WithContext(Describe(step) + ": ");
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
