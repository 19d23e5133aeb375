// KServe v2 (Open Inference Protocol) JSON tensors ⇄ Backplane tensors: request validation
// against a network's inputs, response and metadata rendering. Pure functions, no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "backplane/core/tensor.hpp"

namespace backplane::server {

// KServe datatype names ("FP32", "INT64", "BOOL", ...) for the element types Backplane has;
// kUndefined for anything else (FP16, BYTES, ...).
DataType ParseDataType(std::string_view name);

// A validated inference request. Value type.
struct InferenceRequest {
  std::optional<std::string> id;     // echoed in the response
  std::vector<Tensor> inputs;        // in the order of the network's inputs
  std::vector<std::size_t> outputs;  // indices into the network's outputs, in response order
};

// Checks `body` against `network` and converts its tensors. Every failure is kInvalidArgument
// naming the input (or key) and why: a missing, unknown or duplicate input; a datatype or shape
// the model does not take; data whose element count or nesting does not match the shape; an
// element of the wrong JSON type or out of the datatype's range; an unknown requested output;
// the binary-data extension (not supported).
Result<InferenceRequest> ParseInferenceRequest(const nlohmann::json& body, const Network& network);

// The response JSON text. Written by hand rather than through nlohmann::json so that FP32 values
// print in their shortest exact form ("0.1", not "0.10000000149011612"). NaN and infinities,
// which JSON cannot express, are written as null.
std::string RenderInferenceResponse(std::string_view model, int64_t version,
                                    const InferenceRequest& request, const Network& network,
                                    std::span<const Tensor> outputs);

// GET /v2/models/{m}: name, versions, platform, inputs and outputs (a dynamic dimension is -1).
nlohmann::json RenderModelMetadata(std::string_view model, std::span<const int64_t> versions,
                                   const Network& network);

}  // namespace backplane::server
