#include "backplane/isolation/isolated_backend.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "backplane/core/crossing_time.hpp"
#include "protocol.hpp"

namespace backplane::isolation {
namespace {

uint32_t Code(Call call) {
  return static_cast<uint32_t>(call);
}

// Destroys the worker's object behind a proxy; nothing to do once the worker is gone.
void DestroyRemote(BackendWorker& worker, Call call, uint64_t handle, std::string_view what) {
  if (!worker.dead()) {
    (void)worker.Invoke(
        Code(call), [&](WireWriter& out) { out.Put(handle); }, {}, what);
  }
}

// A workload compiled in the worker. Execute writes the inputs into a slot (the one copy in),
// and copies the outputs the worker wrote there into the host's buffers (the one copy out).
class IsolatedWorkload final : public IWorkload {
 public:
  IsolatedWorkload(std::shared_ptr<BackendWorker> worker, uint64_t handle)
      : worker_(std::move(worker)), handle_(handle) {}
  ~IsolatedWorkload() override {
    DestroyRemote(*worker_, Call::kDestroyWorkload, handle_, "destroying a workload");
  }

  Status Execute(std::span<const ConstTensorView> inputs,
                 std::span<const TensorView> outputs) override {
    return Run(inputs, outputs, nullptr);
  }

  // SDK 1.4. Called by the host only on a library that reported 1.4 or later (loader::Workload
  // gates on the version kHello gave), so the options always cross: the default would fall back
  // to Execute here and the call's values would be lost.
  Status ExecuteWithOptions(std::span<const ConstTensorView> inputs,
                            std::span<const TensorView> outputs,
                            const BackendOptions& options) override {
    return Run(inputs, outputs, &options);
  }

 private:
  // kExecute, or with `options` (not null) kExecuteWithOptions.
  Status Run(std::span<const ConstTensorView> inputs, std::span<const TensorView> outputs,
             const BackendOptions* options) {
    const auto start = std::chrono::steady_clock::now();
    std::chrono::nanoseconds in_backend{0};
    Status status = worker_->Invoke(
        Code(options != nullptr ? Call::kExecuteWithOptions : Call::kExecute),
        [&](WireWriter& out) {
          out.Put(handle_);
          out.Put(static_cast<uint64_t>(inputs.size()));
          for (const auto& input : inputs) {
            out.Put(input.info);
            out.AlignTo(kTensorAlignment);
            out.PutBytes(input.data, input.info.ByteSize());
          }
          out.Put(static_cast<uint64_t>(outputs.size()));
          for (const auto& output : outputs)
            out.Put(output.info);
          if (options != nullptr)
            out.Put(*options);
        },
        [&](WireReader& in) {
          in_backend = std::chrono::nanoseconds(in.Get<uint64_t>());
          for (const auto& output : outputs) {
            const auto offset = in.Get<uint64_t>();
            const std::size_t bytes = output.info.ByteSize();
            const std::byte* data = in.At(offset, bytes);
            if (!in.ok() || data == nullptr)
              return Internal("the worker placed an output outside its reply");
            if (bytes != 0)
              std::memcpy(output.data, data, bytes);
          }
          return Status::Ok();
        },
        options != nullptr ? "IWorkload::ExecuteWithOptions" : "IWorkload::Execute");
    ThreadCrossingTime() += std::max(std::chrono::nanoseconds(0),
                                     std::chrono::steady_clock::now() - start - in_backend);
    return status;
  }

  const std::shared_ptr<BackendWorker> worker_;
  const uint64_t handle_;
};

class IsolatedContext final : public IBackendContext {
 public:
  IsolatedContext(std::shared_ptr<BackendWorker> worker, uint64_t handle)
      : worker_(std::move(worker)), handle_(handle) {}
  ~IsolatedContext() override {
    DestroyRemote(*worker_, Call::kDestroyContext, handle_, "destroying a backend context");
  }

  Status BeforeLoadNetwork(NetworkId id) override { return Hook(0, id, "BeforeLoadNetwork"); }
  Status AfterLoadNetwork(NetworkId id) override { return Hook(1, id, "AfterLoadNetwork"); }
  Status BeforeUnloadNetwork(NetworkId id) override { return Hook(2, id, "BeforeUnloadNetwork"); }
  Status AfterUnloadNetwork(NetworkId id) override { return Hook(3, id, "AfterUnloadNetwork"); }

