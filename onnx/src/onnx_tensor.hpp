// Conversions between ONNX TensorProto and Backplane tensors, shared by model import and the
// test-data file functions. Private to backplane_core: the ONNX protobuf types never reach a
// public header, so embedders and backends do not need ONNX to compile.
#pragma once

#include <onnx/onnx_pb.h>

#include <string_view>

#include "backplane/core/status.hpp"
#include "backplane/core/tensor.hpp"

namespace backplane {

// Converts `proto`; `what` names it in errors (e.g. "initializer 'W'"). Reads raw_data and the
// typed repeated fields; external data and segments are kUnimplemented.
Result<Tensor> TensorFromProto(const onnx::TensorProto& proto, std::string_view what);

// Always writes raw_data, as ONNX's numpy_helper does.
Result<onnx::TensorProto> TensorToProto(const Tensor& tensor, std::string_view name);

}  // namespace backplane
