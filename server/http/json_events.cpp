#include "http/json_events.hpp"

#include "http/json_depth.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace backplane::server {
namespace {

bool IsDigit(char c) {
  return c >= '0' && c <= '9';
}

// The text, a position in it, and the syntax errors that name that position.
class Cursor {
 public:
  explicit Cursor(std::string_view text) : text_(text) {}

  bool AtEnd() const { return pos_ == text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }
  std::size_t pos() const { return pos_; }
  void Advance(std::size_t count = 1) { pos_ += count; }
  std::string_view From(std::size_t start) const { return text_.substr(start, pos_ - start); }
  std::string_view Rest() const { return text_.substr(pos_); }

  void SkipSpace() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\n' && c != '\r' && c != '\t')
        return;
      ++pos_;
    }
  }

  // "malformed JSON: parse error at line 2, column 7: expected ':' after a key, got '}'".
  Status Error(std::string_view what) const {
    std::size_t line = 1, column = 1;
    for (std::size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    std::string got;
    if (AtEnd()) {
      got = "the end of the text";
    } else if (static_cast<unsigned char>(Peek()) < 0x20 ||
               static_cast<unsigned char>(Peek()) >= 0x7f) {
      static constexpr char kHex[] = "0123456789ABCDEF";
      const auto byte = static_cast<unsigned char>(Peek());
      got = std::string("byte 0x") + kHex[byte >> 4] + kHex[byte & 15];
    } else {
      got = std::string("'") + Peek() + "'";
    }
    return InvalidArgument("malformed JSON: parse error at line " + std::to_string(line) +
                           ", column " + std::to_string(column) + ": " + std::string(what) +
                           ", got " + got);
  }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
};

// A string at the cursor (its opening quote): plain ASCII without escapes is viewed in place;
// anything else goes through nlohmann's decoder, which validates UTF-8, escapes and surrogate
// pairs exactly as the DOM parser does. False (cursor at the string) when it is invalid.
bool ReadString(Cursor& in, std::string& scratch, std::string_view& value) {
  const std::string_view rest = in.Rest();
  std::size_t end = 1;
  bool plain = true;
  for (; end < rest.size(); ++end) {
    const auto c = static_cast<unsigned char>(rest[end]);
    if (c == '"')
      break;
    if (c == '\\') {
      plain = false;
      ++end;  // the escaped character cannot end the string
    } else if (c < 0x20 || c >= 0x80) {
      plain = false;
    }
  }
  if (end >= rest.size())
    return false;  // no closing quote
  if (plain) {
    value = rest.substr(1, end - 1);
    in.Advance(end + 1);
    return true;
  }
  nlohmann::json decoded = nlohmann::json::parse(rest.substr(0, end + 1), nullptr,
                                                 /*allow_exceptions=*/false);
  if (!decoded.is_string())
    return false;
  scratch = decoded.get<std::string>();
  value = scratch;
  in.Advance(end + 1);
  return true;
}

// The number at the cursor, by JSON's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
// False (cursor unmoved) when the text there is not one.
bool ScanNumber(Cursor& in, std::string_view& token, bool& integral) {
  const std::string_view rest = in.Rest();
  std::size_t i = 0;
  const auto next_is = [&](std::string_view any_of) {
    return i < rest.size() && any_of.find(rest[i]) != std::string_view::npos;
  };
  // One digit or more; false when there is none.
  const auto digits = [&] {
    if (i >= rest.size() || !IsDigit(rest[i]))
      return false;
    while (i < rest.size() && IsDigit(rest[i]))
      ++i;
    return true;
  };
  if (next_is("-"))
    ++i;
  if (next_is("0"))
    ++i;
  else if (!digits())
    return false;
  integral = true;
  if (next_is(".")) {
    ++i;
    if (!digits())
      return false;
    integral = false;
  }
  if (next_is("eE")) {
    ++i;
    if (next_is("+-"))
      ++i;
    if (!digits())
      return false;
    integral = false;
  }
  token = rest.substr(0, i);
  in.Advance(i);
  return true;
}

