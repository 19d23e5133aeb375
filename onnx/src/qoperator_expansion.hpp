// ONNX Runtime's QOperator form of quantized models into the QDQ form. Private to backplane_onnx.
//
// ORT's quantization tool writes int8 models two ways: QDQ (QuantizeLinear/DequantizeLinear pairs
// around float operators) and QOperator (QLinearConv, QLinearMatMul, com.microsoft's QLinearAdd,
// each taking quantized tensors with their scales and zero points). Import rewrites the second
// into the first, so that backends see one int8 form: CpuRef runs it with its Q/DQ kernels and
// CpuAcc's int8 fusions recognise it as they recognise ORT's QDQ output. Each QLinear node
// becomes
//   DequantizeLinear(each quantized input) -> the float operator -> QuantizeLinear(y_scale, y_zp)
// which is the operator's definition with the integer accumulation done in float: results agree
// with an integer implementation within one quantization step (the requantization's rounding).
//
// Operators that only move or pick values (MaxPool, Reshape, Flatten, Transpose, Squeeze,
// Unsqueeze), which QOperator models apply to quantized tensors directly, get the same treatment
// with their input's scale and zero point on both sides: exact, since dequantizing is monotonic.
#pragma once

#include <string_view>

#include "backplane/onnx/network.hpp"

namespace backplane {

// Whether ExpandQOperators rewrites the operator `op_type` of `domain` (QLinearConv and
// QLinearMatMul of ONNX's default domain, QLinearAdd of com.microsoft): import accepts it although
// no backend implements it.
bool IsQOperator(std::string_view domain, std::string_view op_type);

// Rewrites every QOperator node of `network` (in topological order, before shape inference) as
// above. Errors name the node: a bias whose scale (x_scale x w_scale) is not a constant, a wrong
// number of inputs. May add constants (the bias scales) and values under names no value uses.
[[nodiscard]] Status ExpandQOperators(Network& network);

}  // namespace backplane
