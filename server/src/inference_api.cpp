#include "inference_api.hpp"

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <type_traits>

namespace backplane::server {
using nlohmann::json;

namespace {

// Products of dimensions are checked against this before any allocation: more elements than
// this cannot have come in a request body anyway.
constexpr int64_t kMaxElements = int64_t{1} << 40;
constexpr std::size_t kMaxRank = 32;

constexpr DataType kDataTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kInt64,
                                   DataType::kInt32,   DataType::kInt8,    DataType::kUint8,
                                   DataType::kBool};

std::string SupportedDataTypes() {
  std::string names;
  for (DataType type : kDataTypes)
    names += (names.empty() ? "" : ", ") + std::string(ToString(type));
  return names;
}

std::string Quote(std::string_view name) {
  return "'" + std::string(name) + "'";
}

// One JSON element into `out` as T, or why not. `where` is "input 'x' element 17".
template <typename T>
Status ConvertElement(const json& value, std::string_view type_name, const std::string& where,
                      T* out) {
  const auto wrong = [&](std::string_view expected) {
    return InvalidArgument(where + " is " + value.dump() + ", expected " + std::string(expected) +
                           " for " + std::string(type_name));
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (!value.is_boolean())
      return wrong("true or false");
    *out = value.get<bool>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!value.is_number())
      return wrong("a number");
    const double number = value.get<double>();
    if (std::isfinite(number) && std::abs(number) > std::numeric_limits<T>::max()) {
      return InvalidArgument(where + " is " + value.dump() + ", out of range for " +
                             std::string(type_name));
    }
    *out = static_cast<T>(number);
  } else {
    if (!value.is_number_integer())
      return wrong("an integer");
    bool in_range;
    if (value.is_number_unsigned()) {
      in_range = value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    } else {
      const int64_t number = value.get<int64_t>();
      in_range = number >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                 static_cast<uint64_t>(std::max<int64_t>(number, 0)) <=
                     static_cast<uint64_t>(std::numeric_limits<T>::max());
    }
    if (!in_range) {
      return InvalidArgument(where + " is " + value.dump() + ", out of range for " +
                             std::string(type_name));
    }
    *out = value.is_number_unsigned() ? static_cast<T>(value.get<uint64_t>())
                                      : static_cast<T>(value.get<int64_t>());
  }
  return Status::Ok();
}

// Collects the scalars of `data` in row-major order. Flat data is a list of scalars; nested
// data must follow `shape` exactly (each level's length equal to its dimension).
Status CollectElements(const json& data, const Shape& shape, std::size_t dim,
                       const std::string& input, std::vector<const json*>& elements) {
  const bool last = dim + 1 >= shape.size();
  if (static_cast<int64_t>(data.size()) != shape[dim]) {
    return InvalidArgument("input " + input + ": nested data has " + std::to_string(data.size()) +
                           " element(s) at depth " + std::to_string(dim) + ", shape " +
                           ToString(shape) + " needs " + std::to_string(shape[dim]));
  }
  for (const auto& element : data) {
    if (last) {
      if (element.is_array() || element.is_object()) {
        return InvalidArgument("input " + input + ": nested data is deeper than shape " +
                               ToString(shape));
      }
      elements.push_back(&element);
    } else {
      if (!element.is_array()) {
        return InvalidArgument("input " + input + ": nested data is shallower than shape " +
                               ToString(shape) + " (a scalar at depth " + std::to_string(dim) +
                               ")");
      }
      BACKPLANE_RETURN_IF_ERROR(CollectElements(element, shape, dim + 1, input, elements));
    }
  }
  return Status::Ok();
}

template <typename T>
Status ConvertAll(const std::vector<const json*>& elements, DataType type, const std::string& input,
                  Tensor& tensor) {
  T* out = static_cast<T*>(tensor.data());
  for (std::size_t i = 0; i < elements.size(); ++i) {
    BACKPLANE_RETURN_IF_ERROR(ConvertElement<T>(
        *elements[i], ToString(type), "input " + input + " element " + std::to_string(i), out + i));
  }
  return Status::Ok();
}

Status ConvertData(const std::vector<const json*>& elements, DataType type,
                   const std::string& input, Tensor& tensor) {
  switch (type) {
    case DataType::kFloat32:
      return ConvertAll<float>(elements, type, input, tensor);
    case DataType::kFloat64:
      return ConvertAll<double>(elements, type, input, tensor);
    case DataType::kInt64:
      return ConvertAll<int64_t>(elements, type, input, tensor);
    case DataType::kInt32:
      return ConvertAll<int32_t>(elements, type, input, tensor);
    case DataType::kInt8:
      return ConvertAll<int8_t>(elements, type, input, tensor);
    case DataType::kUint8:
      return ConvertAll<uint8_t>(elements, type, input, tensor);
    case DataType::kBool: {
      // std::vector<bool>-free: one byte per element, 0 or 1.
      auto* out = static_cast<uint8_t*>(tensor.data());
      for (std::size_t i = 0; i < elements.size(); ++i) {
        bool value = false;
        BACKPLANE_RETURN_IF_ERROR(
            ConvertElement<bool>(*elements[i], ToString(type),
                                 "input " + input + " element " + std::to_string(i), &value));
        out[i] = value ? 1 : 0;
      }
      return Status::Ok();
    }
    case DataType::kUndefined:
      break;
  }
  return InvalidArgument("input " + input + ": datatype not supported");
}

