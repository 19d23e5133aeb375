// Old-opset nodes into their opset-13 form. Backends implement opset-13 semantics and never see an
// opset, so a model of opset 7 to 12 is accepted only after each of its nodes has been rewritten
// into the form that computes the same thing at opset 13, or refused, naming the node and why.
// Private to backplane_onnx.
#pragma once

#include <cstdint>

#include "backplane/onnx/network.hpp"

namespace backplane {

// The oldest default-domain opset that UpgradeToOpset13 rewrites. Below 7, Add, Sub, Mul and Div
// broadcast only with the `broadcast`/`axis` attributes and Dropout, BatchNormalization have
// `is_test`: not worth rewriting, refused at import.
constexpr int64_t kOldestUpgradableOpset = 7;

// Rewrites every node of `network` (topologically ordered, opset in [7, 13)) into its opset-13
// form; nothing to do from opset 13 on. May add constants (Clip's bounds, Pad's pads and value)
// under names no value of the network uses. Softmax needs its input's rank, so shapes are inferred
// node by node as the rewrite goes, from the declared input infos. Errors name the node, the opset
// and what is unsupported.
[[nodiscard]] Status UpgradeToOpset13(Network& network);

}  // namespace backplane
