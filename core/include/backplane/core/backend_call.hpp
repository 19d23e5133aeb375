// The one guard around calls into backend code: exceptions never cross the backend boundary.
#pragma once

#include <exception>
#include <string>
#include <string_view>

#include "backplane/core/status.hpp"

namespace backplane {

// Runs `call` (backend code) and turns an escaping exception into kInternal naming the backend and
// the call. Every host call into backend code goes through this; `call` returns a Status or a
// Result<T>.
template <typename Call>
auto GuardBackendCall(std::string_view backend_id, std::string_view what, Call&& call)
    -> decltype(call()) {
  auto failure = [&](std::string_view detail) {
    return Internal("backend " + std::string(backend_id) + " threw from " + std::string(what) +
                    ": " + std::string(detail) + " (exceptions must not escape backend code)");
  };
  try {
    return call();
  } catch (const std::exception& e) {
    return failure(e.what());
  } catch (...) {
    return failure("an exception that is not a std::exception");
  }
}

}  // namespace backplane
