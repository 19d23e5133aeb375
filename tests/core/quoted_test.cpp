// What messages quote from requests and files stays bounded (issue 23: a 4 MiB model name was
// echoed back whole, a 50,000-dimension shape made a 100 KB message).
#include "backplane/core/quoted.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "backplane/core/tensor.hpp"

namespace backplane {
namespace {

using ::testing::HasSubstr;

TEST(QuotedTest, ShortTextIsQuotedWhole) {
  EXPECT_EQ(Quoted("features"), "'features'");
  EXPECT_EQ(Quoted(""), "''");
  EXPECT_EQ(Quoted(std::string(kMaxQuotedBytes, 'a')),
            "'" + std::string(kMaxQuotedBytes, 'a') + "'");
}

TEST(QuotedTest, LongTextIsCutAndItsSizeSaid) {
  const std::string quoted = Quoted(std::string(std::size_t{4} << 20, 'm'));
  EXPECT_EQ(quoted, "'" + std::string(kMaxQuotedBytes, 'm') + "...' (4194304 bytes)");
}

// A cut inside a multi-byte character would make the message invalid UTF-8, which JSON
// serialisation refuses: the cut moves back to the character's first byte.
TEST(QuotedTest, CutsAtACharacterBoundary) {
  std::string text(kMaxQuotedBytes - 1, 'a');
  text += "\xC3\xA9";  // 'é' straddles the limit
  text += std::string(100, 'b');
  const std::string quoted = Quoted(text);
  EXPECT_EQ(quoted, "'" + std::string(kMaxQuotedBytes - 1, 'a') + "...' (" +
                        std::to_string(text.size()) + " bytes)");
}

TEST(QuotedTest, AnExcerptIsBoundedTheSameWayWithoutQuotes) {
  EXPECT_EQ(Excerpt("\"two\""), "\"two\"");
  EXPECT_EQ(Excerpt(std::string(std::size_t{1} << 20, '9')),
            std::string(kMaxQuotedBytes, '9') + "... (1048576 bytes)");
  std::string text(kMaxQuotedBytes - 1, 'a');
  text += "\xC3\xA9";
  text += "b";
  EXPECT_EQ(Excerpt(text), std::string(kMaxQuotedBytes - 1, 'a') + "... (" +
                               std::to_string(text.size()) + " bytes)");
}

TEST(QuotedTest, LongShapesAreShortenedInMessages) {
  EXPECT_EQ(ToString(Shape{2, 3}), "[2,3]");
  EXPECT_EQ(ToString(Shape{}), "[]");
  EXPECT_EQ(ToString(Shape(16, 1)), "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]");
  Shape many(50000, 7);
  many.front() = 1;
  many.back() = 9;
  const std::string text = ToString(many);
  EXPECT_EQ(text, "[1,7,7,7,7,7,7,7,...,7,9] (50000 dims)");
}

}  // namespace
}  // namespace backplane
