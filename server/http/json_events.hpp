// A strict JSON (RFC 8259) reader that hands each value to a handler as it is read, for bodies
// whose bulk is numbers: an infer request's "data". nlohmann's SAX parser copies every character
// of a number into a token string and converts it with strtod; this reader converts the number
// in place with std::from_chars, several times faster for a body that is mostly numbers
// (bench/binary_tensor_bench.sh; the numbers are in docs/performance.md).
//
// It accepts exactly what nlohmann::json::accept accepts (a UTF-8 byte order mark first
// included), but for a NUL byte: nlohmann ends the text at one, as a C string ends, and ignores
// what follows; JSON holds none anywhere, and this reader refuses it. It reports numbers as
// nlohmann does: an integer that fits int64 (negative) or uint64
// is an integer, anything else a double; a double out of range is NumberOutOfRange, not infinity.
// tests/server/json_events_test.cpp holds it to that on seeded random documents, and
// tests/fuzz/inference_request_fuzz.cpp on arbitrary bytes. Strings with escapes or non-ASCII
// bytes are decoded and validated by nlohmann itself (one decoder for every JSON string the
// server reads); plain ones are handed over in place.
#pragma once

#include <cstdint>
#include <string_view>

#include "backplane/core/status.hpp"

namespace backplane::server {

// What the reader calls, in document order. Each returns false to stop reading: the reader then
// returns StopReason(). String views are valid only during the call.
class JsonEventHandler {
 public:
  virtual ~JsonEventHandler() = default;
  virtual bool Null() = 0;
  virtual bool Bool(bool value) = 0;
  virtual bool Int64(int64_t value) = 0;    // integers below zero
  virtual bool Uint64(uint64_t value) = 0;  // integers from zero
  virtual bool Double(double value) = 0;    // the rest: fractions, exponents, huge integers
  virtual bool String(std::string_view value) = 0;
  virtual bool Key(std::string_view name) = 0;
  virtual bool BeginObject() = 0;
  virtual bool EndObject() = 0;
  virtual bool BeginArray() = 0;
  virtual bool EndArray() = 0;
  // A number no double holds (1e400); the reader stops after it whatever this returns.
  virtual bool NumberOutOfRange(std::string_view token) = 0;
  // Why the handler stopped (asked after one of the above returned false).
  virtual Status StopReason() const = 0;
};

// Reads one JSON value filling `text` (whitespace around it allowed). Ok when it is well-formed
// and the handler took every event; the handler's StopReason when it stopped;
// kInvalidArgument otherwise: "malformed JSON: nested deeper than N levels at byte B
// (max_json_depth)" or "malformed JSON: parse error at line L, column C: <what>".
Status ReadJsonEvents(std::string_view text, int max_depth, JsonEventHandler& handler);

}  // namespace backplane::server
