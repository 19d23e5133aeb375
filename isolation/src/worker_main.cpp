// backplane-backend-worker: runs one backend generation for a host (backend_worker.hpp).
//
// Started by the host with the call slots on descriptor 3 and the generation's sealed copy on 4,
// nothing else. It maps the library (the host already checked its ELF, trust and signature on
// the same sealed bytes), then serves each slot on a thread of its own until the host kills it.
// It never unloads the library: a worker ends with its generation, and the kernel takes back
// everything the backend held, leaked or not.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backplane/core/backend_call.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/isolation/channel.hpp"
#include "backplane/isolation/wire.hpp"
#include "backplane/loader/host_services.hpp"
#include "backplane/sdk/backend.hpp"
#include "protocol.hpp"

namespace backplane::isolation {
namespace {

// The backend library, as dlopen gave it (or why it did not).
struct Library {
  Status load_error;
  std::string id;
  BackendApiVersion api_version;
  std::string release;
  BackendFactoryFn factory = nullptr;
  GetBackendFactoryErrorFn factory_error = nullptr;
};

Library LoadLibrary() {
  Library library;
  const std::string path = "/proc/self/fd/" + std::to_string(kImageFd);
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = ::dlerror();
    library.load_error =
        Status(LoadReason::kDlopenFailed,
               "dlopen in the worker: " + std::string(error != nullptr ? error : "failed"));
    return library;
  }
  auto get_id = reinterpret_cast<GetBackendIdFn>(::dlsym(handle, "GetBackendId"));
  auto get_version = reinterpret_cast<GetVersionFn>(::dlsym(handle, "GetVersion"));
  library.factory = reinterpret_cast<BackendFactoryFn>(::dlsym(handle, "BackendFactory"));
  auto get_release = reinterpret_cast<GetBackendReleaseFn>(::dlsym(handle, "GetBackendRelease"));
  library.factory_error =
      reinterpret_cast<GetBackendFactoryErrorFn>(::dlsym(handle, "GetBackendFactoryError"));
  if (get_id == nullptr || get_version == nullptr || library.factory == nullptr) {
    library.load_error = Status(LoadReason::kMissingEntryPoint,
                                "GetBackendId, GetVersion or BackendFactory is not exported");
    return library;
  }
  const char* id = get_id();
  library.id = id != nullptr ? id : "";
  get_version(&library.api_version.major, &library.api_version.minor);
  if (get_release != nullptr && get_release() != nullptr)
    library.release = get_release();
  return library;
}

struct BackendEntry {
  std::unique_ptr<IBackend> backend;
  ~BackendEntry() {
    if (backend != nullptr)
      GuardBackendCall([&] { backend->Shutdown(); }, [](std::string_view) {});
  }
};

struct WorkloadEntry {
  ConstantStore constants;  // what the workload's description points into
  std::shared_ptr<BackendEntry> backend;
  std::unique_ptr<IWorkload> workload;  // last: destroyed first
};

struct ContextEntry {
  std::shared_ptr<BackendEntry> backend;
  std::unique_ptr<IBackendContext> context;
};

// The worker's objects of one kind by the handles the host knows them by. Thread-safe.
template <typename T>
class HandleTable {
 public:
  explicit HandleTable(std::atomic<uint64_t>& next_handle) : next_handle_(next_handle) {}

  std::shared_ptr<T> Find(uint64_t handle) const BACKPLANE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    auto it = objects_.find(handle);
    return it == objects_.end() ? nullptr : it->second;
  }
  uint64_t Keep(std::shared_ptr<T> object) BACKPLANE_EXCLUDES(mutex_) {
    const uint64_t handle = ++next_handle_;
    MutexLock lock(mutex_);
    objects_.emplace(handle, std::move(object));
    return handle;
  }
  void Drop(uint64_t handle) BACKPLANE_EXCLUDES(mutex_) {
    std::shared_ptr<T> dropped;  // destroyed after the lock is released: it runs backend code
    MutexLock lock(mutex_);
    if (auto it = objects_.find(handle); it != objects_.end()) {
      dropped = std::move(it->second);
      objects_.erase(it);
    }
  }

 private:
  std::atomic<uint64_t>& next_handle_;
  mutable Mutex mutex_;
  std::map<uint64_t, std::shared_ptr<T>> objects_ BACKPLANE_GUARDED_BY(mutex_);
};

