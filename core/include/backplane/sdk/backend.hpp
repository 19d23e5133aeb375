// The backend SDK: everything a backend author includes.
//
// A dynamic backend is a shared object named <vendor>_<name>_backend.so that implements IBackend
// and exports three C entry points (GetBackendId, GetVersion, BackendFactory), which
// BACKPLANE_DEFINE_BACKEND writes for you. Build it with backplane_add_backend() from CMake: that
// sets the flags without which the library could not be unloaded (docs/backend-authors.md).
//
// Rules for code behind this interface:
//  - No exception may escape an entry point. The host catches around every IBackend call and turns
//    an exception into an error, but an exception through a C entry point is undefined behaviour.
//  - Shutdown() returns only when every thread, task and callback the backend started is finished:
//    the library is unmapped right after the instance is destroyed.
//  - No thread_local objects with destructors, no -z nodelete (the host refuses such files).
//
// Compatibility: C++ types cross this boundary, so host and backend must use the same C++ standard
// library ABI. Within one API major version, types here only grow at the end (new virtual
// functions are appended, new structs are new types), so a backend built against minor N runs on
// any host with minor >= N; the host calls what minor N+1 added only on backends that report N+1.
//
// API history:
//  1.0  IBackend: IsSupported, CreateWorkload (one workload per layer), contexts, options.
//  1.1  IBackend::CompileSubgraph: one workload for a run of consecutive layers placed on the
//       backend, so that it can fuse them and keep its own tensor layout between them.
//  1.2  IHost and IBackend::SetHost: parallel work run by the host (ParallelFor, task groups),
//       so that no thread-pool code is compiled into the backend and its library can be unmapped
//       as soon as the waits return (docs/loading-rules.md rule 5).
//  1.3  Per-network options: CreateWorkloadWithOptions and CompileSubgraphWithOptions receive
//       the options one network is prepared with; CheckOptions validates a set without applying.
//  1.4  Per-call options: IBackend::DescribeCallOptions names the options a caller may give for
//       one execution, and IWorkload::ExecuteWithOptions receives them merged over the values the
//       workload was prepared with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/operator.hpp"
#include "backplane/core/options.hpp"
#include "backplane/core/status.hpp"
#include "backplane/core/tensor.hpp"

namespace backplane {

// The backend API this header describes.
inline constexpr uint32_t kBackendApiMajor = 1;
inline constexpr uint32_t kBackendApiMinor = 4;

struct BackendApiVersion {
  uint32_t major = 0;
  uint32_t minor = 0;
  friend bool operator==(const BackendApiVersion&, const BackendApiVersion&) = default;
};

inline constexpr BackendApiVersion kBackendApiVersion{kBackendApiMajor, kBackendApiMinor};

// ArmNN's rule: same major, and the backend was built against a minor no newer than the host's.
constexpr bool IsApiCompatible(BackendApiVersion backend, BackendApiVersion host) {
  return backend.major == host.major && backend.minor <= host.minor;
}

using NetworkId = uint64_t;

// One operator prepared for execution on one backend.
//
// Thread-safe: Execute is called concurrently by many requests, each with its own tensors. Keep
// per-request state on the stack or in the tensors, never in members.
class IWorkload {
 public:
  virtual ~IWorkload() = default;

  // `inputs` and `outputs` have the shapes of the OperatorDesc the workload was created from,
  // with dynamic dimensions resolved; outputs are preallocated by the host.
  virtual Status Execute(std::span<const ConstTensorView> inputs,
                         std::span<const TensorView> outputs) = 0;

  // ---- Added in API 1.4 (append only below this line) ----