// One scanned number to the handler, typed as nlohmann types it.
bool DeliverNumber(std::string_view token, bool integral, JsonEventHandler& handler) {
  const char* first = token.data();
  const char* last = token.data() + token.size();
  if (integral) {
    if (token.front() == '-') {
      int64_t value = 0;
      if (std::from_chars(first, last, value).ec == std::errc())
        return handler.Int64(value);
    } else {
      uint64_t value = 0;
      if (std::from_chars(first, last, value).ec == std::errc())
        return handler.Uint64(value);
    }
    // Too large for 64 bits: a double, as nlohmann makes it.
  }
  double value = 0;
  if (std::from_chars(first, last, value).ec != std::errc()) {
    // Out of range either way: strtod tells overflow (infinity) from underflow (zero or a
    // denormal, which JSON allows), as nlohmann's own conversion does.
    const std::string copy(token);
    value = std::strtod(copy.c_str(), nullptr);
  }
  if (!std::isfinite(value)) {
    handler.NumberOutOfRange(token);
    return false;
  }
  return handler.Double(value);
}

}  // namespace

Status ReadJsonEvents(std::string_view text, int max_depth, JsonEventHandler& handler) {
  Cursor in(text);
  if (text.starts_with("\xEF\xBB\xBF"))
    in.Advance(3);                   // a UTF-8 byte order mark, which nlohmann skips too
  std::vector<bool> open_is_object;  // the containers open, innermost last
  std::string scratch;               // a decoded string's bytes
  std::string_view string;
  const auto stopped = [&] { return handler.StopReason(); };

  // A key and its colon, the cursor at the key's quote.
  const auto read_key = [&]() -> Status {
    if (in.Peek() != '"')
      return in.Error("expected a key (a string)");
    if (!ReadString(in, scratch, string))
      return in.Error("invalid string");
    if (!handler.Key(string))
      return stopped();
    in.SkipSpace();
    if (in.Peek() != ':')
      return in.Error("expected ':' after a key");
    in.Advance();
    in.SkipSpace();
    return Status::Ok();
  };

  in.SkipSpace();
  while (true) {
    // A value is expected here.
    bool value_done = true;  // false: a container opened, its first element comes next
    switch (in.Peek()) {
      case '{':
      case '[': {
        const bool is_object = in.Peek() == '{';
        if (static_cast<int>(open_is_object.size()) >= max_depth)
          return NestedTooDeep(max_depth, in.pos());
        in.Advance();
        if (!(is_object ? handler.BeginObject() : handler.BeginArray()))
          return stopped();
        in.SkipSpace();
        if (in.Peek() == (is_object ? '}' : ']')) {
          in.Advance();
          if (!(is_object ? handler.EndObject() : handler.EndArray()))
            return stopped();
          break;
        }
        open_is_object.push_back(is_object);
        if (is_object)
          BACKPLANE_RETURN_IF_ERROR(read_key());
        value_done = false;
        break;
      }
      case '"':
        if (!ReadString(in, scratch, string))
          return in.Error("invalid string");
        if (!handler.String(string))
          return stopped();
        break;
      case 't':
      case 'f':
      case 'n': {
        const std::string_view rest = in.Rest();
        if (rest.starts_with("true")) {
          in.Advance(4);
          if (!handler.Bool(true))
            return stopped();
        } else if (rest.starts_with("false")) {
          in.Advance(5);
          if (!handler.Bool(false))
            return stopped();
        } else if (rest.starts_with("null")) {
          in.Advance(4);
          if (!handler.Null())
            return stopped();
        } else {
          return in.Error("invalid literal");
        }
        break;
      }
      default: {
        std::string_view token;
        bool integral = false;
        if (!ScanNumber(in, token, integral))
          return in.Error(in.AtEnd() ? "expected a value" : "invalid value");
        if (!DeliverNumber(token, integral, handler))
          return stopped();
        break;
      }
    }
    if (!value_done)
      continue;
    // After a value: the end of the text, a comma, or the close of its container.
    while (true) {
      in.SkipSpace();
      if (open_is_object.empty()) {
        if (!in.AtEnd())
          return in.Error("expected the end of the text after the value");
        return Status::Ok();
      }
      const bool in_object = open_is_object.back();
      if (in.Peek() == ',') {
        in.Advance();
        in.SkipSpace();
        if (in_object)
          BACKPLANE_RETURN_IF_ERROR(read_key());
        break;  // the next value
      }
      if (in.Peek() != (in_object ? '}' : ']'))
        return in.Error(in_object ? "expected ',' or '}' after a member"
                                  : "expected ',' or ']' after an element");
      in.Advance();
      open_is_object.pop_back();
      if (!(in_object ? handler.EndObject() : handler.EndArray()))
        return stopped();
    }
  }
}

}  // namespace backplane::server
