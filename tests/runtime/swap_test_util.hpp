// Helpers for the runtime's tests and the hot-reload bench: a network whose outputs tell which
// generation ran each layer, and a chain of three layers that one backend may compile as a run.
#pragma once

#include <chrono>
#include <thread>

#include "backplane/runtime/runtime.hpp"
#include "test_util.hpp"

namespace backplane::testing {

// Hot reload: the fixture builds Valid and ValidNext run Identity adding 0 and 1000 per layer.
constexpr float kNextOffset = 1000.0f;
// x -> Identity -> h -> Identity -> y on FP32[elements]. Two layers on one backend, so that a
// request that mixed generations would be off by exactly one offset.
Network TwoLayerIdentityNetwork(int64_t elements = 4);
// x -> Relu "relu" -> h -> Add(h, x) "add" -> s -> Identity "copy" -> y on FP32 `shape` (a
// negative dim: dynamic): one run of three layers, computing relu(x) + x.
Network ChainNetwork(Shape shape = {4});
// Executes `network` on an input of fives and returns by how much every output element exceeds
// it: 0 on Valid, 2 * kNextOffset on ValidNext; NaN when the request failed or elements differ.
float ExecuteOffset(Runtime& runtime, NetworkId network);

}  // namespace backplane::testing
