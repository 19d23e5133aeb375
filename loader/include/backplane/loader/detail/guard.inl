// Implementation of GuardBackendCall; included by backend_instance.hpp.
#pragma once

#include <exception>
#include <string>

namespace backplane::loader {

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

}  // namespace backplane::loader
