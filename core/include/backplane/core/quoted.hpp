// How messages quote what a client or a file sent: bounded, so that a hostile 4 MiB model name
// or a 50,000-dimension shape is not echoed back into a status, a gRPC trailer or a log line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace backplane {

inline constexpr std::size_t kMaxQuotedBytes = 64;

namespace quoted_detail {
// Where a text longer than kMaxQuotedBytes is cut: at a UTF-8 character boundary, so that the
// message stays valid JSON text.
inline std::size_t Cut(std::string_view text) {
  std::size_t cut = kMaxQuotedBytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80)
    --cut;
  return cut;
}
inline std::string SizeSaid(std::size_t size) {
  return " (" + std::to_string(size) + " bytes)";
}
}  // namespace quoted_detail

// 'name', or its first kMaxQuotedBytes bytes followed by "...' (N bytes)".
// Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "'" + std::string.
inline std::string Quoted(std::string_view text) {
  std::string quoted = "'";
  if (text.size() <= kMaxQuotedBytes) {
    quoted.append(text);
    quoted += '\'';
    return quoted;
  }
  quoted.append(text.substr(0, quoted_detail::Cut(text)));
  quoted += "...'";
  quoted += quoted_detail::SizeSaid(text.size());
  return quoted;
}

// The same bound without the quotes, for a value a message shows in its own notation (a JSON
// value as nlohmann dumps it, a number token): `text`, or "abc... (N bytes)".
inline std::string Excerpt(std::string_view text) {
  if (text.size() <= kMaxQuotedBytes)
    return std::string(text);
  std::string excerpt(text.substr(0, quoted_detail::Cut(text)));
  excerpt += "...";
  excerpt += quoted_detail::SizeSaid(text.size());
  return excerpt;
}

}  // namespace backplane
