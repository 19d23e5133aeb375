// What the import tests assert of a model the import must refuse.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "model_builder.hpp"

namespace backplane::testing {

// `model`'s import fails with `code` and a message `message` matches (the node's name, why).
inline void ExpectRefused(const ModelBuilder& model, StatusCode code,
                          const ::testing::Matcher<const std::string&>& message) {
  auto network = model.Import();
  ASSERT_FALSE(network.ok()) << "import succeeded";
  EXPECT_EQ(network.error().code(), code) << network.error().ToString();
  EXPECT_THAT(network.error().message(), message);
}

}  // namespace backplane::testing
