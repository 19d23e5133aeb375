#include "backplane/loader/backend_instance.hpp"

#include "backplane/loader/host_services.hpp"
#include "backplane/sdk/thread_limits.hpp"
#include "loader_log.hpp"

namespace backplane::loader {

Workload::Workload(std::shared_ptr<BackendInstance> instance, std::unique_ptr<IWorkload> workload)
    : instance_(std::move(instance)), workload_(std::move(workload)) {}

Workload::~Workload() {
  GuardBackendCall(
      [&] { instance_->Confined("IWorkload::~IWorkload", [&] { workload_.reset(); }); },
      [&](std::string_view what) {
        Log().error("backend {} generation {} threw from a workload's destructor: {}",
                    instance_->id(), instance_->generation_number(), what);
      });
}

Status Workload::Execute(std::span<const ConstTensorView> inputs,
                         std::span<const TensorView> outputs) {
  return GuardBackendCall(instance_->id(), "IWorkload::Execute", [&] {
    return instance_->Confined("IWorkload::Execute",
                               [&] { return workload_->Execute(inputs, outputs); });
  });
}

Status Workload::Execute(std::span<const ConstTensorView> inputs,
                         std::span<const TensorView> outputs, const BackendOptions& options) {
  if (!instance_->Implements({1, 4}))
    return Execute(inputs, outputs);
  return GuardBackendCall(instance_->id(), "IWorkload::ExecuteWithOptions", [&] {
    return instance_->Confined("IWorkload::ExecuteWithOptions", [&] {
      return workload_->ExecuteWithOptions(inputs, outputs, options);
    });
  });
}

BackendInstance::BackendInstance(std::string id, std::unique_ptr<IBackend> backend,
                                 GenerationLease lease)
    : id_(std::move(id)), lease_(std::move(lease)), backend_(std::move(backend)) {
  // API 1.2, gated like every method added after 1.0 (a 1.1 backend's vtable has no slot for it):
  // the host's services for parallel work, before any other call but GetId.
  if (Implements({1, 2})) {
    GuardBackendCall(
        [&] { Confined("IBackend::SetHost", [&] { backend_->SetHost(&HostServices()); }); },
        [&](std::string_view what) {
          Log().error("backend {} generation {} threw from SetHost: {}", id_, generation_number(),
                      what);
        });
  }
}

BackendInstance::~BackendInstance() {
  // Rule 5: the backend finishes all of its own work before its code can be unmapped.
  GuardBackendCall([&] { Confined("IBackend::Shutdown", [&] { backend_->Shutdown(); }); },
                   [&](std::string_view what) {
                     Log().error("backend {} generation {} threw from Shutdown: {}", id_,
                                 generation_number(), what);
                   });
  GuardBackendCall([&] { Confined("IBackend::~IBackend", [&] { backend_.reset(); }); },
                   [&](std::string_view what) {
                     Log().error("backend {} generation {} threw from its destructor: {}", id_,
                                 generation_number(), what);
                   });
}

Status BackendInstance::IsSupported(const OperatorDesc& op) const {
  return GuardBackendCall(id_, "IsSupported", [&] {
    return Confined("IBackend::IsSupported", [&] { return backend_->IsSupported(op); });
  });
}

namespace {

std::string ApiText(BackendApiVersion version) {
  return std::to_string(version.major) + "." + std::to_string(version.minor);
}

}  // namespace

Result<std::unique_ptr<Workload>> BackendInstance::CreateWorkload(
    const OperatorDesc& op, const BackendOptions& network_options) {
  Result<std::unique_ptr<IWorkload>> created = std::unique_ptr<IWorkload>();
  if (Implements({1, 3})) {
    const BackendOptions options = EffectiveOptions(network_options);
    created = GuardBackendCall(id_, "CreateWorkloadWithOptions", [&] {
      return Confined("IBackend::CreateWorkloadWithOptions",
                      [&] { return backend_->CreateWorkloadWithOptions(op, options); });
    });
  } else {
    BACKPLANE_RETURN_IF_ERROR(CheckNetworkOptions(network_options));
    created = GuardBackendCall(id_, "CreateWorkload", [&] {
      return Confined("IBackend::CreateWorkload", [&] { return backend_->CreateWorkload(op); });
    });
  }
  if (!created.ok())
    return std::move(created).error();
  if (created.value() == nullptr) {
    return Internal("backend " + id_ + " returned a null workload for " + op.op_type + " node '" +
                    op.name + "'");
  }
  return std::make_unique<Workload>(shared_from_this(), std::move(created).value());
}

Result<CompiledWorkload> BackendInstance::CompileSubgraph(const SubgraphDesc& subgraph,
                                                          const BackendOptions& network_options) {
  if (!Implements({1, 1})) {
    return Unimplemented("backend " + id_ + " was built against API " + ApiText(api_version()) +
                         ", which has no CompileSubgraph");
  }
  Result<CompiledSubgraph> compiled = CompiledSubgraph{};
  if (Implements({1, 3})) {
    const BackendOptions options = EffectiveOptions(network_options);
    compiled =
        GuardBackendCall(id_, "CompileSubgraphWithOptions", [&]() -> Result<CompiledSubgraph> {
          return Confined("IBackend::CompileSubgraphWithOptions",
                          [&] { return backend_->CompileSubgraphWithOptions(subgraph, options); });
        });
  } else {
    BACKPLANE_RETURN_IF_ERROR(CheckNetworkOptions(network_options));
    compiled = GuardBackendCall(id_, "CompileSubgraph", [&]() -> Result<CompiledSubgraph> {
      return Confined("IBackend::CompileSubgraph",
                      [&] { return backend_->CompileSubgraph(subgraph); });
    });
  }
  if (!compiled.ok())
    return std::move(compiled).error();
  CompiledSubgraph result = std::move(compiled).value();
  if (result.workload == nullptr) {
    return Internal("backend " + id_ + " returned a null workload for a subgraph of " +
                    std::to_string(subgraph.layers.size()) + " layers");
  }
  result.layer_notes.resize(subgraph.layers.size());
  return CompiledWorkload{
      std::make_unique<Workload>(shared_from_this(), std::move(result.workload)),
      std::move(result.layer_notes)};
}

Result<std::unique_ptr<IBackendContext>> BackendInstance::CreateBackendContext() {
  return GuardBackendCall(id_, "CreateBackendContext",
                          [&]() -> Result<std::unique_ptr<IBackendContext>> {
                            return Confined("IBackend::CreateBackendContext",
                                            [&] { return backend_->CreateBackendContext(); });
                          });
}

std::vector<OptionDescriptor> BackendInstance::DescribeOptions() const {
  auto described =
      GuardBackendCall(id_, "DescribeOptions", [&]() -> Result<std::vector<OptionDescriptor>> {
        return Confined("IBackend::DescribeOptions", [&] { return backend_->DescribeOptions(); });
      });
  if (!described.ok()) {
    Log().error("{}", described.error().message());
    return {};
  }
  return std::move(described).value();
}

std::vector<std::string> BackendInstance::DescribeCallOptions() const {
  if (!Implements({1, 4}))
    return {};
  auto described =
      GuardBackendCall(id_, "DescribeCallOptions", [&]() -> Result<std::vector<std::string>> {
        return Confined("IBackend::DescribeCallOptions",
                        [&] { return backend_->DescribeCallOptions(); });
      });
  if (!described.ok()) {
    Log().error("{}", described.error().message());
    return {};
  }
  return std::move(described).value();
}

Status BackendInstance::UpdateOptions(const BackendOptions& changes) {
  Status updated = GuardBackendCall(id_, "UpdateOptions", [&] {
    return Confined("IBackend::UpdateOptions", [&] { return backend_->UpdateOptions(changes); });
  });
  if (updated.ok()) {
    MutexLock lock(options_mutex_);
    for (const auto& [key, value] : changes)
      options_.insert_or_assign(key, value);
  }
  return updated;
}

Status BackendInstance::CheckNetworkOptions(const BackendOptions& network_options) const {
  if (network_options.empty())
    return Status::Ok();
  if (!Implements({1, 3})) {
    return FailedPrecondition("backend " + id_ + " was built against API " +
                              ApiText(api_version()) +
                              ", which takes options per runtime only (per-network options need "
                              "1.3)");
  }
  BACKPLANE_RETURN_IF_ERROR(CheckThreadCounts(network_options, DescribeOptions(), id_));
  return GuardBackendCall(id_, "CheckOptions", [&] {
    return Confined("IBackend::CheckOptions",
                    [&] { return backend_->CheckOptions(network_options); });
  });
}

BackendOptions BackendInstance::EffectiveOptions(const BackendOptions& network_options) const {
  BackendOptions effective;
  for (auto& descriptor : DescribeOptions())
    effective.emplace(std::move(descriptor.name), std::move(descriptor.default_value));
  {
    MutexLock lock(options_mutex_);
    for (const auto& [key, value] : options_)
      effective.insert_or_assign(key, value);
  }
  for (const auto& [key, value] : network_options)
    effective.insert_or_assign(key, value);
  return effective;
}

Result<OptionValue> BackendInstance::GetOption(std::string_view key) const {
  return GuardBackendCall(id_, "GetOption", [&] {
    return Confined("IBackend::GetOption", [&] { return backend_->GetOption(key); });
  });
}

std::shared_ptr<BackendInstance> MakeBackendInstance(std::string id,
                                                     std::unique_ptr<IBackend> backend,
                                                     GenerationLease lease,
                                                     const std::shared_ptr<Reaper>& reaper) {
  return MakeReaped(
      std::make_unique<BackendInstance>(std::move(id), std::move(backend), std::move(lease)),
      reaper);
}

}  // namespace backplane::loader
