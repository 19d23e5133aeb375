// libFuzzer target for the gRPC infer mapping (server/kserve_grpc/grpc_tensors.cpp): bytes decoded
// as a ModelInferRequest, as gRPC hands the service a message, then validated against a network
// and converted to tensors (typed contents or raw_input_contents), and rendered back both ways.
// Any message must give a request or an error naming the input and why, never a crash, a read
// outside a field or a write outside a tensor.
//
// Checked (a difference aborts with both answers on stderr): REST and gRPC agree on the same
// request. A message ParseGrpcInferRequest accepts is rendered as a client would send it over REST
// (a renderer of this file's, independent of the server's), once with every input as binary data
// (the binary tensor data extension, Inference-Header-Content-Length) and once all JSON, then read
// with SplitInferenceBody and ParseInferenceRequest (server/kserve_rest/). The REST reader must
// accept both and give the same id, the same inputs (datatype, shape, bytes) and the same
// requested outputs, none of them binary. What REST cannot say is left out, not compared:
//  - the JSON rendering is skipped when an element has no JSON form (a NaN or infinite float; a
//    raw BOOL byte other than 0 or 1 too, though gRPC refuses those now) or a string is not
//    UTF-8; the binary one carries any bytes;
//  - parameters are rendered with their keys and values, except the binary extension's own keys
//    (binary_data_size, binary_data, binary_data_output), which mean something over REST and
//    nothing over gRPC;
//  - an empty id is gRPC's "no id" and is not sent.
// Refusals are not compared: their messages name each protocol's own fields.
// Seeds: corpus/grpc_request (serialized requests).
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "grpc_service.pb.h"
#include "kserve_grpc/grpc_tensors.hpp"
#include "kserve_rest/kserve_json.hpp"

