// Why a backend file did not load: a stable reason code plus a message naming the file, the cause
// and the fix. The codes are part of the public contract (`backplane check --json`, the admin API,
// docs/troubleshooting.md): never renumber or rename one.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "backplane/core/status.hpp"

namespace backplane::loader {

enum class LoadReason {
  kNotFound,           // the path does not exist or is a dangling symlink
  kNameScheme,         // the file name does not match <vendor>_<name>_backend.so[.N...]
  kNotRegular,         // a directory, device, fifo...
  kUnsafePermissions,  // writable by group/others, or owned by another user
  kIoError,            // reading the file or writing its shadow copy failed
  kNotElf,             // not an ELF file at all
  kElfTruncated,       // an ELF whose headers or segments point past the end of the file
  kWrongArch,          // ELF for another class, byte order, machine, or not a shared object
  kNotUnloadable,      // GNU_UNIQUE, NODELETE, thread_local destructors, executable stack
  kDlopenFailed,       // the dynamic linker refused it (missing symbol, missing dependency)
  kMissingEntryPoint,  // GetBackendId, GetVersion or BackendFactory not exported with C linkage
  kInvalidId,          // GetBackendId returned null, empty or ill-formed
  kApiIncompatible,    // built against a backend API the host does not support
  kFactoryFailed,      // BackendFactory threw or returned null
  kDuplicateId,        // another file already provides this backend id
  kFileChanged,        // the file changed while it was being copied (a writer is still at work)
  kFileBusy,           // another process holds the file open for writing
  kPrepareFailed,      // a runtime could not create an instance or prepare a network on it
  kValidationFailed,   // its outputs on a probe differ from the active generation's
  kLastReason = kValidationFailed,
};

constexpr std::string_view ToString(LoadReason reason) {
  switch (reason) {
    case LoadReason::kNotFound:
      return "NOT_FOUND";
    case LoadReason::kNameScheme:
      return "NAME_SCHEME";
    case LoadReason::kNotRegular:
      return "NOT_REGULAR";
    case LoadReason::kUnsafePermissions:
      return "UNSAFE_PERMISSIONS";
    case LoadReason::kIoError:
      return "IO_ERROR";
    case LoadReason::kNotElf:
      return "NOT_ELF";
    case LoadReason::kElfTruncated:
      return "ELF_TRUNCATED";
    case LoadReason::kWrongArch:
      return "WRONG_ARCH";
    case LoadReason::kNotUnloadable:
      return "NOT_UNLOADABLE";
    case LoadReason::kDlopenFailed:
      return "DLOPEN_FAILED";
    case LoadReason::kMissingEntryPoint:
      return "MISSING_ENTRY_POINT";
    case LoadReason::kInvalidId:
      return "INVALID_ID";
    case LoadReason::kApiIncompatible:
      return "API_INCOMPATIBLE";
    case LoadReason::kFactoryFailed:
      return "FACTORY_FAILED";
    case LoadReason::kDuplicateId:
      return "DUPLICATE_ID";
    case LoadReason::kFileChanged:
      return "FILE_CHANGED";
    case LoadReason::kFileBusy:
      return "FILE_BUSY";
    case LoadReason::kPrepareFailed:
      return "PREPARE_FAILED";
    case LoadReason::kValidationFailed:
      return "VALIDATION_FAILED";
  }
  return "UNKNOWN";
}

std::optional<LoadReason> ParseLoadReason(std::string_view text);

struct LoadError {
  LoadReason reason;
  std::string message;  // names the file, the cause and, where there is one, the fix

  std::string ToString() const { return std::string(loader::ToString(reason)) + ": " + message; }
};

template <typename T>
using LoadResult = Result<T, LoadError>;

}  // namespace backplane::loader
