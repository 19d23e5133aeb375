// A KServe v2 REST infer body, read: the streaming pass (json_request_draft.cpp) leaves a
// draft, and the checks here go over it in one order whatever the order of the body's keys (top-
// level keys, then each input, then the outputs), so a request with several faults is refused
// for the same one however it is written. The response writer is json_response_writer.cpp; the
// rules gRPC shares are serving/inference_request.cpp.
#include "kserve_rest/kserve_json.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <limits>
#include <map>

#include "kserve_rest/json_request_draft.hpp"

namespace backplane::server {
using nlohmann::json;

namespace {

using json_reader::CheckTensorInfo;
using json_reader::DataSink;
using json_reader::DumpExcerpt;
using json_reader::FindInput;
using json_reader::InputDraft;
using json_reader::ReadRequestDraft;
using json_reader::RequestDraft;

// ---- The checks of the request's small values ----------------------------------------------

Status CheckKeys(std::vector<std::string> unknown, std::initializer_list<std::string_view> known,
                 const std::string& where) {
  if (unknown.empty())
    return Status::Ok();
  const std::string& first = unknown.front();  // in document order
  std::string list;
  for (auto name : known)
    list += (list.empty() ? "" : ", ") + std::string(name);
  return InvalidArgument(where + ": unknown key " + Quoted(first) + " (known: " + list + ")");
}

bool IsKnown(std::string_view key, std::initializer_list<std::string_view> known) {
  return std::find(known.begin(), known.end(), key) != known.end();
}

// True when the parameter is present and not `false` (the extension's switches may be sent off).
bool IsSet(const json& parameters, const char* key) {
  const auto found = parameters.find(key);
  return found != parameters.end() && !(found->is_boolean() && !found->get<bool>());
}

Status CheckClassification(const json& parameters, const std::string& where) {
  return CheckNoClassification(where, parameters.contains("classification"));
}

Result<const json*> ParametersObject(const std::optional<json>& parameters,
                                     const std::string& where) {
  if (!parameters)
    return static_cast<const json*>(nullptr);
  if (!parameters->is_object())
    return InvalidArgument(where + ": 'parameters' must be an object");
  return &*parameters;
}

// The request's "parameters": whether outputs default to binary.
Result<bool> CheckRequestParameters(const std::optional<json>& parameters) {
  const std::string where = "inference request";
  auto object = ParametersObject(parameters, where);
  if (!object.ok())
    return object.error();
  if (*object == nullptr)
    return false;
  const json& values = **object;
  for (const char* key : {"binary_data_size", "binary_data"}) {
    if (IsSet(values, key)) {
      return InvalidArgument(
          where + ": parameter '" + std::string(key) + "' belongs on " +
          (key == std::string_view("binary_data") ? "a requested output" : "an input") +
          " (the binary tensor data extension)");
    }
  }
  BACKPLANE_RETURN_IF_ERROR(CheckClassification(values, where));
  const auto output = values.find("binary_data_output");
  if (output == values.end())
    return false;
  if (!output->is_boolean()) {
    return InvalidArgument(where + ": parameter 'binary_data_output' must be true or false, got " +
                           DumpExcerpt(*output));
  }
  return output->get<bool>();
}

// The request's per-call backend options: its "parameters" named options.<BackendId>.<key>
// (AddRequestOption). A JSON integer is an int64 (the runtime takes it for a double option too),
// a number with a fraction or an exponent a double.
Result<CallOptions> CallOptionsOf(const std::optional<json>& parameters) {
  CallOptions options;
  if (!parameters || !parameters->is_object())
    return options;  // CheckRequestParameters refused a non-object already
  for (const auto& [name, value] : parameters->items()) {
    OptionValue option;
    if (value.is_boolean()) {
      option = value.get<bool>();
    } else if (value.is_number_integer() && !value.is_number_unsigned()) {
      option = value.get<int64_t>();
    } else if (value.is_number_unsigned()) {
      if (value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return InvalidArgument("inference request: parameter " + Quoted(name) +
                               " is beyond int64, got " + DumpExcerpt(value));
      }
      option = static_cast<int64_t>(value.get<uint64_t>());
    } else if (value.is_number_float()) {
      option = value.get<double>();
    } else if (value.is_string()) {
      option = value.get<std::string>();
    } else if (std::string_view(name).starts_with(kRequestOptionPrefix)) {
      return InvalidArgument("inference request: parameter " + Quoted(name) +
                             " must be a bool, a number or a string, got " + DumpExcerpt(value));
    } else {
      continue;
    }
    auto added = AddRequestOption(name, std::move(option), options);
    if (!added.ok())
      return added.error().WithContext("inference request: ");
  }
  return options;
}

// An input's "parameters": its binary_data_size when it has one.
Result<std::optional<uint64_t>> CheckInputParameters(const std::optional<json>& parameters,
                                                     const std::string& where) {
  auto object = ParametersObject(parameters, where);
  if (!object.ok())
    return object.error();
  if (*object == nullptr)
    return std::optional<uint64_t>();
  const json& values = **object;
  for (const char* key : {"binary_data", "binary_data_output"}) {
    if (IsSet(values, key)) {
      return InvalidArgument(where + ": parameter '" + std::string(key) + "' belongs on " +
                             (key == std::string_view("binary_data") ? "a requested output"
                                                                     : "the request's parameters") +
                             ", not on an input (the binary tensor data extension)");
    }
  }
  BACKPLANE_RETURN_IF_ERROR(CheckClassification(values, where));
  const auto size = values.find("binary_data_size");
  if (size == values.end())
    return std::optional<uint64_t>();
  if (!size->is_number_unsigned()) {
    return InvalidArgument(where +
                           ": parameter 'binary_data_size' must be a byte count (a non-negative "
                           "integer), got " +
                           DumpExcerpt(*size));
  }
  return std::optional<uint64_t>(size->get<uint64_t>());
}

// A requested output's "parameters": whether it goes back binary (nullopt: as the request says).
Result<std::optional<bool>> CheckOutputParameters(const json& output, const std::string& where) {
  const auto found = output.find("parameters");
  if (found == output.end())
    return std::optional<bool>();
  if (!found->is_object())
    return InvalidArgument(where + ": 'parameters' must be an object");
  for (const char* key : {"binary_data_size", "binary_data_output"}) {
    if (IsSet(*found, key)) {
      return InvalidArgument(
          where + ": parameter '" + std::string(key) + "' belongs on " +
          (key == std::string_view("binary_data_size") ? "an input" : "the request's parameters") +
          ", not on a requested output (the binary tensor data extension)");
    }
  }
  BACKPLANE_RETURN_IF_ERROR(CheckClassification(*found, where));
  const auto binary = found->find("binary_data");
  if (binary == found->end())
    return std::optional<bool>();
  if (!binary->is_boolean()) {
    return InvalidArgument(where + ": parameter 'binary_data' must be true or false, got " +
                           DumpExcerpt(*binary));
  }
  return std::optional<bool>(binary->get<bool>());
}

// The binary data after the JSON header, handed out in input order.
class BinaryCursor {
 public:
  BinaryCursor(std::string_view bytes, bool has_header) : bytes_(bytes), has_header_(has_header) {}

