// An Identity layer for loader tests that run a fixture backend's workload directly.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backplane/loader/backend_instance.hpp"

namespace backplane::testing {

inline OperatorDesc IdentityOp(int64_t elements) {
  return {.op_type = "Identity",
          .name = "identity",
          .inputs = {{DataType::kFloat32, {elements}}},
          .outputs = {{DataType::kFloat32, {elements}}}};
}

// Runs `workload` on 0, 1, 2... and returns the outputs.
inline std::vector<float> RunIdentity(loader::Workload& workload, int64_t elements) {
  std::vector<float> in(elements), out(elements, -1.0f);
  for (int64_t i = 0; i < elements; ++i)
    in[i] = static_cast<float>(i);
  const ConstTensorView input{{DataType::kFloat32, {elements}}, in.data()};
  const TensorView output{{DataType::kFloat32, {elements}}, out.data()};
  Status status = workload.Execute({&input, 1}, {&output, 1});
  EXPECT_TRUE(status.ok()) << status.ToString();
  return out;
}

}  // namespace backplane::testing
