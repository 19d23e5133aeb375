// ReadJsonEvents (server/http/json_events.cpp) against nlohmann's SAX parser, the reference it
// promises to match: on seeded random documents and on seeded mutations of them, both accept
// the same texts and give the same events (numbers typed and valued alike, bit for bit), and a
// number no double holds is reported as such by both. Then the messages of its errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "http/json_events.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

using ::testing::HasSubstr;
using testing::TestSeed;

// The events of one read, as text: the same for both parsers when they agree.
class EventLog final : public server::JsonEventHandler {
 public:
  bool Null() override { return Add("null"); }
  bool Bool(bool value) override { return Add(value ? "true" : "false"); }
  bool Int64(int64_t value) override { return Add("i" + std::to_string(value)); }
  bool Uint64(uint64_t value) override { return Add("u" + std::to_string(value)); }
  bool Double(double value) override {
    return Add("d" + std::to_string(std::bit_cast<uint64_t>(value)));
  }
  bool String(std::string_view value) override { return Add("s\"" + std::string(value) + "\""); }
  bool Key(std::string_view name) override { return Add("k\"" + std::string(name) + "\""); }
  bool BeginObject() override { return Add("{"); }
  bool EndObject() override { return Add("}"); }
  bool BeginArray() override { return Add("["); }
  bool EndArray() override { return Add("]"); }
  bool NumberOutOfRange(std::string_view token) override {
    Add("out of range " + std::string(token));
    return false;
  }
  Status StopReason() const override { return InvalidArgument("stopped"); }

  std::string events;

 private:
  bool Add(const std::string& event) {
    events += event;
    events += ' ';
    return true;
  }
};

// nlohmann's SAX events, handed to an EventLog: one notation for both parsers.
struct NlohmannToEventLog {
  using json = nlohmann::json;
  bool null() { return log.Null(); }
  bool boolean(bool value) { return log.Bool(value); }
  bool number_integer(json::number_integer_t value) { return log.Int64(value); }
  bool number_unsigned(json::number_unsigned_t value) { return log.Uint64(value); }
  bool number_float(json::number_float_t value, const json::string_t&) { return log.Double(value); }
  bool string(json::string_t& value) { return log.String(value); }
  bool binary(json::binary_t&) { return false; }  // the text parser makes none
  bool start_object(std::size_t) { return log.BeginObject(); }
  bool key(json::string_t& name) { return log.Key(name); }
  bool end_object() { return log.EndObject(); }
  bool start_array(std::size_t) { return log.BeginArray(); }
  bool end_array() { return log.EndArray(); }
  bool parse_error(std::size_t, const std::string& token, const nlohmann::detail::exception& e) {
    if (e.id == 406)  // a number out of range
      log.NumberOutOfRange(token);
    return false;
  }

  EventLog log;
};

struct Reading {
  bool accepted = false;
  bool out_of_range = false;
  std::string events;  // complete when accepted
};

Reading ReadOurs(std::string_view text) {
  EventLog log;
  const Status status = server::ReadJsonEvents(text, 1000, log);
  return {status.ok(), log.events.find("out of range") != std::string::npos, log.events};
}

Reading ReadNlohmann(std::string_view text) {
  NlohmannToEventLog adapter;
  const bool accepted = nlohmann::json::sax_parse(text, &adapter);
  const std::string& events = adapter.log.events;
  return {accepted, events.find("out of range") != std::string::npos, events};
}

// Random JSON, valid by construction: every number form (integers past 64 bits, exponents,
// denormals, overflow), strings with escapes, surrogate pairs and multi-byte UTF-8, and
// whitespace wherever the grammar allows it.
class DocumentMaker {
 public:
  explicit DocumentMaker(uint64_t seed) : random_(seed) {}

  std::string Document() {
    std::string text;
    Space(text);
    Value(text, 0);
    Space(text);
    return text;
  }

  std::mt19937_64& random() { return random_; }

 private:
  int Pick(int count) { return std::uniform_int_distribution<int>(0, count - 1)(random_); }

  void Space(std::string& text) {
    static constexpr char kSpace[] = {' ', '\n', '\r', '\t'};
    while (Pick(4) == 0)
      text += kSpace[Pick(4)];
  }

  void Value(std::string& text, int depth) {
    const int kind = depth > 4 ? Pick(4) : Pick(7);
    switch (kind) {
      case 0:
        Number(text);
        return;
      case 1:
        String(text);
        return;
      case 2:
        text += std::vector<std::string>{"true", "false", "null"}[Pick(3)];
        return;
      case 3:
        Number(text);
        return;
      case 4:
      case 5: {
        text += '[';
        Space(text);
        for (int i = 0, n = Pick(6); i < n; ++i) {
          if (i > 0) {
            text += ',';
            Space(text);
          }
          Value(text, depth + 1);
          Space(text);
        }
        text += ']';
        return;
      }
      default: {
        text += '{';
        Space(text);
        for (int i = 0, n = Pick(4); i < n; ++i) {
          if (i > 0) {
            text += ',';
            Space(text);
          }
          String(text);
          Space(text);
          text += ':';
          Space(text);
          Value(text, depth + 1);
          Space(text);
        }
        text += '}';
        return;
      }
    }
  }