class Worker {
 public:
  Worker(const SharedRegion& region, Library library)
      : region_(region), library_(std::move(library)) {}

  void Serve(uint32_t slot) {
    SlotHeader& header = region_.header(slot);
    const auto payload = region_.payload(slot);
    for (;;) {
      WaitForState(
          header, SlotState::kRequest, header.worker_sleeping, [] { return false; },
          std::chrono::milliseconds(1000));
      const std::size_t request_bytes = std::min<std::size_t>(header.message_bytes, payload.size());
      WireReader in(payload.first(request_bytes));
      header.message_bytes = Handle(in, payload, request_bytes);
      SetState(header, SlotState::kReply, header.host_sleeping);
    }
  }

 private:
  // Answers one request in place; returns the reply's size.
  std::size_t Handle(WireReader& in, std::span<std::byte> payload, std::size_t request_bytes) {
    const auto call = static_cast<Call>(in.Get<uint32_t>());
    if (call == Call::kExecute || call == Call::kExecuteWithOptions)
      return Execute(in, payload, request_bytes, call == Call::kExecuteWithOptions);
    // Everything is read before the reply overwrites the request.
    std::vector<std::byte> reply(payload.size() < 65536 ? payload.size() : 65536);
    WireWriter out(reply);
    Status status = library_.load_error;
    if (status.ok())
      status = Dispatch(call, in, out);
    if (status.ok() && !in.ok())
      status = in.Error("a request");
    WireWriter final_out(payload);
    final_out.Put(status);
    if (status.ok())
      final_out.PutBytes(reply.data(), out.size());
    return final_out.size();
  }