  // Per-call options (the ExecuTorch RFC's option 2, options at execute). The host calls this
  // instead of Execute when the request gives values for options the backend names in
  // IBackend::DescribeCallOptions, and only on a backend that reports API >= 1.4 (an older
  // workload's vtable has no slot for it). `options` holds every option the backend declares, at
  // the value this one call runs with: the call's own for the options it gives, else the values
  // the workload was prepared with (the network's, else the runtime's, else the default; what
  // CreateWorkloadWithOptions received). A workload reads the options it declares per call from
  // `options` here, never from the instance: two concurrent calls may give different values.
  // Without per-call values the host calls Execute, so a workload must behave as if it had been
  // given its prepared values. The default ignores `options`.
  virtual Status ExecuteWithOptions(std::span<const ConstTensorView> inputs,
                                    std::span<const TensorView> outputs,
                                    const BackendOptions& options) {
    (void)options;
    return Execute(inputs, outputs);
  }
};

// SDK 1.1: a run of layers the host placed on one backend, in execution order, offered whole to
// CompileSubgraph. Values are named; every name is produced by at most one layer.
struct SubgraphDesc {
  // Each layer as CreateWorkload would see it (shapes, attributes, constant inputs).
  std::vector<OperatorDesc> layers;
  // Per layer, the value names of its inputs and outputs, parallel to layers[i].inputs/outputs
  // ("" for an omitted optional input). Constant inputs have names too; their data is in
  // layers[i].constant_inputs and they are never among `inputs` below.
  std::vector<std::vector<std::string>> layer_inputs;
  std::vector<std::vector<std::string>> layer_outputs;
  // The boundary: the non-constant values the run reads but does not produce (in the order the
  // workload receives them), and the values it must write because something after the run (a
  // later layer or a network output) reads them. Every other value stays inside the workload, in
  // whatever layout the backend likes.
  std::vector<std::string> inputs;
  std::vector<TensorInfo> input_infos;
  std::vector<std::string> outputs;
  std::vector<TensorInfo> output_infos;
};

// SDK 1.1: what CompileSubgraph returns.
struct CompiledSubgraph {
  // Executes the whole run: inputs in the order of SubgraphDesc::inputs, outputs (preallocated by
  // the host) in the order of SubgraphDesc::outputs. Thread-safe like every IWorkload.
  std::unique_ptr<IWorkload> workload;
  // Per layer of the run (parallel to SubgraphDesc::layers): how the backend ran it, for people
  // reading a placement, e.g. "fused into conv1 (Conv+Add+Relu)"; "" when nothing to say.
  std::vector<std::string> layer_notes;
};

// SDK 1.2: parallel work that the host runs for the backend, on the host's TBB workers.
//
// Why: TBB's task templates (tbb::parallel_for, tbb::task_group, ...) compiled into a backend put
// the backend's own code around every task: after a task's body ends, the worker goes on through
// a few instructions of the backend's copy of the template (releasing the waiter, destroying the
// task) after the wait in the backend has already returned. Unmapping the library then crashes
// that worker. Through IHost every template is instantiated in the host: the backend's function
// returns into host code before the host releases any wait, so once ParallelFor or Wait returns,
// no thread is in the backend's code on the backend's behalf.
//
// The functions are plain function pointers with a context pointer, so nothing is instantiated in
// the backend. They must not throw (like a C callback): the host catches what they throw, and
// reports it as a failed call, but every other chunk still runs.
using HostRangeFn = void (*)(void* context, std::size_t begin, std::size_t end);
using HostTaskFn = void (*)(void* context);

// Tasks started with Run and waited for with Wait, run by the host. Obtained from
// IHost::CreateTaskGroup; the backend owns it and destroys it (host code) when done.
//
// Thread-safe: Run may be called from any thread, also from a running task.
class IHostTaskGroup {
 public:
  // Destroying a group waits for its tasks first, like Wait.
  virtual ~IHostTaskGroup() = default;
  // Starts task(context) on a host worker and returns at once.
  virtual void Run(HostTaskFn task, void* context) = 0;
  // Returns when every task run so far has returned (the calling thread may run some of them).
  // kInternal when one of them threw since the last Wait, naming what it threw.
  virtual Status Wait() = 0;
};

// The host services a backend receives through IBackend::SetHost (SDK 1.2).
//
// ABI: like IBackend, IHost and IHostTaskGroup only grow at the end, with a minor bump. A backend
// calls a method added after 1.2 only when ApiVersion() says the host has it.
//
// Thread-safe. Lives longer than every backend instance it is given to.
class IHost {
 public:
  // The backend API the host implements (>= 1.2).
  virtual BackendApiVersion ApiVersion() const = 0;
  // Calls body(context, begin, end) over disjoint subranges that cover [0, n), each about `grain`
  // long or longer (0 is taken as 1), in parallel on the calling thread's TBB arena (a request's
  // arena when called from IWorkload::Execute, so the host's concurrency limit holds), and returns
  // when every call has returned. kInternal when a call threw.
  virtual Status ParallelFor(std::size_t n, std::size_t grain, HostRangeFn body, void* context) = 0;
  // A new task group for work that outlives one call (background work). Wait for it (or destroy
  // it) in Shutdown at the latest.
  virtual std::unique_ptr<IHostTaskGroup> CreateTaskGroup() = 0;
  // How many threads ParallelFor may use from the calling thread (for choosing a grain).
  virtual int MaxConcurrency() const = 0;