  void Digits(std::string& text, int count) {
    for (int i = 0; i < count; ++i)
      text += static_cast<char>('0' + Pick(10));
  }

  void Number(std::string& text) {
    switch (Pick(8)) {
      case 0: {  // a float as a client prints it
        char buffer[64];
        const float value = std::uniform_real_distribution<float>(-3, 3)(random_);
        text.append(buffer, std::to_chars(buffer, buffer + sizeof buffer, value).ptr);
        return;
      }
      case 1: {  // any double, shortest form
        char buffer[64];
        const double value = std::bit_cast<double>(random_());
        if (!std::isfinite(value))
          return Number(text);
        text.append(buffer, std::to_chars(buffer, buffer + sizeof buffer, value).ptr);
        return;
      }
      case 2:  // near and past the 64-bit limits
        text += std::vector<std::string>{"9223372036854775807",
                                         "-9223372036854775808",
                                         "-9223372036854775809",
                                         "18446744073709551615",
                                         "18446744073709551616",
                                         "-0",
                                         "0",
                                         "-0.0",
                                         "1e400",
                                         "-1e400",
                                         "1e-400",
                                         "4.9e-324",
                                         "2.5e-324",
                                         "1.7976931348623157e308",
                                         "1.7976931348623159e308",
                                         "123456789012345678901234567890"}[Pick(16)];
        return;
      default: {  // by the grammar: sign, integer, fraction, exponent
        if (Pick(2) == 0)
          text += '-';
        if (Pick(4) == 0) {
          text += '0';
        } else {
          text += static_cast<char>('1' + Pick(9));
          Digits(text, Pick(25));
        }
        if (Pick(2) == 0) {
          text += '.';
          Digits(text, 1 + Pick(30));
        }
        if (Pick(3) == 0) {
          text += "eE"[Pick(2)];
          if (Pick(2) == 0)
            text += "+-"[Pick(2)];
          Digits(text, 1 + Pick(3));
        }
        return;
      }
    }
  }

  void String(std::string& text) {
    text += '"';
    for (int i = 0, n = Pick(8); i < n; ++i) {
      switch (Pick(8)) {
        case 0:
          text += std::vector<std::string>{
              "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"}[Pick(8)];
          break;
        case 1:
          text += std::vector<std::string>{"\\u0041", "\\u00e9", "\\u20AC", "\\ud83d\\ude00",
                                           "\\u0000"}[Pick(5)];
          break;
        case 2:
          text += std::vector<std::string>{"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"}[Pick(3)];
          break;
        default:
          text += static_cast<char>(std::uniform_int_distribution<int>(0x20, 0x7e)(random_));
          if (text.back() == '"' || text.back() == '\\')
            text.back() = 'x';
          break;
      }
    }
    text += '"';
  }

  std::mt19937_64 random_;
};

// One byte changed, inserted or removed: from JSON's own characters, and from bytes it forbids
// (control characters, invalid UTF-8).
std::string Mutate(std::string text, std::mt19937_64& random) {
  static const std::string kBytes = "{}[],:\"\\ 0123456789-+.eEtrufalsn\x01\x1f\x80\xc3\xff";
  const auto pick = [&](std::size_t count) {
    return std::uniform_int_distribution<std::size_t>(0, count - 1)(random);
  };
  for (int edits = 1 + static_cast<int>(pick(3)); edits > 0; --edits) {
    const char byte = kBytes[pick(kBytes.size())];
    const std::size_t at = text.empty() ? 0 : pick(text.size() + 1);
    switch (pick(3)) {
      case 0:
        if (at < text.size())
          text[at] = byte;
        break;
      case 1:
        text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), byte);
        break;
      default:
        if (at < text.size())
          text.erase(at, 1);
        break;
    }
  }
  return text;
}

void ExpectSameReading(const std::string& text, const std::string& what) {
  const Reading ours = ReadOurs(text);
  const Reading theirs = ReadNlohmann(text);
  ASSERT_EQ(ours.accepted, theirs.accepted) << what << ": " << ::testing::PrintToString(text);
  ASSERT_EQ(ours.out_of_range, theirs.out_of_range)
      << what << ": " << ::testing::PrintToString(text);
  if (ours.accepted || ours.out_of_range) {
    ASSERT_EQ(ours.events, theirs.events) << what << ": " << ::testing::PrintToString(text);
  }
}

TEST(JsonEventsTest, ReadsSeededRandomDocumentsAsNlohmannDoes) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED=" + std::to_string(seed) +
               " replays it)");
  DocumentMaker maker(seed);
  int out_of_range = 0;
  for (int round = 0; round < 3000; ++round) {
    const std::string text = maker.Document();
    ExpectSameReading(text, "document " + std::to_string(round));
    out_of_range += ReadOurs(text).out_of_range ? 1 : 0;
  }
  EXPECT_GT(out_of_range, 0) << "no document held a number out of range: the maker lost a case";
}

