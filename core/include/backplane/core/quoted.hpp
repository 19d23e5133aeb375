// How messages quote what a client or a file sent: bounded, so that a hostile 4 MiB model name
// or a 50,000-dimension shape is not echoed back into a status, a gRPC trailer or a log line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace backplane {

inline constexpr std::size_t kMaxQuotedBytes = 64;

// 'name', or its first kMaxQuotedBytes bytes (cut at a UTF-8 character boundary, so that the
// message stays valid JSON text) followed by "...' (N bytes)".
// Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "'" + std::string.
inline std::string Quoted(std::string_view text) {
  std::string quoted = "'";
  if (text.size() <= kMaxQuotedBytes) {
    quoted.append(text);
    quoted += '\'';
    return quoted;
  }
  std::size_t cut = kMaxQuotedBytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80)
    --cut;
  quoted.append(text.substr(0, cut));
  quoted += "...' (";
  quoted += std::to_string(text.size());
  quoted += " bytes)";
  return quoted;
}

}  // namespace backplane
