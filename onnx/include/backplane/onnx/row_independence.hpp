// Whether a network keeps the rows of its batch apart: the property that lets a server join the
// requests of several clients along dimension 0 into one execution and split the outputs back.
#pragma once

#include "backplane/core/status.hpp"
#include "backplane/onnx/network.hpp"

namespace backplane {

// Follows dimension 0 of every graph input (the batch) through every node by a rule per
// operator, and is OK only when row r of every graph output is provably computed from row r of
// the inputs alone, whatever the number of rows: then a row's answer does not depend on which
// other rows share its execution, nor on where in the batch it sits, nor on zero rows appended
// to pad the batch. What keeps rows apart: element-wise operators (an operand without the batch
// broadcasts only when its dimension 0 is 1 or it has a lower rank), the activations, Softmax
// over another axis, Gemm with the batch in A's rows (B a weight), MatMul with it in A's rows or
// as a broadcast dimension, Conv, the pools and BatchNormalization (inference) on dimension 0,
// Flatten and Reshape that keep dimension 0 the batch with the rest of a row unchanged,
// Transpose with perm[0] = 0, Concat and Pad away from axis 0, Identity, Dropout (inference),
// Clip, QuantizeLinear and DequantizeLinear per tensor or per an axis other than 0. Anything else
// fails closed, even where it might be safe: kInvalidArgument "node 'sm'
// (Softmax) normalises over axis 0, the batch dimension: rows of different requests would mix"
// (the node first, as import names nodes, then why), or naming the graph input or output that
// has no batch dimension. Thread-safe: reads `network` only.
Status CheckRowsIndependent(const Network& network);

}  // namespace backplane