TEST(JsonEventsTest, AcceptsAndRefusesSeededMutationsAsNlohmannDoes) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED=" + std::to_string(seed) +
               " replays it)");
  DocumentMaker maker(seed);
  int accepted = 0, refused = 0;
  for (int round = 0; round < 20000; ++round) {
    const std::string text = Mutate(maker.Document(), maker.random());
    ExpectSameReading(text, "mutation " + std::to_string(round));
    if (ReadNlohmann(text).accepted)
      ++accepted;
    else
      ++refused;
  }
  // Both outcomes well represented, or the comparison says little.
  EXPECT_GT(accepted, 2000);
  EXPECT_GT(refused, 2000);
}

TEST(JsonEventsTest, EdgeCasesReadAsNlohmannReadsThem) {
  const char* const edge_cases[] = {"",
                                    " ",
                                    "0",
                                    "-",
                                    "-0",
                                    "01",
                                    "1.",
                                    ".5",
                                    "+1",
                                    "1e",
                                    "1e+",
                                    "1E-2",
                                    "[1,]",
                                    "[,1]",
                                    "{\"a\":1,}",
                                    "{\"a\" 1}",
                                    "{1:2}",
                                    "[1 2]",
                                    "tru",
                                    "truex",
                                    "nul",
                                    "[true,false,null]",
                                    "\"\\u12\"",
                                    "\"\\ud800\"",
                                    "\"\\udc00\"",
                                    "\"\\ud800\\u0041\"",
                                    "\"\\x\"",
                                    "\"a\tb\"",
                                    "\"\xc3\"",
                                    "\"\xc3\x28\"",
                                    "\"\xed\xa0\x80\"",
                                    "\"\xf4\x90\x80\x80\"",
                                    "\"\xef\xbb\xbf\"",
                                    "\xef\xbb\xbf{}",
                                    "\xef\xbb{}",
                                    "{} {}",
                                    "[]]",
                                    "[[]",
                                    "\"abc",
                                    "[\"a\\\"]",
                                    "1 ",
                                    " 1",
                                    "[1e309]",
                                    "[-1e309]",
                                    "[1e-330]"};
  for (const char* text : edge_cases)
    ExpectSameReading(text, "edge case");
}

// nlohmann reads a NUL byte as the end of the text and accepts "1" followed by anything after
// one; JSON holds no NUL anywhere, so the reader refuses every such text.
TEST(JsonEventsTest, ANulByteAnywhereIsRefused) {
  using namespace std::string_literals;
  for (const std::string& text :
       {"1\0"s, "[1]\0garbage"s, "{\"a\":\"\0\"}"s, "[1,\0002]"s, "\0"s}) {
    EventLog log;
    const Status status = server::ReadJsonEvents(text, 64, log);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << ::testing::PrintToString(text);
    EXPECT_THAT(status.message(), HasSubstr("malformed JSON: parse error"))
        << ::testing::PrintToString(text);
  }
  EXPECT_TRUE(nlohmann::json::accept("[1]\0garbage"s))
      << "nlohmann no longer stops at a NUL: the reader's header comment is out of date";
}

TEST(JsonEventsTest, ErrorsNameTheLineColumnAndWhatWasExpected) {
  EventLog log;
  Status status = server::ReadJsonEvents("{\"a\": 1,\n \"b\" 2}", 64, log);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "malformed JSON: parse error at line 2, column 6: expected ':' after a key, got '2'");

  status = server::ReadJsonEvents("[1, 2", 64, log);
  EXPECT_EQ(status.message(),
            "malformed JSON: parse error at line 1, column 6: expected ',' or ']' after an "
            "element, got the end of the text");

  status = server::ReadJsonEvents("[\"\x01\"]", 64, log);
  EXPECT_EQ(status.message(),
            "malformed JSON: parse error at line 1, column 2: invalid string, got '\"'");

  status = server::ReadJsonEvents("[[[1]]]", 2, log);
  EXPECT_EQ(status.message(),
            "malformed JSON: nested deeper than 2 levels at byte 2 (max_json_depth)");
  EXPECT_TRUE(server::ReadJsonEvents("[[1]]", 2, log).ok());
}

// A handler that stops: the read stops at once and returns the handler's reason.
TEST(JsonEventsTest, AHandlerThatStopsEndsTheReadWithItsReason) {
  class StopAtSecondNumber final : public server::JsonEventHandler {
   public:
    bool Null() override { return true; }
    bool Bool(bool) override { return true; }
    bool Int64(int64_t) override { return true; }
    bool Uint64(uint64_t) override { return ++numbers < 2; }
    bool Double(double) override { return true; }
    bool String(std::string_view) override { return true; }
    bool Key(std::string_view) override { return true; }
    bool BeginObject() override { return true; }
    bool EndObject() override { return true; }
    bool BeginArray() override { return true; }
    bool EndArray() override { return true; }
    bool NumberOutOfRange(std::string_view) override { return false; }
    Status StopReason() const override { return Status(StatusCode::kInternal, "second number"); }
    int numbers = 0;
  } handler;
  const Status status = server::ReadJsonEvents("[1, 2, 3, {]", 64, handler);
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("second number"));
  EXPECT_EQ(handler.numbers, 2);
}

}  // namespace
}  // namespace backplane
