// KServe v2 gRPC tensors ⇄ Backplane tensors: ModelInferRequest validated against a network
// (typed `contents` or `raw_input_contents`), outputs rendered into a ModelInferResponse. Pure
// functions, no I/O; the same rules and messages as the REST parser
// (serving/inference_request.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "backplane/core/status.hpp"
#include "backplane/core/tensor.hpp"
#include "backplane/onnx/network.hpp"
#include "grpc_service.pb.h"
#include "serving/inference_request.hpp"

namespace backplane::server {

// Every failure is kInvalidArgument naming the input (or field) and why: an unknown, missing or
// duplicate input; a datatype or shape the model does not take; contents of the wrong type or
// count (INT8 and UINT8 travel in the 32-bit fields and are range-checked); raw contents whose
// count differs from the inputs' or whose size is not elements × element size, or a raw BOOL
// byte other than 0 or 1; raw and typed contents together; an unknown requested output.
Result<InferenceRequest> ParseGrpcInferRequest(const inference::ModelInferRequest& request,
                                               const Network& network);

// Fills `response` with the requested outputs in request order. `raw`: the bytes go to
// raw_output_contents (little-endian, one entry per output) instead of typed contents; Triton
// answers raw when the request came raw, and so does the server.
void RenderGrpcInferResponse(std::string_view model, int64_t version,
                             const InferenceRequest& request, const Network& network,
                             std::span<const Tensor> outputs, bool raw,
                             inference::ModelInferResponse& response);

}  // namespace backplane::server
