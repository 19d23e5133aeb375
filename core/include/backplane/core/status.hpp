// Status and Result: expected failures as values.
//
// Header-only on purpose: backends include it through the SDK and must not link any host library
// (docs/loading-rules.md rule 4), so nothing here may need an out-of-line definition.
#pragma once

#include <cassert>
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

// The outcome of an operation that returns nothing. Thread-compatible value type.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {
    assert(code != StatusCode::kOk && "an error status needs an error code");
  }

  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message", for logs and test failure output.
  std::string ToString() const {
    if (ok())
      return "OK";
    return std::string(backplane::ToString(code_)) + ": " + message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
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

// A value or an error. The error type defaults to Status; the loader uses its own LoadError so
// that every failure carries a stable reason code.
template <typename T, typename E = Status>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit
  Result(E error) : state_(std::in_place_index<1>, std::move(error)) {}  // NOLINT: implicit

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok() && "value() on an error Result");
    return std::get<0>(state_);
  }
  const T& value() const& {
    assert(ok() && "value() on an error Result");
    return std::get<0>(state_);
  }
  // By value, not T&&: `for (auto& x : MakeResult().value())` must not loop over a destroyed
  // temporary.
  T value() && {
    assert(ok() && "value() on an error Result");
    return std::get<0>(std::move(state_));
  }
  const E& error() const& {
    assert(!ok() && "error() on a successful Result");
    return std::get<1>(state_);
  }
  E error() && {
    assert(!ok() && "error() on a successful Result");
    return std::get<1>(std::move(state_));
  }

  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
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