 protected:
  ~IHost() = default;  // the host owns it; a backend never deletes it
};

// Per-runtime hooks around network loading (ArmNN's IBackendContext). A failing
// BeforeUnloadNetwork keeps the network loaded; the message says why.
//
// Thread-compatible: the host serialises calls on one context.
class IBackendContext {
 public:
  virtual ~IBackendContext() = default;
  virtual Status BeforeLoadNetwork(NetworkId) { return Status::Ok(); }
  virtual Status AfterLoadNetwork(NetworkId) { return Status::Ok(); }
  virtual Status BeforeUnloadNetwork(NetworkId) { return Status::Ok(); }
  virtual Status AfterUnloadNetwork(NetworkId) { return Status::Ok(); }
};

// A backend instance. The host creates one per runtime through BackendFactory and owns it.
//
// Thread-safe: every call may come from any host thread, concurrently with workloads executing.
class IBackend {
 public:
  virtual ~IBackend() = default;

  // The id this instance serves; must equal what GetBackendId() returns.
  virtual std::string_view GetId() const = 0;

  // OK when CreateWorkload would succeed for `op`; otherwise kUnimplemented with the reason
  // (e.g. "attribute auto_pad=NOTSET only"). Must be cheap and must not allocate device memory.
  virtual Status IsSupported(const OperatorDesc& op) const = 0;

  // The host destroys every workload before the instance that created it, so a workload may keep
  // plain references into its backend.
  virtual Result<std::unique_ptr<IWorkload>> CreateWorkload(const OperatorDesc& op) = 0;

  // Called once per runtime after creation. Null when the backend needs no hooks.
  virtual std::unique_ptr<IBackendContext> CreateBackendContext() { return nullptr; }

  // The options this backend understands, with types, defaults and help.
  virtual std::vector<OptionDescriptor> DescribeOptions() const { return {}; }

  // All-or-nothing: an unknown key or a wrong type returns kInvalidArgument and applies nothing.
  // The host calls it with the runtime's creation options once the instance and its context
  // exist, and again on every update.
  virtual Status UpdateOptions(const BackendOptions& changes) {
    return ValidateOptions(changes, DescribeOptions(), GetId());
  }

  virtual Result<OptionValue> GetOption(std::string_view key) const {
    return NotFound("backend " + std::string(GetId()) + " has no option '" + std::string(key) +
                    "'");
  }

  // Returns only when all of this instance's own work (threads, tasks, callbacks, task groups of
  // the host's IHost) is finished. The host calls it on its reaper thread before destroying the
  // instance and closing the library.
  virtual void Shutdown() {}

  // ---- Added in API 1.1 (append only below this line) ----

  // The host offers each maximal run of two or more consecutive layers it placed on this backend
  // (every layer already accepted by IsSupported). Return one workload for the whole run, or
  // kUnimplemented to decline: the host then creates one workload per layer, as in 1.0. Any other
  // error fails the network load with the message. Called only on backends that report API >= 1.1.
  virtual Result<CompiledSubgraph> CompileSubgraph(const SubgraphDesc& subgraph) {
    (void)subgraph;
    return Unimplemented("backend " + std::string(GetId()) + " compiles no subgraphs");
  }

