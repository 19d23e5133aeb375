// What marks a library as a threading runtime whose workers outlive a call, and an import as a
// write into a process-wide registry the host shares (docs/loading-rules.md rules 5 and 8). One
// home for these lists: the ELF reader matches symbols against them while it scans, the
// dependency walk matches sonames and words the reasons.
//
// Trap: these are evidence, not proof. The soname list names the runtimes as distributions ship
// them; the symbol rule (a fork entry point defined AND a thread start imported) also catches a
// renamed copy (auditwheel's libgomp-a34b3233.so.1, a vendor's private libiomp5) and skips stub
// libraries that define the API without starting any thread (libiompstubs5).
#pragma once

#include <optional>
#include <string_view>

namespace backplane::loader {

// The runtime a soname belongs to ("GNU libgomp, the OpenMP runtime") when it is one whose worker
// threads outlive a call; nullopt otherwise.
std::optional<std::string_view> ThreadPoolRuntimeByName(std::string_view soname);

// A defined symbol that only a thread-pool runtime defines: the entry point compilers and
// templates call to fork work onto its workers (GOMP_parallel, __kmpc_fork_call, ...).
bool IsThreadPoolEntryPoint(std::string_view symbol);

// An imported symbol that starts a thread (pthread_create, thrd_create, std::thread's start).
bool IsThreadStart(std::string_view symbol);

// A process-wide registry kept by a library the host also uses, which a backend writes into.
struct HostRegistry {
  std::string_view library;      // soname prefix: "libspdlog.so"
  std::string_view registry;     // "spdlog's logger registry"
  std::string_view consequence;  // what goes wrong in a hot-swapped backend, and the fix
};

// The registry that an imported symbol writes into; nullptr when it writes none of them.
const HostRegistry* RegistryWrittenBy(std::string_view imported_symbol);

// The registry a library keeps, by its soname; nullptr when it keeps none of those listed.
const HostRegistry* RegistryKeptBy(std::string_view soname);

}  // namespace backplane::loader