// Rejects the binary tensor data extension, which this server does not implement: silently
// ignoring it would read the wrong bytes.
Status CheckNoBinaryData(const json& object, const std::string& where) {
  const auto parameters = object.find("parameters");
  if (parameters == object.end())
    return Status::Ok();
  if (!parameters->is_object())
    return InvalidArgument(where + ": 'parameters' must be an object");
  for (const char* key : {"binary_data_size", "binary_data", "binary_data_output"}) {
    const auto found = parameters->find(key);
    if (found != parameters->end() && !(found->is_boolean() && !found->get<bool>())) {
      return InvalidArgument(where + ": parameter '" + std::string(key) +
                             "' asks for the binary tensor data extension, which this server "
                             "does not support; send JSON data");
    }
  }
  if (parameters->contains("classification")) {
    return InvalidArgument(where +
                           ": parameter 'classification' (Triton's classification extension) is "
                           "not supported");
  }
  return Status::Ok();
}

Status CheckKeys(const json& object, std::initializer_list<std::string_view> known,
                 const std::string& where) {
  for (const auto& [key, value] : object.items()) {
    bool found = false;
    for (auto name : known)
      found = found || key == name;
    if (!found) {
      std::string list;
      for (auto name : known)
        list += (list.empty() ? "" : ", ") + std::string(name);
      return InvalidArgument(where + ": unknown key '" + key + "' (known: " + list + ")");
    }
  }
  return Status::Ok();
}

Result<Tensor> ParseInput(const json& input, const ValueInfo& expected, const std::string& name) {
  const std::string where = "input " + Quote(name);
  BACKPLANE_RETURN_IF_ERROR(
      CheckKeys(input, {"name", "shape", "datatype", "data", "parameters"}, where));
  BACKPLANE_RETURN_IF_ERROR(CheckNoBinaryData(input, where));

  // Datatype.
  const auto datatype = input.find("datatype");
  if (datatype == input.end() || !datatype->is_string())
    return InvalidArgument(where + ": 'datatype' (a string such as \"FP32\") is required");
  const DataType type = ParseDataType(datatype->get<std::string>());
  if (type == DataType::kUndefined) {
    return InvalidArgument(where + ": datatype '" + datatype->get<std::string>() +
                           "' is not supported (supported: " + SupportedDataTypes() + ")");
  }
  if (type != expected.info.type) {
    return InvalidArgument(where + ": datatype " + std::string(ToString(type)) +
                           " does not match the model's " +
                           std::string(ToString(expected.info.type)));
  }

  // Shape.
  const auto shape_value = input.find("shape");
  if (shape_value == input.end() || !shape_value->is_array())
    return InvalidArgument(where + ": 'shape' (an array of dimensions) is required");
  if (shape_value->size() > kMaxRank)
    return InvalidArgument(where + ": 'shape' has more than " + std::to_string(kMaxRank) + " dims");
  Shape shape;
  int64_t count = 1;
  for (const auto& dim : *shape_value) {
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0 ||
        (dim.is_number_unsigned() && dim.get<uint64_t>() > uint64_t(kMaxElements))) {
      return InvalidArgument(where + ": 'shape' holds " + dim.dump() +
                             ", which is not a dimension (a non-negative integer)");
    }
    shape.push_back(dim.get<int64_t>());
    // Saturate instead of overflowing; the element count check below rejects it.
    count = (shape.back() != 0 && count > kMaxElements / shape.back()) ? kMaxElements + 1
                                                                       : count * shape.back();
  }
  bool shape_matches = shape.size() == expected.info.shape.size();
  for (std::size_t i = 0; shape_matches && i < shape.size(); ++i) {
    shape_matches = expected.info.shape[i] < 0 || expected.info.shape[i] == shape[i];
  }
  if (!shape_matches) {
    return InvalidArgument(where + ": shape " + ToString(shape) + " does not match the model's " +
                           ToString(expected.info.shape) + " (-1: any size)");
  }

  // Data: flat, or nested following the shape.
  const auto data = input.find("data");
  if (data == input.end() || !data->is_array())
    return InvalidArgument(where + ": 'data' (an array) is required");
  std::vector<const json*> elements;
  const bool nested = !data->empty() && (*data)[0].is_array() && !shape.empty();
  if (nested) {
    BACKPLANE_RETURN_IF_ERROR(CollectElements(*data, shape, 0, Quote(name), elements));
  } else {
    if (static_cast<int64_t>(data->size()) != count) {
      return InvalidArgument(where + ": 'data' has " + std::to_string(data->size()) +
                             " element(s), shape " + ToString(shape) + " needs " +
                             (count > kMaxElements ? "too many" : std::to_string(count)));
    }
    elements.reserve(data->size());
    for (const auto& element : *data) {
      if (element.is_array() || element.is_object()) {
        return InvalidArgument(where + ": 'data' mixes arrays and scalars at the top level");
      }
      elements.push_back(&element);
    }
  }
  Tensor tensor(TensorInfo{type, shape});
  BACKPLANE_RETURN_IF_ERROR(ConvertData(elements, type, Quote(name), tensor));
  return tensor;
}

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

}  // namespace

