// The streaming pass over a KServe v2 REST infer body: its JSON events read into a RequestDraft,
// the request's small values as documents and each input's data already in its tensor (or
// logged until its name, datatype and shape are known). The checks that need the whole request
// come after, in ParseInferenceRequest (json_request_reader.cpp). Private to kserve_rest.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/quoted.hpp"
#include "backplane/core/status.hpp"
#include "backplane/core/tensor.hpp"
#include "backplane/onnx/network.hpp"
#include "kserve_rest/json_tensor_data.hpp"

namespace backplane::server::json_reader {

// One object of "inputs" with its small values as documents and its data already converted (or
// logged, or dropped when the input is refused whatever the data say).
struct InputDraft {
  std::optional<nlohmann::json> not_object;  // the element, when it is not an object
  std::optional<nlohmann::json> name, datatype, shape, parameters;
  std::vector<std::string> unknown_keys;
  std::vector<std::string> repeated_keys;
  bool has_data = false;
  enum class DataMode { kDirect, kLogged, kDropped } mode = DataMode::kDropped;
  std::optional<DataSink> sink;  // kDirect
  Tensor tensor;                 // kDirect: what the sink writes into
  std::optional<DataLog> log;    // kLogged

  std::string Where(std::size_t position) const {
    if (name && name->is_string())
      return "input " + Quoted(name->get<std::string>());
    return "inputs[" + std::to_string(position) + "]";
  }
};

struct RequestDraft {
  std::optional<std::string> not_object;  // the root's type name, when it is not an object
  std::vector<std::string> unknown_keys;
  std::vector<std::string> repeated_keys;
  std::optional<nlohmann::json> id, parameters, outputs;
  bool has_inputs = false, inputs_is_array = false;
  std::vector<InputDraft> inputs;
};

// Reads `json_text` (at most `max_depth` levels deep) into `draft`. Fails only where the JSON
// itself does (malformed, too deep, a number no double holds: kInvalidArgument naming where);
// everything else wrong is left in the draft for the checks that follow.
Status ReadRequestDraft(std::string_view json_text, int max_depth, const Network& network,
                        RequestDraft& draft);

// The network's input called `name`, or null.
const ValueInfo* FindInput(const Network& network, std::string_view name);

// An input's datatype and shape against the model's (`where` prefixes the message): the
// streaming pass asks it to decide where an input's data go, the final one to refuse the input.
Result<TensorInfo> CheckTensorInfo(const std::optional<nlohmann::json>& datatype,
                                   const std::optional<nlohmann::json>& shape_value,
                                   const ValueInfo& expected, const std::string& where);

}  // namespace backplane::server::json_reader
