// The KServe v2 REST response: JSON text written by hand (shortest exact numbers), and the binary
// tensor data extension's raw bytes after it.
#include <charconv>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kserve_rest/kserve_json.hpp"

namespace backplane::server {
using nlohmann::json;

namespace {

// Appends `value` in its shortest round-trip form, or null when JSON cannot express it.
template <typename T>
void AppendNumber(std::string& out, T value) {
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(value)) {
      out += "null";
      return;
    }
  }
  char buffer[64];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, error == std::errc() ? end : buffer);
}

// The longest JSON text of one element and its comma: "-1.17549435e-38," for FP32.
std::size_t MaxCharsPerElement(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return 16;
    case DataType::kFloat64:
      return 25;
    case DataType::kInt64:
      return 21;
    case DataType::kInt32:
      return 12;
    case DataType::kInt8:
      return 5;
    case DataType::kUint8:
      return 4;
    case DataType::kBool:
      return 6;
    case DataType::kUndefined:
      break;
  }
  return 0;
}

template <typename T>
void AppendElements(std::string& out, const Tensor& tensor) {
  const auto count = static_cast<std::size_t>(tensor.info().ElementCount());
  const auto* data = static_cast<const T*>(tensor.data());
  for (std::size_t i = 0; i < count; ++i) {
    if (i > 0)
      out += ',';
    AppendNumber(out, data[i]);
  }
}

void AppendData(std::string& out, const Tensor& tensor) {
  out += '[';
  switch (tensor.info().type) {
    case DataType::kFloat32:
      AppendElements<float>(out, tensor);
      break;
    case DataType::kFloat64:
      AppendElements<double>(out, tensor);
      break;
    case DataType::kInt64:
      AppendElements<int64_t>(out, tensor);
      break;
    case DataType::kInt32:
      AppendElements<int32_t>(out, tensor);
      break;
    case DataType::kInt8:
      AppendElements<int8_t>(out, tensor);
      break;
    case DataType::kUint8:
      AppendElements<uint8_t>(out, tensor);
      break;
    case DataType::kBool: {
      const auto bytes = tensor.bytes();
      for (std::size_t i = 0; i < bytes.size(); ++i)
        out += (i > 0 ? "," : "") + std::string(bytes[i] != std::byte{0} ? "true" : "false");
      break;
    }
    case DataType::kUndefined:
      break;
  }
  out += ']';
}

json TensorMetadata(const ValueInfo& value) {
  return {
      {"name", value.name}, {"datatype", ToString(value.info.type)}, {"shape", value.info.shape}};
}

RenderedInferenceResponse Render(std::string_view model, int64_t version,
                                 const InferenceRequest& request, const Network& network,
                                 std::span<const Tensor> outputs, bool honour_binary) {
  const auto quoted = [](std::string_view text) {
    return json(text).dump(-1, ' ', false, json::error_handler_t::replace);
  };
  RenderedInferenceResponse rendered;
  std::string& out = rendered.body;
  // Reserved for the longest text the outputs can take, so the string never grows by doubling
  // (which held the old and the new buffer at once: 1.5x a large response at its peak). Pages
  // reserved and never written are not resident.
  std::size_t most = 256 + model.size() + (request.id ? request.id->size() * 6 : 0);
  for (std::size_t i = 0; i < request.outputs.size(); ++i) {
    if (request.outputs[i] >= outputs.size())
      continue;
    const Tensor& tensor = outputs[request.outputs[i]];
    most += 256 + network.outputs[request.outputs[i]].name.size() * 6 +
            tensor.info().shape.size() * 21 +
            static_cast<std::size_t>(tensor.info().ElementCount()) *
                MaxCharsPerElement(tensor.info().type) +
            tensor.bytes().size();
  }
  out.reserve(most);
  out =
      "{\"model_name\":" + quoted(model) + ",\"model_version\":\"" + std::to_string(version) + "\"";
  if (request.id)
    out += ",\"id\":" + quoted(*request.id);
  out += ",\"outputs\":[";
  bool first = true;
  std::vector<const Tensor*> binary;
  for (std::size_t i = 0; i < request.outputs.size(); ++i) {
    const std::size_t index = request.outputs[i];
    if (index >= outputs.size())
      continue;
    const Tensor& tensor = outputs[index];
    out += first ? "{" : ",{";
    first = false;
    out += "\"name\":" + quoted(network.outputs[index].name);
    out += ",\"datatype\":\"" + std::string(ToString(tensor.info().type)) + "\"";
    out += ",\"shape\":" + json(tensor.info().shape).dump();
    if (honour_binary && i < request.binary_outputs.size() && request.binary_outputs[i]) {
      out += ",\"parameters\":{\"binary_data_size\":" + std::to_string(tensor.bytes().size()) + "}";
      binary.push_back(&tensor);
    } else {
      out += ",\"data\":";
      AppendData(out, tensor);
    }
    out += '}';
  }
  out += "]}";
  rendered.json_length = out.size();
  rendered.has_binary = !binary.empty();
  // Little-endian, as the extension wants and every host this builds for is; BOOL is already
  // one byte per element, 0 or 1.
  for (const Tensor* tensor : binary)
    out.append(reinterpret_cast<const char*>(tensor->bytes().data()), tensor->bytes().size());
  return rendered;
}

}  // namespace

RenderedInferenceResponse RenderInferenceResponseWithBinary(std::string_view model, int64_t version,
                                                            const InferenceRequest& request,
                                                            const Network& network,
                                                            std::span<const Tensor> outputs) {
  return Render(model, version, request, network, outputs, /*honour_binary=*/true);
}

std::string RenderInferenceResponse(std::string_view model, int64_t version,
                                    const InferenceRequest& request, const Network& network,
                                    std::span<const Tensor> outputs) {
  return Render(model, version, request, network, outputs, /*honour_binary=*/false).body;
}

json RenderModelMetadata(std::string_view model, std::span<const int64_t> versions,
                         const Network& network) {
  json version_names = json::array();
  for (int64_t version : versions)
    version_names.push_back(std::to_string(version));
  json inputs = json::array();
  for (const auto& input : network.inputs)
    inputs.push_back(TensorMetadata(input));
  json outputs = json::array();
  for (const auto& output : network.outputs)
    outputs.push_back(TensorMetadata(output));
  return {{"name", model},
          {"versions", version_names},
          {"platform", "onnx"},
          {"inputs", inputs},
          {"outputs", outputs}};
}

}  // namespace backplane::server