  Status Dispatch(Call call, WireReader& in, WireWriter& out) {
    const std::string& id = library_.id;
    switch (call) {
      case Call::kHello:
        out.PutString(library_.id);
        out.Put(library_.api_version.major);
        out.Put(library_.api_version.minor);
        out.PutString(library_.release);
        return Status::Ok();
      case Call::kCreateBackend: {
        auto entry = std::make_shared<BackendEntry>();
        IBackend* created = GuardBackendCall([&] { return library_.factory(); },
                                             [](std::string_view) -> IBackend* { return nullptr; });
        if (created == nullptr) {
          const char* why = library_.factory_error != nullptr ? library_.factory_error() : nullptr;
          return Status(LoadReason::kFactoryFailed,
                        "BackendFactory failed" +
                            (why != nullptr && *why != '\0' ? ": " + std::string(why) : ""));
        }
        entry->backend.reset(created);
        if (IsApiCompatible(library_.api_version, kBackendApiVersion) &&
            library_.api_version.minor >= 2) {
          entry->backend->SetHost(&loader::HostServices());
        }
        out.Put(backends_.Keep(std::move(entry)));
        return Status::Ok();
      }
      case Call::kDestroyBackend:
        backends_.Drop(in.Get<uint64_t>());
        return Status::Ok();
      case Call::kIsSupported: {
        auto backend = backends_.Find(in.Get<uint64_t>());
        ConstantStore constants;
        const OperatorDesc op = in.GetOperator(constants);
        if (backend == nullptr || !in.ok())
          return in.ok() ? NotFound("no such backend instance") : in.Error("IsSupported");
        return GuardBackendCall(id, "IsSupported",
                                [&] { return backend->backend->IsSupported(op); });
      }
      case Call::kCreateWorkload:
        return CreateWorkload(in, out, /*with_options=*/false);
      case Call::kCreateWorkloadWithOptions:
        return CreateWorkload(in, out, /*with_options=*/true);
      case Call::kCompileSubgraph:
        return CompileSubgraph(in, out, /*with_options=*/false);
      case Call::kCompileSubgraphWithOptions:
        return CompileSubgraph(in, out, /*with_options=*/true);
      case Call::kDestroyWorkload:
        workloads_.Drop(in.Get<uint64_t>());
        return Status::Ok();
      case Call::kCreateContext: {
        auto backend = backends_.Find(in.Get<uint64_t>());
        if (backend == nullptr)
          return NotFound("no such backend instance");
        auto entry = std::make_shared<ContextEntry>();
        entry->backend = backend;
        entry->context = GuardBackendCall(
            [&] { return backend->backend->CreateBackendContext(); },
            [](std::string_view) -> std::unique_ptr<IBackendContext> { return nullptr; });
        out.Put(entry->context == nullptr ? uint64_t{0} : contexts_.Keep(std::move(entry)));
        return Status::Ok();
      }
      case Call::kContextHook: {
        auto context = contexts_.Find(in.Get<uint64_t>());
        const auto hook = in.Get<uint32_t>();
        const auto network = in.Get<NetworkId>();
        if (context == nullptr)
          return NotFound("no such backend context");
        return GuardBackendCall(id, "a context hook", [&] {
          IBackendContext& hooks = *context->context;
          switch (hook) {
            case 0:
              return hooks.BeforeLoadNetwork(network);
            case 1:
              return hooks.AfterLoadNetwork(network);
            case 2:
              return hooks.BeforeUnloadNetwork(network);
            default:
              return hooks.AfterUnloadNetwork(network);
          }
        });
      }
      case Call::kDestroyContext:
        contexts_.Drop(in.Get<uint64_t>());
        return Status::Ok();
      case Call::kDescribeOptions: {
        auto backend = backends_.Find(in.Get<uint64_t>());
        if (backend == nullptr)
          return NotFound("no such backend instance");
        auto descriptors =
            GuardBackendCall(id, "DescribeOptions", [&]() -> Result<std::vector<OptionDescriptor>> {
              return backend->backend->DescribeOptions();
            });
        if (!descriptors.ok())
          return std::move(descriptors).error();
        out.Put(*descriptors);
        return Status::Ok();
      }
      case Call::kUpdateOptions: {
        auto backend = backends_.Find(in.Get<uint64_t>());
        const BackendOptions changes = in.GetOptions();
        if (backend == nullptr)
          return NotFound("no such backend instance");
        return GuardBackendCall(id, "UpdateOptions",
                                [&] { return backend->backend->UpdateOptions(changes); });
      }
      case Call::kGetOption: {
        auto backend = backends_.Find(in.Get<uint64_t>());
        const std::string key = in.GetString();
        if (backend == nullptr)
          return NotFound("no such backend instance");
        auto value =
            GuardBackendCall(id, "GetOption", [&] { return backend->backend->GetOption(key); });
        if (!value.ok())
          return std::move(value).error();
        out.Put(*value);
        return Status::Ok();
      }
      case Call::kCheckOptions: {
        auto backend = backends_.Find(in.Get<uint64_t>());
        const BackendOptions options = in.GetOptions();
        if (backend == nullptr)
          return NotFound("no such backend instance");
        BACKPLANE_RETURN_IF_ERROR(Requires({1, 3}, "CheckOptions"));
        return GuardBackendCall(id, "CheckOptions",
                                [&] { return backend->backend->CheckOptions(options); });
      }
      case Call::kDescribeCallOptions: {
        auto backend = backends_.Find(in.Get<uint64_t>());
        if (backend == nullptr)
          return NotFound("no such backend instance");
        BACKPLANE_RETURN_IF_ERROR(Requires({1, 4}, "DescribeCallOptions"));
        auto names =
            GuardBackendCall(id, "DescribeCallOptions", [&]() -> Result<std::vector<std::string>> {
              return backend->backend->DescribeCallOptions();
            });
        if (!names.ok())
          return std::move(names).error();
        out.Put(*names);
        return Status::Ok();
      }
      case Call::kExecute:
      case Call::kExecuteWithOptions:
        break;
    }
    return InvalidArgument("unknown call " + std::to_string(static_cast<uint32_t>(call)));
  }

  // Trap: a method added after x.0 exists in the library's vtable only when it was built against
  // that minor or later; called through the host's slot on an older library, it would jump past
  // the vtable's end. The host never sends such a call (BackendInstance gates on the version
  // kHello reported); this refuses one that arrives anyway instead of crashing the worker.
  Status Requires(BackendApiVersion since, std::string_view method) const {
    const BackendApiVersion own = library_.api_version;
    if (own.major == since.major && own.minor >= since.minor)
      return Status::Ok();
    return FailedPrecondition("backend " + library_.id + " was built against API " +
                              std::to_string(own.major) + "." + std::to_string(own.minor) +
                              ", which has no " + std::string(method));
  }