  Result<std::string_view> Take(uint64_t size, const std::string& where) {
    if (size > bytes_.size() - used_) {
      return InvalidArgument(
          where + ": binary_data_size " + std::to_string(size) + " runs past the binary data (" +
          std::to_string(bytes_.size()) + " byte(s) after the JSON header, " +
          std::to_string(used_) + " taken by earlier inputs)" +
          (has_header_ ? ""
                       : "; the request has no Inference-Header-Content-Length header, so all "
                         "of its body was read as JSON"));
    }
    const std::string_view taken = bytes_.substr(used_, size);
    used_ += size;
    return taken;
  }

  Status CheckAllTaken() const {
    if (used_ == bytes_.size())
      return Status::Ok();
    return InvalidArgument(
        "the binary data after the JSON header is " + std::to_string(bytes_.size()) +
        " byte(s), but the inputs' binary_data_size add up to " + std::to_string(used_));
  }

 private:
  std::string_view bytes_;
  bool has_header_;
  std::size_t used_ = 0;
};

// The checks of one input, in one order whatever the order of its keys: keys, parameters,
// datatype, shape, then its data (JSON or binary).
Result<Tensor> FinishInput(InputDraft& input, const ValueInfo& expected, const std::string& name,
                           std::size_t json_bytes, BinaryCursor& binary) {
  const std::string where = "input " + Quoted(name);
  BACKPLANE_RETURN_IF_ERROR(
      CheckKeys(input.unknown_keys, {"name", "shape", "datatype", "data", "parameters"}, where));
  if (!input.repeated_keys.empty())
    return InvalidArgument(where + ": key " + Quoted(input.repeated_keys.front()) +
                           " is given twice");
  auto binary_size = CheckInputParameters(input.parameters, where);
  if (!binary_size.ok())
    return binary_size.error();
  auto info = CheckTensorInfo(input.datatype, input.shape, expected, where);
  if (!info.ok())
    return info.error();

  if (*binary_size) {
    if (input.has_data) {
      return InvalidArgument(where +
                             ": has both 'data' and parameter 'binary_data_size'; send one of "
                             "them");
    }
    const int64_t count = SaturatedElementCount(info->shape);
    const uint64_t needed = count > kMaxRequestElements
                                ? std::numeric_limits<uint64_t>::max()
                                : static_cast<uint64_t>(count) * ElementSize(info->type);
    if (**binary_size != needed) {
      return InvalidArgument(where + ": binary_data_size is " + std::to_string(**binary_size) +
                             " byte(s), shape " + ToString(info->shape) + " of " +
                             std::string(ToString(info->type)) + " needs " +
                             (count > kMaxRequestElements ? "too many" : std::to_string(needed)));
    }
    auto bytes = binary.Take(**binary_size, where);
    if (!bytes.ok())
      return bytes.error();
    // The extension's bytes are little-endian; so is every host this builds for.
    static_assert(std::endian::native == std::endian::little);
    Tensor tensor(*info);
    if (!bytes->empty())
      std::memcpy(tensor.data(), bytes->data(), bytes->size());
    if (info->type == DataType::kBool) {
      for (std::byte& flag : tensor.bytes()) {
        if (flag != std::byte{0} && flag != std::byte{1}) {
          return InvalidArgument(where + ": BOOL binary data holds a byte other than 0 or 1");
        }
      }
    }
    return tensor;
  }

  switch (input.mode) {
    case InputDraft::DataMode::kDirect: {
      BACKPLANE_RETURN_IF_ERROR(input.sink->Finish());
      if (input.tensor.info() != *info)
        break;  // not allocated: Finish cannot have passed (see StartData)
      return std::move(input.tensor);
    }
    case InputDraft::DataMode::kLogged: {
      void* buffer = nullptr;
      Tensor tensor;
      // Not `buffer`: an empty tensor ([0,4], zero rows) is kept and has no data pointer.
      bool kept = false;
      if (SaturatedElementCount(info->shape) <= static_cast<int64_t>(json_bytes)) {
        tensor = Tensor(*info);
        buffer = tensor.data();
        kept = true;
      }
      DataSink sink(buffer, info->shape, info->type, Quoted(name));
      input.log->ReplayInto(sink);
      input.log.reset();  // its memory back before the next input's
      BACKPLANE_RETURN_IF_ERROR(sink.Finish());
      if (!kept)
        break;  // more elements than the body has bytes: Finish cannot have passed
      return tensor;
    }
    case InputDraft::DataMode::kDropped:
      if (!input.has_data)
        return InvalidArgument(where + ": 'data' (an array) is required");
      break;
  }
  // Dropped data belong to an input refused above, and a tensor too large for the body fails its
  // count check: reaching here is a bug in StartData or DataSink.
  return Status(StatusCode::kInternal, where + ": its data were not kept while reading");
}

}  // namespace

Result<InferenceBody> SplitInferenceBody(std::string_view body, std::string_view header_length) {
  if (header_length.empty())
    return InferenceBody{.json = body, .binary = {}};
  uint64_t length = 0;
  const auto [end, error] =
      std::from_chars(header_length.data(), header_length.data() + header_length.size(), length);
  if (error != std::errc() || end != header_length.data() + header_length.size()) {
    return InvalidArgument(std::string(kInferenceHeaderContentLength) + " " +
                           Quoted(header_length) + " is not a byte count");
  }
  if (length > body.size()) {
    return InvalidArgument(std::string(kInferenceHeaderContentLength) + " is " +
                           std::to_string(length) + " but the body has only " +
                           std::to_string(body.size()) + " byte(s)");
  }
  return InferenceBody{
      .json = body.substr(0, length), .binary = body.substr(length), .has_binary_header = true};
}

Result<InferenceRequest> ParseInferenceRequest(const InferenceBody& body, const Network& network,
                                               const ParseLimits& limits) {
  if (body.json.empty())
    return InvalidArgument("malformed JSON: the request body is empty");
  RequestDraft draft;
  BACKPLANE_RETURN_IF_ERROR(ReadRequestDraft(body.json, limits.max_json_depth, network, draft));

  if (draft.not_object)
    return InvalidArgument("the request body must be a JSON object, got " + *draft.not_object);
  BACKPLANE_RETURN_IF_ERROR(CheckKeys(draft.unknown_keys, {"id", "parameters", "inputs", "outputs"},
                                      "inference request"));
  if (!draft.repeated_keys.empty())
    return InvalidArgument("inference request: key " + Quoted(draft.repeated_keys.front()) +
                           " is given twice");
  auto binary_output = CheckRequestParameters(draft.parameters);
  if (!binary_output.ok())
    return binary_output.error();
  auto options = CallOptionsOf(draft.parameters);
  if (!options.ok())
    return options.error();

  InferenceRequest request;
  request.options = std::move(options).value();
  if (draft.id) {
    if (!draft.id->is_string())
      return InvalidArgument("'id' must be a string, got " + DumpExcerpt(*draft.id));
    request.id = draft.id->get<std::string>();
  }

  if (!draft.has_inputs || !draft.inputs_is_array)
    return InvalidArgument("'inputs' (an array of tensors) is required");
  std::string expected_names;
  for (const auto& input : network.inputs)
    expected_names += (expected_names.empty() ? "" : ", ") + input.name;

  BinaryCursor binary(body.binary, body.has_binary_header);
  std::map<std::string, Tensor, std::less<>> by_name;
  for (auto& input : draft.inputs) {
    if (input.not_object)
      return InvalidArgument("'inputs' must hold objects, got " + DumpExcerpt(*input.not_object));
    if (!input.name || !input.name->is_string())
      return InvalidArgument("an input has no 'name' (the model takes: " + expected_names + ")");
    const std::string input_name = input.name->get<std::string>();
    const ValueInfo* expected = FindInput(network, input_name);
    if (expected == nullptr) {
      return InvalidArgument("unknown input " + Quoted(input_name) +
                             " (the model takes: " + expected_names + ")");
    }
    if (by_name.contains(input_name))
      return InvalidArgument("input " + Quoted(input_name) + " is given twice");
    auto tensor = FinishInput(input, *expected, input_name, body.json.size(), binary);
    if (!tensor.ok())
      return tensor.error();
    by_name.emplace(input_name, std::move(tensor).value());
  }
  auto ordered = InputsInNetworkOrder(std::move(by_name), network);
  if (!ordered.ok())
    return ordered.error();
  request.inputs = std::move(ordered).value();
  BACKPLANE_RETURN_IF_ERROR(binary.CheckAllTaken());

  if (draft.outputs) {
    const json& outputs = *draft.outputs;
    if (!outputs.is_array())
      return InvalidArgument("'outputs' must be an array of {\"name\": ...} objects");
    std::string known;
    for (const auto& output : network.outputs)
      known += (known.empty() ? "" : ", ") + output.name;
    for (const auto& output : outputs) {
      const auto name = output.is_object() ? output.find("name") : output.end();
      if (!output.is_object() || name == output.end() || !name->is_string()) {
        return InvalidArgument("'outputs' must hold {\"name\": ...} objects, got " +
                               DumpExcerpt(output));
      }
      const std::string where = "requested output " + Quoted(name->get<std::string>());
      std::vector<std::string> unknown;
      for (const auto& [key, value] : output.items()) {
        if (!IsKnown(key, {"name", "parameters"}))
          unknown.push_back(key);
      }
      BACKPLANE_RETURN_IF_ERROR(CheckKeys(unknown, {"name", "parameters"}, where));
      auto binary_data = CheckOutputParameters(output, where);
      if (!binary_data.ok())
        return binary_data.error();
      std::size_t index = network.outputs.size();
      for (std::size_t i = 0; i < network.outputs.size(); ++i) {
        if (network.outputs[i].name == name->get<std::string>())
          index = i;
      }
      if (index == network.outputs.size()) {
        return InvalidArgument("unknown " + where + " (the model's outputs: " + known + ")");
      }
      if (std::find(request.outputs.begin(), request.outputs.end(), index) ==
          request.outputs.end()) {
        request.outputs.push_back(index);
        request.binary_outputs.push_back(binary_data->value_or(*binary_output));
      }
    }
  }
  if (request.outputs.empty()) {
    for (std::size_t i = 0; i < network.outputs.size(); ++i) {
      request.outputs.push_back(i);
      request.binary_outputs.push_back(*binary_output);
    }
  }
  return request;
}

}  // namespace backplane::server
