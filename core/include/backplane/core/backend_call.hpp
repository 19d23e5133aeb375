// The one guard around calls into backend code: exceptions never cross the backend boundary.
#pragma once

#include <exception>
#include <string>
#include <string_view>
#include <utility>

#include "backplane/core/status.hpp"

namespace backplane {

// Runs `call` (backend code); when an exception escapes it, returns `on_throw(what)` instead,
// with what the exception said. The one try/catch around host calls into backend code: the
// overload below for calls that return a Status or a Result<T>, this one where the caller has
// its own words for the failure (the loader's load failures) or nothing to return (destructors,
// which log it). `on_throw` returns what `call` returns, or something that converts to it.
template <typename Call, typename OnThrow>
auto GuardBackendCall(Call&& call, OnThrow&& on_throw) -> decltype(call()) {
  try {
    return call();
  } catch (const std::exception& e) {
    return on_throw(std::string_view(e.what()));
  } catch (...) {
    return on_throw(std::string_view("an exception that is not a std::exception"));
  }
}

// Runs `call` (backend code) and turns an escaping exception into kInternal naming the backend and
// the call; `call` returns a Status or a Result<T>.
template <typename Call>
auto GuardBackendCall(std::string_view backend_id, std::string_view what, Call&& call)
    -> decltype(call()) {
  return GuardBackendCall(std::forward<Call>(call), [&](std::string_view detail) {
    return Internal("backend " + std::string(backend_id) + " threw from " + std::string(what) +
                    ": " + std::string(detail) + " (exceptions must not escape backend code)");
  });
}

}  // namespace backplane
