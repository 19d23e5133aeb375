#include "backplane/core/options.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace backplane {
namespace {

using ::testing::HasSubstr;

OptionSet MakeOptions() {
  return OptionSet("Demo", {{"fast", OptionType::kBool, false, "go fast"},
                            {"threads", OptionType::kInt64, int64_t{1}, "threads"},
                            {"ratio", OptionType::kDouble, 0.5, "a ratio"},
                            {"mode", OptionType::kString, std::string("auto"), "a mode"}});
}

TEST(OptionsTest, DefaultsAreTheDescribedValues) {
  OptionSet options = MakeOptions();
  EXPECT_EQ(options.GetAs<bool>("fast"), false);
  EXPECT_EQ(options.GetAs<int64_t>("threads"), 1);
  EXPECT_EQ(options.GetAs<double>("ratio"), 0.5);
  EXPECT_EQ(options.GetAs<std::string>("mode"), "auto");
}

TEST(OptionsTest, UpdateAppliesEveryTypedValue) {
  OptionSet options = MakeOptions();
  ASSERT_TRUE(options
                  .Update({{"fast", true},
                           {"threads", int64_t{4}},
                           {"ratio", 0.25},
                           {"mode", std::string("eco")}})
                  .ok());
  EXPECT_EQ(options.GetAs<bool>("fast"), true);
  EXPECT_EQ(options.GetAs<int64_t>("threads"), 4);
  EXPECT_EQ(options.GetAs<double>("ratio"), 0.25);
  EXPECT_EQ(options.GetAs<std::string>("mode"), "eco");
}

TEST(OptionsTest, UnknownKeyChangesNothing) {
  OptionSet options = MakeOptions();
  Status status = options.Update({{"threads", int64_t{8}}, {"turbo", true}});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("backend Demo has no option 'turbo'"));
  EXPECT_THAT(status.message(), HasSubstr("known: fast, threads, ratio, mode"));
  EXPECT_EQ(options.GetAs<int64_t>("threads"), 1);
}

TEST(OptionsTest, WrongTypeChangesNothing) {
  OptionSet options = MakeOptions();
  Status status = options.Update({{"fast", true}, {"threads", std::string("four")}});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("option 'threads' is int64, got string \"four\""));
  EXPECT_EQ(options.GetAs<bool>("fast"), false);
}

TEST(OptionsTest, IntegerDefaultOfADoubleOptionIsADouble) {
  OptionSet options("Demo", {{"ratio", OptionType::kDouble, int64_t{1}, "written as 1, not 1.0"}});
  EXPECT_EQ(options.GetAs<double>("ratio"), 1.0);
  EXPECT_EQ(TypeOf(options.descriptors()[0].default_value), OptionType::kDouble);
}

TEST(OptionsTest, GetUnknownKeyIsNotFound) {
  OptionSet options = MakeOptions();
  auto value = options.Get("nope");
  ASSERT_FALSE(value.ok());
  EXPECT_EQ(value.error().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace backplane
