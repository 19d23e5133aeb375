#include "runtime_evidence.hpp"

#include <algorithm>
#include <array>

namespace backplane::loader {
namespace {

// `soname` is `prefix` ("libgomp.so") or a versioned name of it ("libgomp.so.1").
bool NamesLibrary(std::string_view soname, std::string_view prefix) {
  return soname.starts_with(prefix) &&
         (soname.size() == prefix.size() || soname[prefix.size()] == '.');
}

// Runtimes whose worker threads stay parked inside the runtime's code after the call that
// started them returns, and which do not join them when unloaded: the threads then sleep in
// unmapped code. Measured with libgomp (LoaderTrapTest.OpenMpRuntimeStaysResidentAfterItsBackend-
// Leaves without residency): unmapped at the backend's dlclose while the workers of its parallel
// for lived on; with TBB, a SIGSEGV in a worker (rule 5). Listed by the sonames distributions ship.
struct ThreadPoolRuntime {
  std::string_view soname_prefix;
  std::string_view name;
};
constexpr std::array kThreadPoolRuntimes = {
    ThreadPoolRuntime{"libgomp.so", "GNU libgomp, the OpenMP runtime"},
    ThreadPoolRuntime{"libiomp5.so", "Intel libiomp5, the OpenMP runtime"},
    ThreadPoolRuntime{"libomp.so", "LLVM libomp, the OpenMP runtime"},
    ThreadPoolRuntime{"libomp5.so", "LLVM libomp, the OpenMP runtime"},
    ThreadPoolRuntime{"libtbb.so", "TBB's task scheduler"},
    ThreadPoolRuntime{"libtbb_debug.so", "TBB's task scheduler"},
    ThreadPoolRuntime{"libpthreadpool.so", "pthreadpool"},
};

// The fork entry points: what `#pragma omp parallel` compiles to (GCC 4.9 and later:
// GOMP_parallel, which every libgomp since defines; clang and Intel: __kmpc_fork_call, which
// libomp and libiomp5 define, beside GOMP_parallel for GCC-built code), what TBB's templates
// call to hand a task to a worker (oneTBB's r1::spawn), and pthreadpool's. Only the runtime
// defines them; its users import them.
constexpr std::array<std::string_view, 3> kForkEntryPoints = {"GOMP_parallel", "__kmpc_fork_call",
                                                              "pthreadpool_parallelize_1d"};
constexpr std::array<std::string_view, 1> kForkEntryPointPrefixes = {
    "_ZN3tbb6detail2r15spawnE",  // tbb::detail::r1::spawn(task&, task_group_context&[, ...])
};

constexpr std::array<std::string_view, 2> kThreadStarts = {"pthread_create", "thrd_create"};
constexpr std::string_view kStdThreadStart = "_ZNSt6thread15_M_start_thread";

// Libraries the host links that keep one registry for the whole process, and the imports that
// write into it (mangled-name prefixes). Reading (spdlog::get, default_logger) is not listed: a
// backend may log through the host's loggers.
struct RegistryWrites {
  HostRegistry registry;
  std::array<std::string_view, 18> writes;  // "" pads
};
constexpr std::array kHostRegistries = {
    RegistryWrites{
        {"libspdlog.so", "spdlog's logger registry and global settings",
         "what a backend registers or sets there belongs to the host's process: a named logger "
         "stays registered after the backend's code is gone, so a second instance or version "
         "registering the same name fails ('logger with name ... already exists'), and "
         "set_level/set_pattern/flush_every change the host's own logs; keep a logger the "
         "backend owns without registering it (std::make_shared<spdlog::logger>(name, sinks)) "
         "and leave the global settings to the host"},
        {"_ZN6spdlog7details8registry15register_logger",
         "_ZN6spdlog7details8registry17initialize_logger",
         "_ZN6spdlog7details8registry18set_default_logger", "_ZN6spdlog15register_logger",
         "_ZN6spdlog17initialize_logger", "_ZN6spdlog18set_default_logger", "_ZN6spdlog9set_level",
         "_ZN6spdlog11set_pattern", "_ZN6spdlog13set_formatter", "_ZN6spdlog11flush_every",
         "_ZN6spdlog26set_automatic_registration", "_ZN6spdlog17set_error_handler",
         // The sink factories the compiled libspdlog instantiates itself (stdout_color_mt and
         // the others): the backend imports the factory, which registers inside libspdlog.
         "_ZN6spdlog15stdout_color_", "_ZN6spdlog15stderr_color_", "_ZN6spdlog16stdout_logger_",
         "_ZN6spdlog16stderr_logger_", "_ZN6spdlog4drop", "_ZN6spdlog8drop_all"}},
    RegistryWrites{
        {"libtbb.so", "TBB's global_control limits and task_scheduler_observer list",
         "a global_control caps parallelism for every arena in the process, the host's "
         "scheduler included, for as long as it lives, and an observer still registered calls "
         "into the backend's code after it is unmapped; bound the backend's parallelism with a "
         "task_arena of its own, and remove observers in Shutdown()"},
        {"_ZN3tbb6detail2r16createERNS0_2d114global_control",
         "_ZN3tbb6detail2r17observeERNS0_2d123task_scheduler_observer"}},
    RegistryWrites{
        {"libprotobuf.so", "protobuf's generated descriptor pool",
         "generated messages register their .proto files for the life of the process and the "
         "pool keeps pointers into the registering library: a second version registering the "
         "same file aborts the process ('File already exists in database'), and the first "
         "version's descriptors point into unmapped memory once it leaves; link protobuf and "
         "the generated code statically into the backend (hidden, so the pool is its own)"},
        {"_ZN6google8protobuf8internal14AddDescriptors",
         "_ZN6google8protobuf14DescriptorPool24InternalAddGeneratedFile"}},
};

}  // namespace

std::optional<std::string_view> ThreadPoolRuntimeByName(std::string_view soname) {
  for (const ThreadPoolRuntime& runtime : kThreadPoolRuntimes) {
    if (NamesLibrary(soname, runtime.soname_prefix))
      return runtime.name;
  }
  return std::nullopt;
}

bool IsThreadPoolEntryPoint(std::string_view symbol) {
  return std::find(kForkEntryPoints.begin(), kForkEntryPoints.end(), symbol) !=
             kForkEntryPoints.end() ||
         std::any_of(kForkEntryPointPrefixes.begin(), kForkEntryPointPrefixes.end(),
                     [symbol](std::string_view prefix) { return symbol.starts_with(prefix); });
}

bool IsThreadStart(std::string_view symbol) {
  return std::find(kThreadStarts.begin(), kThreadStarts.end(), symbol) != kThreadStarts.end() ||
         symbol.starts_with(kStdThreadStart);
}

const HostRegistry* RegistryWrittenBy(std::string_view imported_symbol) {
  for (const RegistryWrites& entry : kHostRegistries) {
    for (std::string_view write : entry.writes) {
      if (!write.empty() && imported_symbol.starts_with(write))
        return &entry.registry;
    }
  }
  return nullptr;
}

const HostRegistry* RegistryKeptBy(std::string_view soname) {
  for (const RegistryWrites& entry : kHostRegistries) {
    if (NamesLibrary(soname, entry.registry.library))
      return &entry.registry;
  }
  return nullptr;
}

}  // namespace backplane::loader