  // ---- Added in API 1.2 (append only below this line) ----

  // The host's services for parallel work. Called once, right after the factory created the
  // instance and before any other call but GetId; `host` outlives the instance. Called only on
  // backends that report API >= 1.2 (a 1.0 or 1.1 backend has no slot for it). A backend that
  // runs work in parallel should do it through `host`, never with TBB's templates of its own
  // (`backplane check` warns about those; docs/backend-authors.md, Parallel work).
  virtual void SetHost(IHost* host) { (void)host; }

  // ---- Added in API 1.3 (append only below this line) ----

  // Per-network options (the ExecuTorch RFC's per-program options; a model's "backend_options"
  // in a server). On a backend that reports API >= 1.3 the host prepares every workload with
  // these two instead of CreateWorkload and CompileSubgraph, passing `options`: every option
  // DescribeOptions declares, at the value this network runs with (the network's own, else the
  // runtime's, else the declared default). A backend that reads an option when it prepares a
  // workload (a thread count, a kernel choice) reads it from `options`, so that two networks on
  // one instance run with different values; an option read at Execute from the instance's own
  // values cannot differ per network. The defaults ignore `options` and prepare with the
  // instance's values, as before 1.3.
  virtual Result<std::unique_ptr<IWorkload>> CreateWorkloadWithOptions(
      const OperatorDesc& op, const BackendOptions& options) {
    (void)options;
    return CreateWorkload(op);
  }
  virtual Result<CompiledSubgraph> CompileSubgraphWithOptions(const SubgraphDesc& subgraph,
                                                              const BackendOptions& options) {
    (void)options;
    return CompileSubgraph(subgraph);
  }
  // Whether `options` (some of the declared options) are values this backend accepts, without
  // applying them: what UpdateOptions would refuse (a value out of range, a name it does not
  // know) refused here with the same message. The host asks before it prepares a network with
  // per-network values, so that a wrong value refuses the network's load naming the option, not
  // a compile. The default checks names and types against DescribeOptions.
  virtual Status CheckOptions(const BackendOptions& options) const {
    return ValidateOptions(options, DescribeOptions(), GetId());
  }

  // ---- Added in API 1.4 (append only below this line) ----

  // The names of the declared options (DescribeOptions) that a caller may give for one execution
  // (IWorkload::ExecuteWithOptions), e.g. a check that costs time and is wanted on some requests
  // only. The host refuses a call's value for any other option (kInvalidArgument naming backend
  // and key) before the request runs, and checks names and types against DescribeOptions (and
  // thread counts against the usable CPUs) so that ExecuteWithOptions gets only declared options
  // of their declared types; ranges are the workload's to check. Asked once per prepared network,
  // not per call: the answer must not change over an instance's life. Called only on backends
  // that report API >= 1.4. Why a list of names and not a field of OptionDescriptor: a backend
  // built against 1.3 returns OptionDescriptors of 1.3's size, so the struct cannot grow.
  virtual std::vector<std::string> DescribeCallOptions() const { return {}; }
};

}  // namespace backplane

// The entry points, declared here so that a definition with another return type or without
// noexcept does not compile, and so that one at global scope has C linkage without writing
// extern "C". Other parameter types still compile, as a C++ overload that the version script
// hides (MISSING_ENTRY_POINT), and so does a definition inside a namespace without extern "C".
// (Only tests that build deliberately broken backends define
// BACKPLANE_NO_ENTRY_POINT_DECLARATIONS.)
#ifndef BACKPLANE_NO_ENTRY_POINT_DECLARATIONS
extern "C" {
const char* GetBackendId() noexcept;
void GetVersion(uint32_t* major, uint32_t* minor) noexcept;
backplane::IBackend* BackendFactory() noexcept;
// Optional: the backend's own release version ("1.2.3"), for logs and the admin API.
const char* GetBackendRelease() noexcept;
// Optional (any API version; old hosts never ask): why the last BackendFactory() call on the
// calling thread returned null, e.g. the what() of the exception the constructor threw; "" when
// it did not fail. The host asks right after a null, on the same thread.
const char* GetBackendFactoryError() noexcept;
}
#endif