namespace {

using namespace backplane;
using namespace backplane::server;

// Every datatype, dynamic dimensions, a rank-3 input, as the REST target's network.
const Network& FuzzNetwork() {
  static const Network network = [] {
    Network n;
    n.name = "fuzz";
    n.inputs.push_back({"x", {DataType::kFloat32, {-1, 3}}});
    n.inputs.push_back({"t", {DataType::kInt8, {2, -1, 2}}});
    n.inputs.push_back({"b", {DataType::kBool, {2}}});
    n.inputs.push_back({"i", {DataType::kInt64, {-1}}});
    n.inputs.push_back({"u", {DataType::kUint8, {1}}});
    n.inputs.push_back({"d", {DataType::kFloat64, {1}}});
    n.inputs.push_back({"k", {DataType::kInt32, {1}}});
    n.outputs.push_back({"y", {DataType::kFloat32, {-1}}});
    n.outputs.push_back({"z", {DataType::kBool, {-1}}});
    return n;
  }();
  return network;
}

// A JSON string literal, or nothing when `text` is not UTF-8 (JSON cannot carry it).
std::optional<std::string> JsonString(const std::string& text) {
  try {
    return nlohmann::json(text).dump();
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

// A float as a client's JSON library writes it: the exact double value, always with a fraction
// or an exponent (so that -0.0 stays a float), nothing for NaN and infinities.
std::optional<std::string> JsonFloat(double value) {
  if (!std::isfinite(value))
    return std::nullopt;
  char buffer[64];
  const auto end = std::to_chars(buffer, buffer + sizeof buffer, value).ptr;
  std::string text(buffer, end);
  if (text.find_first_of(".e") == std::string::npos)
    text += ".0";
  return text;
}

// Parameters as a JSON object, less the binary extension's keys; nothing when a key or a string
// value is not UTF-8.
using Parameters = google::protobuf::Map<std::string, inference::InferParameter>;
std::optional<std::string> JsonParameters(const Parameters& parameters) {
  std::string object = "{";
  for (const auto& [key, value] : parameters) {
    if (key == "binary_data_size" || key == "binary_data" || key == "binary_data_output")
      continue;
    auto name = JsonString(key);
    if (!name)
      return std::nullopt;
    std::optional<std::string> text;
    switch (value.parameter_choice_case()) {
      case inference::InferParameter::kBoolParam:
        text = value.bool_param() ? "true" : "false";
        break;
      case inference::InferParameter::kInt64Param:
        text = std::to_string(value.int64_param());
        break;
      case inference::InferParameter::kUint64Param:
        text = std::to_string(value.uint64_param());
        break;
      case inference::InferParameter::kStringParam:
        text = JsonString(value.string_param());
        break;
      case inference::InferParameter::kDoubleParam:
        text = JsonFloat(value.double_param()).value_or("null");
        break;
      case inference::InferParameter::PARAMETER_CHOICE_NOT_SET:
        text = "null";
        break;
    }
    if (!text)
      return std::nullopt;
    object += (object.size() > 1 ? "," : "") + *name + ":" + *text;
  }
  return object + "}";
}

// One input's elements, from the message as the client holds them: raw little-endian bytes, or
// the typed field of its datatype (the only one set, since the message was accepted).
struct Elements {
  std::string json;    // "[...]" flat; empty when some element has no JSON form
  std::string binary;  // little-endian, as the binary extension sends them
};

template <typename T>
void AppendBinary(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

template <typename T>
std::optional<std::string> JsonElement(T value) {
  if constexpr (std::is_same_v<T, bool>)
    return std::string(value ? "true" : "false");
  else if constexpr (std::is_floating_point_v<T>)
    return JsonFloat(static_cast<double>(value));
  else
    return std::to_string(value);
}

// Elements of type T (the datatype's C++ type), read from `count` values by `at`.
template <typename T, typename At>
Elements Render(std::size_t count, At at) {
  Elements out;
  out.json = "[";
  bool expressible = true;
  for (std::size_t i = 0; i < count; ++i) {
    const auto value = at(i);
    if (!value) {
      expressible = false;  // a BOOL byte that is neither 0 nor 1
      out.binary += static_cast<char>(0);
      continue;
    }
    AppendBinary<T>(out.binary, *value);
    const auto text = JsonElement<T>(*value);
    expressible = expressible && text.has_value();
    if (expressible)
      out.json += (i == 0 ? "" : ",") + *text;
  }
  out.json = expressible ? out.json + "]" : "";
  return out;
}

template <typename T>
Elements RenderRaw(const std::string& raw) {
  if constexpr (std::is_same_v<T, bool>) {
    Elements out = Render<bool>(raw.size(), [&](std::size_t i) -> std::optional<bool> {
      const auto byte = static_cast<unsigned char>(raw[i]);
      return byte <= 1 ? std::optional<bool>(byte == 1) : std::nullopt;
    });
    out.binary = raw;  // the bytes as sent, whatever they hold
    return out;
  } else {
    return Render<T>(raw.size() / sizeof(T), [&](std::size_t i) -> std::optional<T> {
      T value;
      std::memcpy(&value, raw.data() + i * sizeof(T), sizeof(T));
      return value;
    });
  }
}

template <typename T, typename Repeated>
Elements RenderTyped(const Repeated& values) {
  return Render<T>(static_cast<std::size_t>(values.size()),
                   [&](std::size_t i) { return std::optional<T>(static_cast<T>(values.Get(i))); });
}

Elements RenderElements(const inference::ModelInferRequest& message, int index, DataType type) {
  const auto& contents = message.inputs(index).contents();
  const bool raw = message.raw_input_contents_size() != 0;
  const std::string* bytes = raw ? &message.raw_input_contents(index) : nullptr;
  switch (type) {
    case DataType::kFloat32:
      return raw ? RenderRaw<float>(*bytes) : RenderTyped<float>(contents.fp32_contents());
    case DataType::kFloat64:
      return raw ? RenderRaw<double>(*bytes) : RenderTyped<double>(contents.fp64_contents());
    case DataType::kInt64:
      return raw ? RenderRaw<int64_t>(*bytes) : RenderTyped<int64_t>(contents.int64_contents());
    case DataType::kInt32:
      return raw ? RenderRaw<int32_t>(*bytes) : RenderTyped<int32_t>(contents.int_contents());
    case DataType::kInt8:
      return raw ? RenderRaw<int8_t>(*bytes) : RenderTyped<int8_t>(contents.int_contents());
    case DataType::kUint8:
      return raw ? RenderRaw<uint8_t>(*bytes) : RenderTyped<uint8_t>(contents.uint_contents());
    case DataType::kBool:
      return raw ? RenderRaw<bool>(*bytes) : RenderTyped<bool>(contents.bool_contents());
    case DataType::kUndefined:
      break;
  }
  std::abort();  // the message was accepted: every input has a datatype Backplane has
}

// A REST infer request: the Inference-Header-Content-Length header's text ("" without it) and
// the body.
struct RestRequest {
  std::string header_length;
  std::string body;
};

// The message as a REST request, every input binary or every input JSON; nothing when JSON is
// asked and cannot say it.
std::optional<RestRequest> RenderRest(const inference::ModelInferRequest& message, bool binary) {
  std::string json = "{";
  if (!message.id().empty()) {
    auto id = JsonString(message.id());
    if (!id)
      return std::nullopt;
    json += "\"id\":" + *id + ",";
  }
  if (!message.parameters().empty()) {
    auto parameters = JsonParameters(message.parameters());
    if (!parameters)
      return std::nullopt;
    json += "\"parameters\":" + *parameters + ",";
  }
  std::string data;
  json += "\"inputs\":[";
  for (int i = 0; i < message.inputs_size(); ++i) {
    const auto& input = message.inputs(i);
    auto name = JsonString(input.name());
    auto datatype = JsonString(input.datatype());
    auto parameters = JsonParameters(input.parameters());
    if (!name || !datatype || !parameters)
      return std::nullopt;
    json += std::string(i == 0 ? "" : ",") + "{\"name\":" + *name + ",\"datatype\":" + *datatype +
            ",\"shape\":[";
    for (int d = 0; d < input.shape_size(); ++d)
      json += (d == 0 ? "" : ",") + std::to_string(input.shape(d));
    json += "]";
    // The datatype the message was accepted with (the input's name found it in the network).
    DataType type = DataType::kUndefined;
    for (const auto& expected : FuzzNetwork().inputs) {
      if (expected.name == input.name())
        type = expected.info.type;
    }
    const Elements elements = RenderElements(message, i, type);
    if (binary) {
      std::string with_size = *parameters;
      with_size.insert(with_size.size() - 1,
                       std::string(with_size.size() > 2 ? "," : "") +
                           "\"binary_data_size\":" + std::to_string(elements.binary.size()));
      json += ",\"parameters\":" + with_size + "}";
      data += elements.binary;
    } else {
      if (elements.json.empty())
        return std::nullopt;
      json += ",\"parameters\":" + *parameters + ",\"data\":" + elements.json + "}";
    }
  }
  json += "]";
  if (message.outputs_size() != 0) {
    json += ",\"outputs\":[";
    for (int i = 0; i < message.outputs_size(); ++i) {
      const auto& output = message.outputs(i);
      auto name = JsonString(output.name());
      auto parameters = JsonParameters(output.parameters());
      if (!name || !parameters)
        return std::nullopt;
      json += std::string(i == 0 ? "" : ",") + "{\"name\":" + *name +
              ",\"parameters\":" + *parameters + "}";
    }
    json += "]";
  }
  json += "}";
  if (!binary)
    return RestRequest{"", json};
  return RestRequest{std::to_string(json.size()), json + data};
}

[[noreturn]] void Differ(const std::string& what, const RestRequest& rest) {
  std::fprintf(stderr,
               "grpc_request_fuzz: REST and gRPC differ on the same request: %s\n"
               "REST request (Inference-Header-Content-Length: '%s'):\n%s\n",
               what.c_str(), rest.header_length.c_str(), rest.body.c_str());
  std::abort();
}

void CompareWithRest(const inference::ModelInferRequest& message, const InferenceRequest& grpc,
                     bool binary) {
  const auto rest = RenderRest(message, binary);
  if (!rest)
    return;
  auto split = SplitInferenceBody(rest->body, rest->header_length);
  if (!split.ok())
    Differ("REST cannot split the body: " + split.error().ToString(), *rest);
  auto parsed = ParseInferenceRequest(*split, FuzzNetwork(), ParseLimits{});
  if (!parsed.ok())
    Differ("gRPC accepts it, REST refuses it: " + parsed.error().ToString(), *rest);
  if (parsed->id != grpc.id)
    Differ("the id", *rest);
  if (parsed->inputs.size() != grpc.inputs.size())
    Differ("the number of inputs", *rest);
  for (std::size_t i = 0; i < grpc.inputs.size(); ++i) {
    const Tensor& a = grpc.inputs[i];
    const Tensor& b = parsed->inputs[i];
    const std::string name = FuzzNetwork().inputs[i].name;
    if (a.info() != b.info())
      Differ("input '" + name + "': gRPC " + std::string(ToString(a.info().type)) +
                 ToString(a.info().shape) + ", REST " + std::string(ToString(b.info().type)) +
                 ToString(b.info().shape),
             *rest);
    if (a.bytes().size() != b.bytes().size() ||
        (!a.bytes().empty() && std::memcmp(a.data(), b.data(), a.bytes().size()) != 0))
      Differ("input '" + name + "': its bytes", *rest);
  }
  if (parsed->outputs != grpc.outputs)
    Differ("the requested outputs", *rest);
  for (const bool output_binary : parsed->binary_outputs) {
    if (output_binary)
      Differ("REST answers an output binary that nothing asked binary", *rest);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  inference::ModelInferRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size)))
    return 0;  // gRPC refuses a message protobuf cannot decode before the service sees it
  auto parsed = ParseGrpcInferRequest(request, FuzzNetwork());
  if (!parsed.ok()) {
    volatile std::size_t sink = parsed.error().message().size();
    (void)sink;
    return 0;
  }
  CompareWithRest(request, *parsed, /*binary=*/true);
  CompareWithRest(request, *parsed, /*binary=*/false);

  std::vector<Tensor> outputs;
  outputs.push_back(std::move(parsed->inputs[0]));
  outputs.push_back(std::move(parsed->inputs[2]));
  for (const bool raw : {false, true}) {
    inference::ModelInferResponse response;
    RenderGrpcInferResponse("fuzz", 1, *parsed, FuzzNetwork(), outputs, raw, response);
    volatile std::size_t sink = response.ByteSizeLong();
    (void)sink;
  }
  return 0;
}