  // CreateWorkload, or CreateWorkloadWithOptions (SDK 1.3) with the options after the operator.
  Status CreateWorkload(WireReader& in, WireWriter& out, bool with_options) {
    const char* method = with_options ? "CreateWorkloadWithOptions" : "CreateWorkload";
    auto backend = backends_.Find(in.Get<uint64_t>());
    auto entry = std::make_shared<WorkloadEntry>();
    entry->backend = backend;
    const OperatorDesc op = in.GetOperator(entry->constants);
    const BackendOptions options = with_options ? in.GetOptions() : BackendOptions{};
    if (backend == nullptr || !in.ok())
      return in.ok() ? NotFound("no such backend instance") : in.Error(method);
    if (with_options)
      BACKPLANE_RETURN_IF_ERROR(Requires({1, 3}, method));
    auto workload = GuardBackendCall(library_.id, method, [&] {
      return with_options ? backend->backend->CreateWorkloadWithOptions(op, options)
                          : backend->backend->CreateWorkload(op);
    });
    if (!workload.ok())
      return std::move(workload).error();
    entry->workload = std::move(workload).value();
    out.Put(workloads_.Keep(std::move(entry)));
    return Status::Ok();
  }

  // CompileSubgraph (SDK 1.1), or CompileSubgraphWithOptions (SDK 1.3) with the options after the
  // subgraph.
  Status CompileSubgraph(WireReader& in, WireWriter& out, bool with_options) {
    const char* method = with_options ? "CompileSubgraphWithOptions" : "CompileSubgraph";
    auto backend = backends_.Find(in.Get<uint64_t>());
    auto entry = std::make_shared<WorkloadEntry>();
    entry->backend = backend;
    const SubgraphDesc subgraph = in.GetSubgraph(entry->constants);
    const BackendOptions options = with_options ? in.GetOptions() : BackendOptions{};
    if (backend == nullptr || !in.ok())
      return in.ok() ? NotFound("no such backend instance") : in.Error(method);
    BACKPLANE_RETURN_IF_ERROR(
        Requires(with_options ? BackendApiVersion{1, 3} : BackendApiVersion{1, 1}, method));
    auto compiled = GuardBackendCall(library_.id, method, [&]() -> Result<CompiledSubgraph> {
      return with_options ? backend->backend->CompileSubgraphWithOptions(subgraph, options)
                          : backend->backend->CompileSubgraph(subgraph);
    });
    if (!compiled.ok())
      return std::move(compiled).error();
    entry->workload = std::move(compiled->workload);
    out.Put(workloads_.Keep(std::move(entry)));
    out.Put(compiled->layer_notes);
    return Status::Ok();
  }

