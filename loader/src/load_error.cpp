#include "backplane/loader/load_error.hpp"

namespace backplane::loader {

std::optional<LoadReason> ParseLoadReason(std::string_view text) {
  for (int i = 0; i <= static_cast<int>(LoadReason::kLastReason); ++i) {
    auto reason = static_cast<LoadReason>(i);
    if (ToString(reason) == text)
      return reason;
  }
  return std::nullopt;
}

}  // namespace backplane::loader
