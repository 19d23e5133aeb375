// ELF inspection before dlopen (docs/loading-rules.md rule 3).
//
// glibc cannot really unload some libraries: those with STB_GNU_UNIQUE symbols, DF_1_NODELETE, or
// thread_local objects with destructors (registered through __cxa_thread_atexit[_impl]). Loading
// a second version of such a backend binds it to the first version's objects. An executable-stack
// library makes every thread stack executable, which no unload undoes. A truncated file is a
// half-written deploy. All of these are refused here, before the dynamic linker sees the file.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "backplane/core/status.hpp"

namespace backplane::loader {

// What inspection learned about an acceptable backend image.
struct ElfFacts {
  std::string build_id;  // lower-case hex of NT_GNU_BUILD_ID; empty when the file has none
};

// Inspects the complete bytes of a backend file. Pure function of `image`: never reads outside
// it, never crashes on any input (fuzzed). `file` only names the file in messages.
//
// Errors: kNotElf, kElfTruncated, kWrongArch (class, byte order, machine, or not ET_DYN),
// kNotUnloadable (cause and fix in the message).
Result<ElfFacts> InspectElf(std::span<const std::byte> image, std::string_view file);

}  // namespace backplane::loader
