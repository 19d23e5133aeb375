#include "backplane/core/listener_list.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace backplane {
namespace {

TEST(ListenerListTest, NotifiesEveryListenerInOrderOfAddition) {
  ListenerList<int> listeners("test listener");
  std::vector<int> seen;
  listeners.Add([&](const int& value) { seen.push_back(value); });
  listeners.Add([&](const int& value) { seen.push_back(value * 10); });
  listeners.Notify(4);
  EXPECT_EQ(seen, (std::vector<int>{4, 40}));
}

TEST(ListenerListTest, RemovedListenerIsNotCalled) {
  ListenerList<int> listeners("test listener");
  int calls = 0;
  const uint64_t id = listeners.Add([&](const int&) { ++calls; });
  listeners.Remove(id);
  listeners.Notify(1);
  EXPECT_EQ(calls, 0);
}

// A generation notifies its unload listeners from its (noexcept) destructor: whatever a
// listener throws must stop inside Notify, and the listeners after it still run.
TEST(ListenerListTest, SwallowsAnyExceptionAndCarriesOn) {
  ListenerList<int> listeners("test listener");
  int later_calls = 0;
  listeners.Add([](const int&) { throw std::runtime_error("a std::exception"); });
  listeners.Add([](const int&) { throw 42; });  // not a std::exception
  listeners.Add([&](const int&) { ++later_calls; });
  EXPECT_NO_THROW(listeners.Notify(1));
  EXPECT_EQ(later_calls, 1);
}

}  // namespace
}  // namespace backplane
