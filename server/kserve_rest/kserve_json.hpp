// KServe v2 (Open Inference Protocol) JSON tensors ⇄ Backplane tensors: request validation
// against a network's inputs, response and metadata rendering. Pure functions, no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/quoted.hpp"
#include "backplane/core/tensor.hpp"
#include "backplane/onnx/network.hpp"
#include "serving/inference_request.hpp"

namespace backplane::server {

// The header that splits a body into its JSON part and the binary tensor data after it.
inline constexpr char kInferenceHeaderContentLength[] = "Inference-Header-Content-Length";

// An infer body as the transport received it: `json` is the JSON object, `binary` the bytes
// after it (empty without the Inference-Header-Content-Length header). Both view the
// transport's body, which must outlive the parse.
struct InferenceBody {
  std::string_view json;
  std::string_view binary;
  bool has_binary_header = false;  // whether the request split it (for error messages)
};

// Splits `body` at `header_length`, the Inference-Header-Content-Length header's text ("" when
// absent: all of the body is JSON). kInvalidArgument when the text is not a byte count or is
// larger than the body.
Result<InferenceBody> SplitInferenceBody(std::string_view body, std::string_view header_length);

struct ParseLimits {
  int max_json_depth = 32;  // nesting of arrays and objects, counted before anything is parsed
};

// Checks `body` against `network` and converts its tensors, streaming: every element goes
// straight from the JSON text into its input's tensor (or, when an input's "data" comes before
// its "name", "datatype" or "shape", into a compact event log replayed once they are known), so
// the peak memory is the body plus the tensors, never a DOM of the body. Every failure is
// kInvalidArgument naming the input (or key) and why: malformed JSON or nesting deeper than
// limits.max_json_depth; a missing, unknown or duplicate input; a datatype or shape the model
// does not take; data whose element count or nesting does not match the shape; an element of
// the wrong JSON type or out of the datatype's range (1e400 included); an unknown requested
// output; a binary_data_size that does not match the tensor or the binary bytes. When several
// things are wrong the message is the one the whole-document checks would give first (top-level
// keys, then each input in order, then the outputs), except that a number JSON cannot hold
// (1e400) stops the parse where it stands.
Result<InferenceRequest> ParseInferenceRequest(const InferenceBody& body, const Network& network,
                                               const ParseLimits& limits);

// A rendered response: `body` is the JSON text, followed (when some output is binary) by the
// binary outputs' bytes in response order; `json_length` is the length of the JSON part, sent
// as Inference-Header-Content-Length when `has_binary`.
struct RenderedInferenceResponse {
  std::string body;
  std::size_t json_length = 0;
  bool has_binary = false;
};

// The response. Written by hand rather than through nlohmann::json so that FP32 values print in
// their shortest exact form ("0.1", not "0.10000000149011612"). NaN and infinities, which JSON
// cannot express, are written as null. A binary output has "parameters": {"binary_data_size":
// bytes} instead of "data", and its bytes follow the JSON, little-endian.
RenderedInferenceResponse RenderInferenceResponseWithBinary(std::string_view model, int64_t version,
                                                            const InferenceRequest& request,
                                                            const Network& network,
                                                            std::span<const Tensor> outputs);

// The JSON text alone, every output as JSON data whatever the request asked.
std::string RenderInferenceResponse(std::string_view model, int64_t version,
                                    const InferenceRequest& request, const Network& network,
                                    std::span<const Tensor> outputs);

// GET /v2/models/{m}: name, versions, platform, inputs and outputs (a dynamic dimension is -1).
nlohmann::json RenderModelMetadata(std::string_view model, std::span<const int64_t> versions,
                                   const Network& network);

}  // namespace backplane::server
