// A generated catalogue of models on both sides of the batch rule (row_independence.hpp): for
// every supported operator, variants that keep the rows of a batch apart and, where the operator
// can mix or move them, variants that do, with seeded random dimensions, axes, permutations and
// shapes; plus random chains of safe nodes, each also spoiled by one unsafe node. Shared by the
// import tests (each unsafe model refused naming its node, each safe one accepted) and the
// server's (the safe ones served batched to concurrent clients).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backplane/core/tensor.hpp"

namespace backplane::testing {

struct BatchCase {
  std::string name;     // unique; a model directory name
  std::string op_type;  // the operator the case is about ("chain" for a chain of them)
  std::string model;    // a serialized ONNX ModelProto
  // Every graph input with its shape; dimension 0 is -1, the batch.
  std::vector<std::pair<std::string, Shape>> inputs;
  // Empty when the rows stay apart; else how the refusal names what it refuses ("node 'sm'
  // (Softmax)", "graph output 'y'") and a part of its reason.
  std::string refused;
  std::string reason;
  bool safe() const { return refused.empty(); }
};

// The catalogue for `seed`: the same seed, the same models.
std::vector<BatchCase> GenerateBatchCatalogue(uint64_t seed);

}  // namespace backplane::testing
