// A backend's shared-library dependencies (docs/loading-rules.md rule 8).
//
// Trap: a dependency that glibc can never unload (it defines STB_GNU_UNIQUE symbols, like
// Debian's libdnnl.so.2, or is DF_1_NODELETE) pins the backend copy that first brings it into the
// process: that generation stays mapped after dlclose forever, while later copies unload.
// Making such a dependency resident before the first generation loads (dlopen with RTLD_NODELETE,
// once per process) lets every generation of the backend unload. A private library in a backend
// directory is refused: glibc loads one copy per soname, so every version of the backend would
// share the first version's copy.
//
// Trap (rule 5): a threading runtime that comes in with the backend (libgomp for a backend
// built with -fopenmp) leaves its worker threads parked in its own code after every call, and
// does not join them when it is unloaded: closing the last backend copy that needs it unmaps
// the code those threads sleep in. Such runtimes are made resident the same way.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/loader/elf_inspector.hpp"

namespace backplane::loader {

// One library in a backend's dependency tree, found where the dynamic linker would find it.
struct Dependency {
  enum class State {
    kAlreadyLoaded,     // in the process before the backend (the host's own libraries)
    kResident,          // made resident, stays for the process: glibc could never unload it,
                        // or its worker threads outlive a call (rule 5)
    kLoadsWithBackend,  // comes and goes with the backend's generations
    kNotFound,          // nowhere on the search path: dlopen will refuse the backend
  };
  std::string name;            // as written in DT_NEEDED, e.g. "libdnnl.so.2"
  std::string needed_by;       // file name of the object whose DT_NEEDED names it
  std::filesystem::path path;  // where it resolves; empty when kNotFound
  State state = State::kNotFound;
  // kResident: why, e.g. "defines 12 STB_GNU_UNIQUE symbols" or "starts worker threads that
  // outlive a call (GNU libgomp, the OpenMP runtime: defines GOMP_parallel, imports
  // pthread_create)".
  std::string why_resident;
  bool starts_worker_threads = false;  // kResident because of its threads
};

std::string_view ToString(Dependency::State state);

// Rule 8 for the backend whose ELF facts are `backend` and which was deployed as
// `deployed_file` ($ORIGIN and the bundled-library check use its directory, not the shadow
// copy's). Resolves every DT_NEEDED entry as the dynamic linker would (DT_RPATH,
// LD_LIBRARY_PATH, DT_RUNPATH, /etc/ld.so.cache, the default directories), and the dependencies
// of those not yet in the process, then makes resident those that glibc could never unload and
// the threading runtimes whose worker threads outlive a call.
// Thread-safe; a library is made resident once per process.
//
// Errors: kBundledDependency when a dependency resolves into the backend's directory;
// kDlopenFailed when a dependency that must be resident cannot be loaded.
Result<std::vector<Dependency>> PrepareDependencies(const ElfFacts& backend,
                                                    const std::filesystem::path& deployed_file);

// One line per dependency, for a load trace: "libdnnl.so.2 -> /usr/lib/.../libdnnl.so.2
// (made resident: defines 12 STB_GNU_UNIQUE symbols)".
std::string DescribeDependencies(const std::vector<Dependency>& dependencies);

// Rule 5: the process-wide registries of libraries the host also uses (spdlog's logger
// registry, TBB's global_control, protobuf's descriptor pool) that a backend with `backend`'s
// facts writes into, with the evidence, what goes wrong and the fix; empty when none. A warning,
// not a refusal: the imports show that the backend writes there, not that what it writes
// collides (a logger registered under a unique name and dropped in Shutdown() works).
std::string DescribeSharedRegistries(const ElfFacts& backend,
                                     const std::vector<Dependency>& dependencies);

}  // namespace backplane::loader