DataType ParseDataType(std::string_view name) {
  for (DataType type : kDataTypes) {
    if (ToString(type) == name)
      return type;
  }
  return DataType::kUndefined;
}

Result<InferenceRequest> ParseInferenceRequest(const json& body, const Network& network) {
  if (!body.is_object())
    return InvalidArgument("the request body must be a JSON object, got " +
                           std::string(body.type_name()));
  BACKPLANE_RETURN_IF_ERROR(
      CheckKeys(body, {"id", "parameters", "inputs", "outputs"}, "inference request"));
  BACKPLANE_RETURN_IF_ERROR(CheckNoBinaryData(body, "inference request"));

  InferenceRequest request;
  if (const auto id = body.find("id"); id != body.end()) {
    if (!id->is_string())
      return InvalidArgument("'id' must be a string, got " + id->dump());
    request.id = id->get<std::string>();
  }

  const auto inputs = body.find("inputs");
  if (inputs == body.end() || !inputs->is_array())
    return InvalidArgument("'inputs' (an array of tensors) is required");
  std::string expected_names;
  for (const auto& input : network.inputs)
    expected_names += (expected_names.empty() ? "" : ", ") + input.name;

  std::map<std::string, Tensor, std::less<>> by_name;
  for (const auto& input : *inputs) {
    if (!input.is_object())
      return InvalidArgument("'inputs' must hold objects, got " + input.dump());
    const auto name = input.find("name");
    if (name == input.end() || !name->is_string())
      return InvalidArgument("an input has no 'name' (the model takes: " + expected_names + ")");
    const std::string input_name = name->get<std::string>();
    const ValueInfo* expected = nullptr;
    for (const auto& candidate : network.inputs) {
      if (candidate.name == input_name)
        expected = &candidate;
    }
    if (expected == nullptr) {
      return InvalidArgument("unknown input " + Quote(input_name) +
                             " (the model takes: " + expected_names + ")");
    }
    if (by_name.contains(input_name))
      return InvalidArgument("input " + Quote(input_name) + " is given twice");
    auto tensor = ParseInput(input, *expected, input_name);
    if (!tensor.ok())
      return tensor.error();
    by_name.emplace(input_name, std::move(tensor).value());
  }
  for (const auto& input : network.inputs) {
    auto it = by_name.find(input.name);
    if (it == by_name.end()) {
      return InvalidArgument(
          "missing input " + Quote(input.name) + " (" + std::string(ToString(input.info.type)) +
          " " + ToString(input.info.shape) + "; the model takes: " + expected_names + ")");
    }
    request.inputs.push_back(std::move(it->second));
  }

  if (const auto outputs = body.find("outputs"); outputs != body.end()) {
    if (!outputs->is_array())
      return InvalidArgument("'outputs' must be an array of {\"name\": ...} objects");
    std::string known;
    for (const auto& output : network.outputs)
      known += (known.empty() ? "" : ", ") + output.name;
    for (const auto& output : *outputs) {
      const auto name = output.is_object() ? output.find("name") : output.end();
      if (!output.is_object() || name == output.end() || !name->is_string()) {
        return InvalidArgument("'outputs' must hold {\"name\": ...} objects, got " + output.dump());
      }
      const std::string where = "requested output " + Quote(name->get<std::string>());
      BACKPLANE_RETURN_IF_ERROR(CheckKeys(output, {"name", "parameters"}, where));
      BACKPLANE_RETURN_IF_ERROR(CheckNoBinaryData(output, where));
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
      }
    }
  }
  if (request.outputs.empty()) {
    for (std::size_t i = 0; i < network.outputs.size(); ++i)
      request.outputs.push_back(i);
  }
  return request;
}

std::string RenderInferenceResponse(std::string_view model, int64_t version,
                                    const InferenceRequest& request, const Network& network,
                                    std::span<const Tensor> outputs) {
  const auto quoted = [](std::string_view text) {
    return json(text).dump(-1, ' ', false, json::error_handler_t::replace);
  };
  std::string out =
      "{\"model_name\":" + quoted(model) + ",\"model_version\":\"" + std::to_string(version) + "\"";
  if (request.id)
    out += ",\"id\":" + quoted(*request.id);
  out += ",\"outputs\":[";
  bool first = true;
  for (std::size_t index : request.outputs) {
    if (index >= outputs.size())
      continue;
    const Tensor& tensor = outputs[index];
    out += first ? "{" : ",{";
    first = false;
    out += "\"name\":" + quoted(network.outputs[index].name);
    out += ",\"datatype\":\"" + std::string(ToString(tensor.info().type)) + "\"";
    out += ",\"shape\":" + json(tensor.info().shape).dump();
    out += ",\"data\":";
    AppendData(out, tensor);
    out += '}';
  }
  out += "]}";
  return out;
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