 private:
  Status Hook(uint32_t hook, NetworkId id, std::string_view what) {
    // A dead backend has nothing to refuse an unload for (hooks 2 and 3): its networks leave.
    if (hook >= 2 && worker_->dead())
      return Status::Ok();
    return worker_->Invoke(
        Code(Call::kContextHook),
        [&](WireWriter& out) {
          out.Put(handle_);
          out.Put(hook);
          out.Put(id);
        },
        {}, what);
  }

  const std::shared_ptr<BackendWorker> worker_;
  const uint64_t handle_;
};

class IsolatedBackend final : public IBackend {
 public:
  IsolatedBackend(std::shared_ptr<BackendWorker> worker, std::string id, uint64_t handle)
      : worker_(std::move(worker)), id_(std::move(id)), handle_(handle) {}
  ~IsolatedBackend() override {
    DestroyRemote(*worker_, Call::kDestroyBackend, handle_, "destroying the backend instance");
  }

  std::string_view GetId() const override { return id_; }

  Status IsSupported(const OperatorDesc& op) const override {
    return worker_->Invoke(
        Code(Call::kIsSupported),
        [&](WireWriter& out) {
          out.Put(handle_);
          out.Put(op);
        },
        {}, "IsSupported");
  }

  Result<std::unique_ptr<IWorkload>> CreateWorkload(const OperatorDesc& op) override {
    return Prepare(op, nullptr);
  }

  Result<CompiledSubgraph> CompileSubgraph(const SubgraphDesc& subgraph) override {
    return Compile(subgraph, nullptr);
  }

  // SDK 1.3. The host calls these only on a library that reported 1.3 or later (BackendInstance
  // gates on the version kHello gave), so the options always cross: the defaults would fall
  // back to CreateWorkload and CompileSubgraph here, and the network's values would be lost.
  Result<std::unique_ptr<IWorkload>> CreateWorkloadWithOptions(
      const OperatorDesc& op, const BackendOptions& options) override {
    return Prepare(op, &options);
  }

  Result<CompiledSubgraph> CompileSubgraphWithOptions(const SubgraphDesc& subgraph,
                                                      const BackendOptions& options) override {
    return Compile(subgraph, &options);
  }

  // The backend's own check (ranges, not only names and types), not the default's
  // ValidateOptions against DescribeOptions here.
  Status CheckOptions(const BackendOptions& options) const override {
    return worker_->Invoke(
        Code(Call::kCheckOptions),
        [&](WireWriter& out) {
          out.Put(handle_);
          out.Put(options);
        },
        {}, "CheckOptions");
  }

  std::unique_ptr<IBackendContext> CreateBackendContext() override {
    uint64_t context = 0;
    const Status created = worker_->Invoke(
        Code(Call::kCreateContext), [&](WireWriter& out) { out.Put(handle_); },
        [&](WireReader& in) {
          context = in.Get<uint64_t>();
          return Status::Ok();
        },
        "CreateBackendContext");
    // IBackend's signature has no error: a worker that cannot answer gives no context (and its
    // next call reports why).
    if (!created.ok() || context == 0)
      return nullptr;
    return std::make_unique<IsolatedContext>(worker_, context);
  }

  std::vector<OptionDescriptor> DescribeOptions() const override {
    std::vector<OptionDescriptor> descriptors;
    (void)worker_->Invoke(
        Code(Call::kDescribeOptions), [&](WireWriter& out) { out.Put(handle_); },
        [&](WireReader& in) {
          descriptors = in.GetDescriptors();
          return Status::Ok();
        },
        "DescribeOptions");
    return descriptors;
  }

  Status UpdateOptions(const BackendOptions& changes) override {
    return worker_->Invoke(
        Code(Call::kUpdateOptions),
        [&](WireWriter& out) {
          out.Put(handle_);
          out.Put(changes);
        },
        {}, "UpdateOptions");
  }

