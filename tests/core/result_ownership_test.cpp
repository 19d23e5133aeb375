// Result ownership (issue 24, item 4): a Result holding a std::shared_ptr offers only explicit ways
// out. `registry = result.value()` on an lvalue must not compile: it left a second owner inside the
// Result, which kept the registry and its generations alive past an embedder's shutdown.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backplane/core/status.hpp"

namespace backplane {
namespace {

struct Widget {
  int Answer() const { return 42; }
  int value = 7;
};

template <typename R>
concept HasLvalueValue = requires(R& result) {
  result.value();
};
template <typename R>
concept HasConstLvalueValue = requires(const R& result) {
  result.value();
};
template <typename R>
concept HasShare = requires(const R& result) {
  result.share();
};

using SharedResult = Result<std::shared_ptr<Widget>>;
static_assert(!HasLvalueValue<SharedResult>, "an lvalue value() would copy an owner out");
static_assert(!HasConstLvalueValue<SharedResult>, "a const lvalue value() would too");
static_assert(HasShare<SharedResult>);
static_assert(
    std::is_same_v<decltype(std::declval<SharedResult>().value()), std::shared_ptr<Widget>>,
    "an rvalue takes the pointer out, by value");
static_assert(std::is_same_v<decltype(*std::declval<SharedResult&>()), Widget&>,
              "* observes the pointee");
// Values that own nothing shared keep the lvalue accessors; so do unique owners, which cannot be
// copied out by accident.
static_assert(HasLvalueValue<Result<int>> && HasConstLvalueValue<Result<std::string>>);
static_assert(HasLvalueValue<Result<std::unique_ptr<Widget>>>);
static_assert(!HasShare<Result<int>>);

TEST(ResultOwnershipTest, MovingTheValueOutLeavesNoOwnerBehind) {
  auto widget = std::make_shared<Widget>();
  SharedResult result(widget);
  EXPECT_EQ(widget.use_count(), 2);
  std::shared_ptr<Widget> taken = std::move(result).value();
  EXPECT_EQ(widget.use_count(), 2) << "the Result owns nothing any more";
  taken.reset();
  EXPECT_EQ(widget.use_count(), 1);
}

TEST(ResultOwnershipTest, ObservingTakesNoReferenceAndShareMakesOneOnPurpose) {
  auto widget = std::make_shared<Widget>();
  SharedResult result(widget);
  EXPECT_EQ(result->Answer(), 42);
  EXPECT_EQ((*result).value, 7);
  EXPECT_EQ(&*result, widget.get());
  EXPECT_EQ(widget.use_count(), 2);
  std::shared_ptr<Widget> second = result.share();
  EXPECT_EQ(widget.use_count(), 3);
  const SharedResult& read_only = result;
  EXPECT_EQ(read_only->Answer(), 42);
}

TEST(ResultOwnershipTest, PlainValuesKeepTheirAccessors) {
  Result<std::vector<int>> result(std::vector<int>{1, 2, 3});
  EXPECT_EQ(result.value().size(), 3u);
  EXPECT_EQ(result->size(), 3u);
  EXPECT_EQ((*result)[1], 2);
  Result<std::vector<int>> error(InvalidArgument("bad"));
  EXPECT_FALSE(error.ok());
  EXPECT_EQ(error.error().message(), "bad");
}

}  // namespace
}  // namespace backplane
