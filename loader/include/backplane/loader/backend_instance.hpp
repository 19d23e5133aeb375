// A backend instance as the host holds it: the backend object with the lease that keeps its code
// mapped, and every call into backend code guarded so that no exception crosses the boundary.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/backend_call.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/loader/generation.hpp"
#include "backplane/loader/reaper.hpp"
#include "backplane/sdk/backend.hpp"

namespace backplane::loader {

class BackendInstance;

// A workload with the instance it came from: the workload is destroyed first, then the instance
// (on the reaper), then, with the last lease, the library. Thread-safe as IWorkload.
class Workload {
 public:
  Workload(std::shared_ptr<BackendInstance> instance, std::unique_ptr<IWorkload> workload);
  ~Workload();

  Status Execute(std::span<const ConstTensorView> inputs, std::span<const TensorView> outputs);
  // API 1.4, gated: one call with per-call values (IWorkload::ExecuteWithOptions; `options`: every
  // declared option at this call's value). On a backend built against 1.3 or older it calls
  // Execute, whose vtable has no other slot; the runtime refuses per-call values for such a
  // backend before the request runs, so this never drops a value it was given.
  Status Execute(std::span<const ConstTensorView> inputs, std::span<const TensorView> outputs,
                 const BackendOptions& options);
  const BackendInstance& instance() const { return *instance_; }

 private:
  // Declaration order is destruction order reversed: instance_ must outlive workload_.
  std::shared_ptr<BackendInstance> instance_;
  std::unique_ptr<IWorkload> workload_;
};

// SDK 1.1: a compiled run of layers, as the host holds it.
struct CompiledWorkload {
  std::unique_ptr<Workload> workload;
  std::vector<std::string> layer_notes;  // one per layer of the run
};

// Thread-safe as IBackend. Created by Generation factories (dynamic) or static factories; always
// held through the shared_ptr that MakeBackendInstance returns, whose last release destroys the
// instance on the reaper thread: Shutdown(), then the backend's destructor, then the lease.
class BackendInstance : public std::enable_shared_from_this<BackendInstance> {
 public:
  // `lease` is null for a static (linked-in) backend.
  BackendInstance(std::string id, std::unique_ptr<IBackend> backend, GenerationLease lease);
  ~BackendInstance();

  const std::string& id() const { return id_; }
  // The generation this instance runs on; null for a static backend.
  const GenerationLease& generation() const { return lease_; }
  uint64_t generation_number() const { return lease_ ? lease_->info().number : 0; }
  // The backend API the instance's code was built against: its generation's, or the host's own
  // for a static backend (compiled with the host's headers).
  BackendApiVersion api_version() const {
    return lease_ ? lease_->info().api_version : kBackendApiVersion;
  }
  // Whether the instance's code has what API `since` added. Trap: the host must ask this before
  // every call to an IBackend method added after x.0 (and only call those through a wrapper here
  // that asks it): a backend built against an older minor loads, but its vtable has no slot for
  // the newer method, and the call would jump into whatever lies past its end.
  bool Implements(BackendApiVersion since) const {
    const BackendApiVersion own = api_version();
    return own.major == since.major && own.minor >= since.minor;
  }

  Status IsSupported(const OperatorDesc& op) const;
  // `network_options`: the values one network sets over this instance's (SDK 1.3 per-network
  // options). A backend built against 1.3 or later prepares the workload with every declared
  // option at its effective value (EffectiveOptions); an older one only without any (checked by
  // CheckNetworkOptions first: here it is kFailedPrecondition).
  Result<std::unique_ptr<Workload>> CreateWorkload(const OperatorDesc& op,
                                                   const BackendOptions& network_options = {});
  // API 1.1, gated: on a backend built against 1.0 it returns kUnimplemented without calling the
  // backend, exactly as a 1.1 backend that declines.
  Result<CompiledWorkload> CompileSubgraph(const SubgraphDesc& subgraph,
                                           const BackendOptions& network_options = {});
  Result<std::unique_ptr<IBackendContext>> CreateBackendContext();
  std::vector<OptionDescriptor> DescribeOptions() const;
  // API 1.4, gated: the declared options a call may give (IBackend::DescribeCallOptions); none on
  // a backend built against 1.3 or older.
  std::vector<std::string> DescribeCallOptions() const;
  // On success the instance's values (what EffectiveOptions starts from) take the changes.
  Status UpdateOptions(const BackendOptions& changes);
  Result<OptionValue> GetOption(std::string_view key) const;

  // Whether a network may run with `network_options` on this instance: a backend built against
  // API 1.3 or later that accepts them (IBackend::CheckOptions: names, types, ranges), thread
  // counts within the CPUs this process may use. kInvalidArgument naming the option, or
  // kFailedPrecondition for a backend older than 1.3 (it takes options per runtime only).
  Status CheckNetworkOptions(const BackendOptions& network_options) const;
  // Every option the backend declares at the value a workload of a network with
  // `network_options` is prepared with: the network's, else what UpdateOptions applied to this
  // instance, else the declared default.
  BackendOptions EffectiveOptions(const BackendOptions& network_options = {}) const;

  // Direct access for the host's guarded wrappers (e.g. contexts). Never store it.
  IBackend& backend() { return *backend_; }

  // A call into this instance's code as a crash report names it (`what`: a string literal, e.g.
  // "IWorkload::Execute"); its strings are the generation's and this instance's, alive while
  // the caller holds the instance.
  BackendCallSite CallSite(const char* what) const {
    if (lease_ == nullptr)
      return {.backend_id = id_.c_str(), .call = what};
    return lease_->CallSite(what);
  }

  // Runs `call` (code of this instance's backend, the SDK method `what`) where its generation's
  // calls run: inside the generation's own TBB arena when it submits TBB tasks itself
  // (Generation::RunConfined), else directly; with the thread's backend call record saying so
  // while it runs (backend_call_record.hpp). Every call into the backend's code goes through
  // this.
  template <typename Call>
  auto Confined(const char* what, Call&& call) const -> decltype(call()) {
    const ScopedBackendCall running(CallSite(what));
    if (lease_ == nullptr)
      return call();
    return lease_->RunConfined(std::forward<Call>(call));
  }

 private:
  const std::string id_;
  // Declaration order is destruction order reversed: lease_ must outlive backend_.
  const GenerationLease lease_;
  std::unique_ptr<IBackend> backend_;
  // The instance-wide values: each declared option's default, then what UpdateOptions applied.
  // Kept by the host, so that the set a workload is prepared with does not depend on a backend's
  // GetOption.
  mutable Mutex options_mutex_;
  BackendOptions options_ BACKPLANE_GUARDED_BY(options_mutex_);
};

std::shared_ptr<BackendInstance> MakeBackendInstance(std::string id,
                                                     std::unique_ptr<IBackend> backend,
                                                     GenerationLease lease,
                                                     const std::shared_ptr<Reaper>& reaper);

}  // namespace backplane::loader