namespace backplane {
// How the host calls the entry points: deliberately without noexcept, so that an exception thrown
// by a broken backend reaches the host's catch instead of std::terminate.
using GetBackendIdFn = const char* (*)();
using GetVersionFn = void (*)(uint32_t*, uint32_t*);
using BackendFactoryFn = IBackend* (*)();
using GetBackendReleaseFn = const char* (*)();
using GetBackendFactoryErrorFn = const char* (*)();
}  // namespace backplane

#define BACKPLANE_EXPORT __attribute__((visibility("default")))

namespace backplane::detail {
// BACKPLANE_DEFINE_BACKEND's buffer for a factory's error message, and the copy into it: no
// allocation, since the exception may be std::bad_alloc.
inline constexpr std::size_t kFactoryErrorSize = 512;
inline void CopyFactoryError(char* buffer, const char* message) noexcept {
  std::size_t i = 0;
  for (; message != nullptr && message[i] != '\0' && i + 1 < kFactoryErrorSize; ++i)
    buffer[i] = message[i];
  buffer[i] = '\0';
}
}  // namespace backplane::detail

#ifndef BACKPLANE_BACKEND_RELEASE
#define BACKPLANE_BACKEND_RELEASE ""
#endif

// Defines the entry points of a backend whose class is default-constructible. Use once, in one
// source file of the backend, at namespace scope:
//
//   BACKPLANE_DEFINE_BACKEND(acme::FastBackend, "AcmeFast")
//
// The release version comes from backplane_add_backend(... VERSION x.y.z). BackendFactory catches
// what the constructor throws (no exception may cross a C entry point) and keeps its what() for
// GetBackendFactoryError(), so that the host's log and the rejection say why ("BackendFactory
// failed: <message>"). The message lives in a thread_local char array: trivially destructible,
// so it pins nothing (docs/loading-rules.md rule 3), and concurrent factories never mix messages.
#define BACKPLANE_DEFINE_BACKEND(BackendClass, backend_id)                                 \
  static char* BackplaneFactoryErrorBuffer() noexcept {                                    \
    static thread_local char message[::backplane::detail::kFactoryErrorSize];              \
    return message;                                                                        \
  }                                                                                        \
  extern "C" BACKPLANE_EXPORT const char* GetBackendId() noexcept {                        \
    return backend_id;                                                                     \
  }                                                                                        \
  extern "C" BACKPLANE_EXPORT void GetVersion(uint32_t* major, uint32_t* minor) noexcept { \
    *major = ::backplane::kBackendApiMajor;                                                \
    *minor = ::backplane::kBackendApiMinor;                                                \
  }                                                                                        \
  extern "C" BACKPLANE_EXPORT ::backplane::IBackend* BackendFactory() noexcept {           \
    char* const error = BackplaneFactoryErrorBuffer();                                     \
    error[0] = '\0';                                                                       \
    try {                                                                                  \
      return new BackendClass();                                                           \
    } catch (const std::exception& e) {                                                    \
      ::backplane::detail::CopyFactoryError(error, e.what());                              \
    } catch (...) {                                                                        \
      ::backplane::detail::CopyFactoryError(                                               \
          error, "the constructor threw an exception that is not a std::exception");       \
    }                                                                                      \
    return nullptr;                                                                        \
  }                                                                                        \
  extern "C" BACKPLANE_EXPORT const char* GetBackendFactoryError() noexcept {              \
    return BackplaneFactoryErrorBuffer();                                                  \
  }                                                                                        \
  extern "C" BACKPLANE_EXPORT const char* GetBackendRelease() noexcept {                   \
    return BACKPLANE_BACKEND_RELEASE;                                                      \
  }