  // SDK 1.4, asked only of a library that reported 1.4 or later (BackendInstance gates).
  std::vector<std::string> DescribeCallOptions() const override {
    std::vector<std::string> names;
    (void)worker_->Invoke(
        Code(Call::kDescribeCallOptions), [&](WireWriter& out) { out.Put(handle_); },
        [&](WireReader& in) {
          names = in.GetStrings();
          return Status::Ok();
        },
        "DescribeCallOptions");
    return names;
  }

  Result<OptionValue> GetOption(std::string_view key) const override {
    OptionValue value;
    BACKPLANE_RETURN_IF_ERROR(worker_->Invoke(
        Code(Call::kGetOption),
        [&](WireWriter& out) {
          out.Put(handle_);
          out.PutString(key);
        },
        [&](WireReader& in) {
          value = in.GetOptionValue();
          return Status::Ok();
        },
        "GetOption"));
    return value;
  }

  // The worker's instance shuts down when this proxy is destroyed (kDestroyBackend runs Shutdown
  // and the destructor there): nothing of the backend's runs in the host.
  void Shutdown() override {}

 private:
  // CreateWorkload, or with `options` (not null) CreateWorkloadWithOptions.
  Result<std::unique_ptr<IWorkload>> Prepare(const OperatorDesc& op,
                                             const BackendOptions* options) {
    uint64_t workload = 0;
    BACKPLANE_RETURN_IF_ERROR(worker_->Invoke(
        Code(options != nullptr ? Call::kCreateWorkloadWithOptions : Call::kCreateWorkload),
        [&](WireWriter& out) {
          out.Put(handle_);
          out.Put(op);
          if (options != nullptr)
            out.Put(*options);
        },
        [&](WireReader& in) {
          workload = in.Get<uint64_t>();
          return Status::Ok();
        },
        options != nullptr ? "CreateWorkloadWithOptions" : "CreateWorkload"));
    return std::unique_ptr<IWorkload>(std::make_unique<IsolatedWorkload>(worker_, workload));
  }

  // CompileSubgraph, or with `options` (not null) CompileSubgraphWithOptions.
  Result<CompiledSubgraph> Compile(const SubgraphDesc& subgraph, const BackendOptions* options) {
    uint64_t workload = 0;
    CompiledSubgraph compiled;
    BACKPLANE_RETURN_IF_ERROR(worker_->Invoke(
        Code(options != nullptr ? Call::kCompileSubgraphWithOptions : Call::kCompileSubgraph),
        [&](WireWriter& out) {
          out.Put(handle_);
          out.Put(subgraph);
          if (options != nullptr)
            out.Put(*options);
        },
        [&](WireReader& in) {
          workload = in.Get<uint64_t>();
          compiled.layer_notes = in.GetStrings();
          return Status::Ok();
        },
        options != nullptr ? "CompileSubgraphWithOptions" : "CompileSubgraph"));
    compiled.workload = std::make_unique<IsolatedWorkload>(worker_, workload);
    return compiled;
  }

  const std::shared_ptr<BackendWorker> worker_;
  const std::string id_;
  const uint64_t handle_;
};

}  // namespace

Result<WorkerHello> Hello(BackendWorker& worker) {
  WorkerHello hello;
  BACKPLANE_RETURN_IF_ERROR(worker.Invoke(
      Code(Call::kHello), {},
      [&](WireReader& in) {
        hello.backend_id = in.GetString();
        hello.api_version.major = in.Get<uint32_t>();
        hello.api_version.minor = in.Get<uint32_t>();
        hello.release = in.GetString();
        return Status::Ok();
      },
      "loading the library"));
  return hello;
}

Result<std::unique_ptr<IBackend>> CreateIsolatedBackend(std::shared_ptr<BackendWorker> worker,
                                                        const WorkerHello& hello) {
  uint64_t handle = 0;
  BACKPLANE_RETURN_IF_ERROR(worker->Invoke(
      Code(Call::kCreateBackend), {},
      [&](WireReader& in) {
        handle = in.Get<uint64_t>();
        return Status::Ok();
      },
      "BackendFactory"));
  return std::unique_ptr<IBackend>(
      std::make_unique<IsolatedBackend>(std::move(worker), hello.backend_id, handle));
}

}  // namespace backplane::isolation
