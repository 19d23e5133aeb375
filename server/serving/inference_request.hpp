// One inference request whatever the transport, and the rules every transport's parser shares
// (datatype names, the element-count ceiling, shape matching, input order) with the messages REST
// and gRPC both give, so that the two answer a wrong request alike. Pure functions, value types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/options.hpp"
#include "backplane/core/status.hpp"
#include "backplane/core/tensor.hpp"
#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"

namespace backplane::server {

// KServe datatype names ("FP32", "INT64", "BOOL", ...) for the element types Backplane has;
// kUndefined for anything else (FP16, BYTES, ...).
DataType ParseDataType(std::string_view name);

// The rules every transport's parser shares, with the messages REST and gRPC both give.
// `where` names the input ("input 'x'").
// Products of dimensions are checked against this before any allocation: more elements than
// this cannot have come in a request anyway. Core's one bound on element counts, which the
// runtime and the backends hold every shape to as well.
inline constexpr int64_t kMaxRequestElements = kMaxElementCount;
// Dimensions a request's shape may have, REST's and gRPC's alike: more are refused before any
// dimension is read, so that a shape of half a million costs a comparison, not a shape built,
// matched and written into a message.
inline constexpr std::size_t kMaxRequestRank = 32;
// A shape of `dims` dimensions: kInvalidArgument over kMaxRequestRank.
Status CheckRank(const std::string& where, std::size_t dims);
// Elements in `shape` (non-negative dims), saturated at kMaxRequestElements + 1 when they exceed
// core's bound (BoundedDimProduct, which also counts the non-zero dims of an empty shape):
// hostile dimensions never overflow.
int64_t SaturatedElementCount(const Shape& shape);

// A datatype name against the model's: kInvalidArgument for a name Backplane does not have
// (listing those it has) or a type other than the model's.
Result<DataType> CheckDataTypeMatches(const std::string& where, std::string_view name,
                                      const ValueInfo& expected);
// A shape against the model's (-1: any size).
Status CheckShapeMatches(const std::string& where, const Shape& shape, const ValueInfo& expected);
// A `parameters` map holding "classification" (Triton's classification extension, which returns
// class labels instead of values): kInvalidArgument, since Backplane returns the values only and
// a client asking for labels must not read values as labels. Checked by REST and gRPC alike.
Status CheckNoClassification(const std::string& where, bool has_classification);
// The tensors given by input name, in the order of the network's inputs; the first one missing
// is kInvalidArgument naming it, its datatype and shape, and every input the model takes.
Result<std::vector<Tensor>> InputsInNetworkOrder(std::map<std::string, Tensor, std::less<>> by_name,
                                                 const Network& network);

// A request's per-call backend options (Runtime's CallOptions, by backend id) are its
// request-level parameters named "options.<BackendId>.<key>".
inline constexpr std::string_view kRequestOptionPrefix = "options.";
// For a request-level parameter `name` (REST's and gRPC's alike): false when it is not a per-call
// option (every other parameter is the transport's, or ignored); true when it is one and `value`
// was added to `options`; kInvalidArgument when its name does not split into a backend and a key
// after the prefix. The values are checked against what the backend declares by the runtime, before
// the request runs.
Result<bool> AddRequestOption(std::string_view name, OptionValue value, CallOptions& options);

// A validated inference request. Value type.
struct InferenceRequest {
  std::optional<std::string> id;     // echoed in the response
  std::vector<Tensor> inputs;        // in the order of the network's inputs
  std::vector<std::size_t> outputs;  // indices into the network's outputs, in response order
  // Parallel to `outputs`: true when that output goes back as raw bytes after the JSON (the
  // binary tensor data extension: its "binary_data" parameter, else the request's
  // "binary_data_output").
  std::vector<bool> binary_outputs;
  // Per-call backend options (AddRequestOption); empty: none. A batched model's requests join
  // only requests with equal options (BatchKey).
  CallOptions options;
};

}  // namespace backplane::server
