// ELF inspection before dlopen (docs/loading-rules.md rule 3).
//
// glibc cannot really unload some libraries: those with STB_GNU_UNIQUE symbols, DF_1_NODELETE, or
// thread_local objects with destructors (registered through __cxa_thread_atexit[_impl]). Loading
// a second version of such a backend binds it to the first version's objects. An executable-stack
// library makes every thread stack executable, which no unload undoes. A truncated file is a
// half-written deploy. All of these are refused here, before the dynamic linker sees the file.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/status.hpp"

namespace backplane::loader {

// What reading a shared object's headers, dynamic section and dynamic symbols tells.
struct ElfFacts {
  std::string build_id;  // lower-case hex of NT_GNU_BUILD_ID; empty when the file has none

  // What decides whether glibc can ever unmap it (rules 3 and 8).
  bool nodelete = false;                    // DF_1_NODELETE
  std::vector<std::string> unique_symbols;  // defined STB_GNU_UNIQUE symbols (first 64, mangled)
  std::size_t unique_symbol_count = 0;      // all of them
  std::string thread_atexit_import;         // "__cxa_thread_atexit[_impl]" when imported
  enum class Stack { kNotExecutable, kExecutable, kUnspecified } stack = Stack::kUnspecified;

  // Hygiene that `backplane check` warns about (loadable, but not what backplane_add_backend()
  // builds): symbols other objects could bind to, and lazy binding.
  std::vector<std::string> exported_symbols;  // first 64, mangled
  std::size_t exported_symbol_count = 0;
  bool binds_now = false;  // DT_BIND_NOW / DF_BIND_NOW / DF_1_NOW (-z now)

  // What rules 5 and 8 judge about threads and shared registries (the lists are in
  // loader/src/runtime_evidence.cpp): the first defined fork entry point of a thread-pool runtime
  // ("GOMP_parallel", "__kmpc_fork_call"...), the first imported function that starts a thread
  // ("pthread_create"...), and imports that write into a process-wide registry of a library the
  // host also uses (first 16, mangled).
  std::string thread_pool_entry_point;
  std::string thread_start_import;
  std::vector<std::string> registry_writes;
  // Rule 5: the entry points of libtbb through which TBB's task templates submit tasks
  // (tbb::detail::r1::spawn, execute_and_wait, submit, enqueue), when imported (mangled). Only a
  // library with TBB's task templates compiled into it calls them, and that library's code runs
  // on a worker after the task released its waiter. Calls that run no task of the library's
  // (max_concurrency, task_arena::execute of a function on the calling thread) do not count.
  std::vector<std::string> tbb_task_imports;

  // Dependencies (rule 8): DT_NEEDED in order, and DT_RUNPATH or else DT_RPATH as written
  // (colon-separated, $ORIGIN unexpanded).
  std::vector<std::string> needed;
  std::string search_path;
  bool search_path_is_runpath = false;
};

// Reads the complete bytes of a shared object. Pure function of `image`: never reads outside it,
// never crashes on any input (fuzzed). `file` only names the file in messages.
//
// Errors: kNotElf, kElfTruncated, kWrongArch (class, byte order, machine, or not ET_DYN).
Result<ElfFacts> ReadElf(std::span<const std::byte> image, std::string_view file);

// Why glibc could never really unload a library with these facts, one sentence fragment per
// cause with its fix ("defines 3 STB_GNU_UNIQUE symbols (...): ...; build with ..."); empty when
// it can be unloaded.
std::vector<std::string> UnloadabilityCauses(const ElfFacts& facts);

// kNotUnloadable, with every cause and its fix in the message, unless `facts` can be unloaded.
Result<ElfFacts> CheckUnloadable(ElfFacts facts, std::string_view file);

// What `backplane check` says about a library that submits TBB tasks itself (tbb_task_imports):
// why, what the host does about it, and the fix (SDK 1.2's IHost). Empty when it does not.
std::string TbbTaskAdvice(const ElfFacts& facts);

// ReadElf for a backend file, which must also be unloadable.
Result<ElfFacts> InspectElf(std::span<const std::byte> image, std::string_view file);

// ReadElf of the file at `path`, mapped read-only; `named` names it in messages. kIoError when it
// cannot be opened or mapped.
Result<ElfFacts> ReadElfFile(const std::filesystem::path& path, std::string_view named);

// The C++ name of a mangled symbol ("_ZN3foo3barE" -> "foo::bar"); other names unchanged.
std::string Demangle(std::string_view symbol);

}  // namespace backplane::loader
