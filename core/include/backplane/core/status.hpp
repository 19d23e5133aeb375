// Status and Result: expected failures as values, one error model end to end.
//
// Header-only on purpose: backends include it through the SDK and must not link any host library
// (docs/loading-rules.md rule 4), so nothing here may need an out-of-line definition.
#pragma once

#include <cassert>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace backplane {

// Broad classes of failure, in the spirit of absl::StatusCode. The message says what and why.
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller's input is wrong (bad model, bad request, bad option)
  kNotFound,            // a named thing (file, backend, network, option) does not exist
  kAlreadyExists,       // a named thing exists already (duplicate backend id)
  kFailedPrecondition,  // the system is not in a state that allows the call
  kUnimplemented,       // valid, but not supported (an op a backend cannot run)
  kResourceExhausted,   // overloaded: refused rather than queued
  kUnavailable,         // not ready yet, or shutting down
  kDeadlineExceeded,    // a deadline passed before the work ran
  kInternal,            // a broken invariant or a misbehaving backend
};

constexpr std::string_view ToString(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kInternal:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

// Why a backend file or generation was refused: a stable reason code beside the status code. The
// codes are part of the public contract (`backplane check --json`, the admin API, metrics,
// docs/troubleshooting.md): never renumber or rename one, only append.
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
  kBundledDependency,  // needs a library that sits in a backend directory (shared by all versions)
  kUntrusted,          // its content's digest is not on the host's trusted list (never mapped)
  kRolledBack,  // a progressive rollout rolled the candidate back (its numbers, or an operator)
  kTooLarge,    // larger than the largest backend file the loader reads
  // The process ended without a clean shutdown within the crash grace of activating this content
  // (the server's state_dir): not loaded again until another file is published or an operator
  // reloads it.
  kSuspectedCrash,
  // Its worker process died (isolation/): a candidate rolled back at once, or a stable build past
  // its worker's crash limit. Not deployed again until another file is published.
  kCrashed,
  kLastReason = kCrashed,
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
    case LoadReason::kBundledDependency:
      return "BUNDLED_DEPENDENCY";
    case LoadReason::kUntrusted:
      return "UNTRUSTED";
    case LoadReason::kRolledBack:
      return "ROLLED_BACK";
    case LoadReason::kTooLarge:
      return "TOO_LARGE";
    case LoadReason::kSuspectedCrash:
      return "SUSPECTED_CRASH";
    case LoadReason::kCrashed:
      return "CRASHED";
  }
  return "UNKNOWN";
}

constexpr std::optional<LoadReason> ParseLoadReason(std::string_view text) {
  for (int i = 0; i <= static_cast<int>(LoadReason::kLastReason); ++i) {
    if (ToString(static_cast<LoadReason>(i)) == text)
      return static_cast<LoadReason>(i);
  }
  return std::nullopt;
}

// The status code a refusal for `reason` carries.
constexpr StatusCode CodeOf(LoadReason reason) {
  switch (reason) {
    case LoadReason::kNotFound:
      return StatusCode::kNotFound;
    case LoadReason::kDuplicateId:
      return StatusCode::kAlreadyExists;
    case LoadReason::kFileChanged:
    case LoadReason::kFileBusy:
      return StatusCode::kUnavailable;  // a writer is at work: try again soon
    case LoadReason::kCrashed:
      return StatusCode::kUnavailable;  // a call failed with its worker: another one may serve
    case LoadReason::kIoError:
    case LoadReason::kFactoryFailed:
      return StatusCode::kInternal;
    case LoadReason::kUnsafePermissions:
    case LoadReason::kUntrusted:
    case LoadReason::kNotUnloadable:
    case LoadReason::kDlopenFailed:
    case LoadReason::kApiIncompatible:
    case LoadReason::kPrepareFailed:
    case LoadReason::kValidationFailed:
    case LoadReason::kSuspectedCrash:
      return StatusCode::kFailedPrecondition;
    default:
      return StatusCode::kInvalidArgument;  // the file itself is wrong
  }
}

