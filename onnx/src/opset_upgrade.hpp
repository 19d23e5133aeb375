// Old-opset nodes into their opset-13 form. Backends implement opset-13 semantics and never see an
// opset, so a model of opset 7 to 12 is accepted only after each of its nodes has been rewritten
// into the form that computes the same thing at opset 13, or refused, naming the node and why.
// Private to backplane_onnx.
#pragma once

#include <cstdint>

#include "backplane/onnx/network.hpp"

namespace backplane {

// The oldest default-domain opset that import upgrades. Below 7, Add, Sub, Mul and Div
// broadcast only with the `broadcast`/`axis` attributes and Dropout, BatchNormalization have
// `is_test`: not worth rewriting, refused at import.
constexpr int64_t kOldestUpgradableOpset = 7;

// Import upgrades a model of opset [7, 13) in two steps around its shape inference; from opset 13
// on both do nothing. Errors name the node, the opset and what is unsupported.
//
// First, before inference: the nodes whose old form moved attributes into inputs (Clip, Pad) or
// dropped them (Dropout, BatchNormalization), which shape inference would refuse in their old
// form. May add constants (Clip's bounds, Pad's pads and value) under names no value uses.
[[nodiscard]] Status UpgradeAttributesToOpset13(Network& network);

// Then, with network.values inferred: Softmax, whose old meaning depends on its input's shape
// (shapes of the old form are those of the new one, so inference could run first). May replace
// a Softmax by Flatten, Softmax, Reshape and add their values to network.values.
[[nodiscard]] Status UpgradeSoftmaxToOpset13(Network& network);

}  // namespace backplane
