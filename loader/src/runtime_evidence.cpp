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

}  // namespace backplane::loader