// The outcome of an operation that returns nothing: a code, for a refused backend file or
// generation a LoadReason, and a message naming the thing and the reason. Thread-compatible.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_and_reason_(static_cast<uint32_t>(code)), message_(std::move(message)) {
    assert(code != StatusCode::kOk && "an error status needs an error code");
  }
  Status(LoadReason reason, std::string message)
      : code_and_reason_(static_cast<uint32_t>(CodeOf(reason)) | (static_cast<uint32_t>(reason) + 1)
                                                                     << 16),
        message_(std::move(message)) {}

  static Status Ok() { return {}; }

  bool ok() const { return code() == StatusCode::kOk; }
  StatusCode code() const { return static_cast<StatusCode>(code_and_reason_ & 0xffffu); }
  std::optional<LoadReason> reason() const {
    const uint32_t stored = code_and_reason_ >> 16;
    if (stored == 0)
      return std::nullopt;
    return static_cast<LoadReason>(stored - 1);
  }
  const std::string& message() const { return message_; }

  // The same failure with `context` in front of the message ("network mnist: " + message).
  Status WithContext(std::string_view context) const {
    Status status = *this;
    status.message_ = std::string(context) + message_;
    return status;
  }

  // The reason's name when there is one ("DUPLICATE_ID"), else the code's ("INVALID_ARGUMENT").
  std::string_view name() const {
    const auto why = reason();
    return why ? backplane::ToString(*why) : backplane::ToString(code());
  }

  // "DUPLICATE_ID: message"; for logs and test failure output.
  std::string ToString() const {
    if (ok())
      return "OK";
    return std::string(name()) + ": " + message_;
  }

 private:
  // One 32-bit word: the code in the low half, the reason + 1 in the high half (0: none). Trap:
  // this is the backend ABI. Statuses cross the backend boundary by value, and backends built
  // against API 1.0, whose Status held a plain StatusCode here, fill the word with the code
  // alone, so their statuses keep their meaning and read as "no reason".
  uint32_t code_and_reason_ = 0;
  std::string message_;
};

inline Status InvalidArgument(std::string message) {
  return {StatusCode::kInvalidArgument, std::move(message)};
}
inline Status NotFound(std::string message) {
  return {StatusCode::kNotFound, std::move(message)};
}
inline Status FailedPrecondition(std::string message) {
  return {StatusCode::kFailedPrecondition, std::move(message)};
}
inline Status Unimplemented(std::string message) {
  return {StatusCode::kUnimplemented, std::move(message)};
}
inline Status Internal(std::string message) {
  return {StatusCode::kInternal, std::move(message)};
}

namespace internal {
template <typename T>
inline constexpr bool kIsSharedOwner = false;
template <typename U>
inline constexpr bool kIsSharedOwner<std::shared_ptr<U>> = true;
}  // namespace internal

// A value or an error: the Status that says why there is none (another type only where a
// protocol needs its own error, e.g. an HTTP response). Thread-compatible.
//
// A Result that holds a std::shared_ptr (a registry, a network, a backend instance) is an owner,
// and only the explicit ways out are offered:
//  - `std::move(result).value()` takes the pointer out: the Result owns nothing afterwards;
//  - `result->Method()` and `*result` observe the pointee without taking a reference;
//  - `result.share()` makes a second owner on purpose, visibly.
// An lvalue `value()` does not compile for them. Trap that it closes: `registry = result.value()`
// copied the pointer and left a second owner inside the Result, which kept the registry (and
// every generation it holds) alive past an embedder's shutdown sequence, until the Result went
// out of scope. Other types keep lvalue value(): a copy of a plain value owns nothing shared.
template <typename T, typename E = Status>
class [[nodiscard]] Result {
  static constexpr bool kSharedOwner = internal::kIsSharedOwner<T>;

 public:
  Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit
  Result(E error) : state_(std::in_place_index<1>, std::move(error)) {}  // NOLINT: implicit

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & requires(!kSharedOwner) { return Stored(); }
  const T& value() const& requires(!kSharedOwner) { return Stored(); }
  // By value, not T&&: `for (auto& x : MakeResult().value())` must not loop over a destroyed
  // temporary.
  T value() && {
    assert(ok() && "value() on an error Result");
    return std::get<0>(std::move(state_));
  }
  // A second owner of what a shared-owner Result holds, taken on purpose.
  [[nodiscard]] T share() const requires kSharedOwner { return Stored(); }
  const E& error() const& {
    assert(!ok() && "error() on a successful Result");
    return std::get<1>(state_);
  }
  E error() && {
    assert(!ok() && "error() on a successful Result");
    return std::get<1>(std::move(state_));
  }

  // For a shared owner, the pointee (`result->Method()`); else the value.
  auto* operator->() {
    if constexpr (kSharedOwner)
      return Stored().get();
    else
      return &Stored();
  }
  const auto* operator->() const {
    if constexpr (kSharedOwner)
      return static_cast<const typename T::element_type*>(Stored().get());
    else
      return &Stored();
  }
  auto& operator*() & { return *operator->(); }
  const auto& operator*() const& { return *operator->(); }

 private:
  T& Stored() {
    assert(ok() && "value() on an error Result");
    return std::get<0>(state_);
  }
  const T& Stored() const {
    assert(ok() && "value() on an error Result");
    return std::get<0>(state_);
  }

  std::variant<T, E> state_;
};

}  // namespace backplane

// Returns the status of `expr` from the enclosing function when it is an error.
#define BACKPLANE_RETURN_IF_ERROR(expr)             \
  do {                                              \
    ::backplane::Status backplane_status_ = (expr); \
    if (!backplane_status_.ok())                    \
      return backplane_status_;                     \
  } while (false)