  // Inputs are read where the host wrote them; outputs are written after the request, and the
  // reply (status, then each output's offset) over the request's start once Execute returned.
  // kExecute, or kExecuteWithOptions (SDK 1.4) with the call's options after the output infos.
  std::size_t Execute(WireReader& in, std::span<std::byte> payload, std::size_t request_bytes,
                      bool with_options) {
    auto entry = workloads_.Find(in.Get<uint64_t>());
    std::vector<ConstTensorView> inputs(std::min<uint64_t>(in.Get<uint64_t>(), 4096));
    for (auto& input : inputs) {
      input.info = in.GetTensorInfo();
      in.AlignTo(kTensorAlignment);
      const auto bytes = CheckedByteSize(input.info, "an input");
      input.data = bytes.ok() ? in.Take(*bytes) : nullptr;
    }
    std::vector<TensorView> outputs(std::min<uint64_t>(in.Get<uint64_t>(), 4096));
    std::vector<uint64_t> offsets;
    std::size_t end = request_bytes;
    Status status = library_.load_error;
    for (auto& output : outputs) {
      output.info = in.GetTensorInfo();
      end = (end + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
      const auto bytes = CheckedByteSize(output.info, "an output");
      if (!bytes.ok() || *bytes > payload.size() - std::min(end, payload.size())) {
        status =
            Status(StatusCode::kResourceExhausted, "the outputs do not fit in a worker call slot");
        break;
      }
      output.data = payload.data() + end;
      offsets.push_back(end);
      end += *bytes;
    }
    BackendOptions options;
    if (status.ok() && with_options) {
      options = in.GetOptions();
      status = Requires({1, 4}, "IWorkload::ExecuteWithOptions");
    }
    if (status.ok() && (!in.ok() || entry == nullptr))
      status = !in.ok() ? in.Error("an Execute request") : NotFound("no such workload");
    std::chrono::nanoseconds in_backend{0};
    if (status.ok()) {
      const auto start = std::chrono::steady_clock::now();
      status =
          with_options
              ? GuardBackendCall(
                    library_.id, "IWorkload::ExecuteWithOptions",
                    [&] { return entry->workload->ExecuteWithOptions(inputs, outputs, options); })
              : GuardBackendCall(library_.id, "IWorkload::Execute",
                                 [&] { return entry->workload->Execute(inputs, outputs); });
      in_backend = std::chrono::steady_clock::now() - start;
    }
    WireWriter out(payload.first(request_bytes));
    out.Put(status);
    if (!status.ok())
      return out.size();
    out.Put(static_cast<uint64_t>(in_backend.count()));  // the host counts the rest as crossing
    for (uint64_t offset : offsets)
      out.Put(offset);
    return out.ok() ? end : (WireWriter(payload).Put(Internal("reply too large")), 0);
  }

  const SharedRegion& region_;
  const Library library_;
  std::atomic<uint64_t> next_handle_{0};  // one numbering for every kind
  HandleTable<BackendEntry> backends_{next_handle_};
  HandleTable<WorkloadEntry> workloads_{next_handle_};
  HandleTable<ContextEntry> contexts_{next_handle_};
};

// Under memory pressure the kernel's OOM killer ends this process before the server: a backend
// that leaks without memory_limit_bytes costs its worker, not everything. Raising one's own score
// needs no privilege; where /proc refuses, the worker runs without it.
void PreferredByTheOomKiller() {
  const int fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return;
  constexpr char kMostPreferred[] = "1000";
  (void)!::write(fd, kMostPreferred, sizeof kMostPreferred - 1);
  ::close(fd);
}

// Ends this process with the host: blocks on the host's pidfd.
void ExitWithHost(pid_t host) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, host, 0));
  if (pidfd < 0 || ::getppid() != host)
    ::_exit(0);  // the host is gone already
  std::thread([pidfd] {
    pollfd watched{pidfd, POLLIN, 0};
    while (::poll(&watched, 1, -1) < 0) {
    }
    ::_exit(0);
  }).detach();
}

}  // namespace
}  // namespace backplane::isolation

// A backend that calls exit() ends its worker at once, with that status: this definition, exported
// to the backend library (isolation/CMakeLists.txt), replaces glibc's. glibc's exit tears the
// process down (atexit handlers, every library's static destructors) on the calling thread while
// the worker's other threads still run calls, and two exits at once free its list of handlers
// twice: the host would report whatever the teardown did (seen: SIGABRT) instead of the exit. A
// worker has nothing to tear down; the kernel takes everything back.
extern "C" [[noreturn]] void exit(int status) noexcept {
  std::fflush(nullptr);  // what the backend printed still reaches the worker's output
  ::_exit(status);
}

// In a sanitizer build the worker leaves fatal signals to the kernel, as a release build does:
// the host must see the signal a backend died of (SIGSEGV, SIGABRT), not the sanitizer's exit.
#if defined(__SANITIZE_ADDRESS__)
extern "C" const char* __asan_default_options() {
  return "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_abort=0:detect_leaks=0";
}
#endif
#if defined(__SANITIZE_THREAD__)
extern "C" const char* __tsan_default_options() {
  return "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_abort=0";
}
#endif

int main(int argc, char** argv) {
  using namespace backplane::isolation;
  pid_t host = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--host-pid") == 0)
      host = static_cast<pid_t>(std::atoi(argv[i + 1]));
  }
  if (host <= 0) {
    std::fprintf(stderr,
                 "backplane-backend-worker is started by a Backplane host (backend_isolation), "
                 "not by hand\n");
    return 2;
  }
  ExitWithHost(host);
  ::prctl(PR_SET_NAME, "bp-backend-wkr");
  PreferredByTheOomKiller();
  auto region = SharedRegion::Map(kChannelFd);
  if (!region.ok()) {
    std::fprintf(stderr, "backplane-backend-worker: %s\n", region.error().ToString().c_str());
    return 2;
  }
  Worker worker(*region, LoadLibrary());
  std::vector<std::thread> servers;
  for (uint32_t slot = 1; slot < region->slot_count(); ++slot)
    servers.emplace_back([&worker, slot] { worker.Serve(slot); });
  worker.Serve(0);  // never returns: the host ends the worker
}
