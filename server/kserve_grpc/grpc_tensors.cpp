#include "kserve_grpc/grpc_tensors.hpp"

#include "backplane/core/quoted.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>

namespace backplane::server {
namespace {

std::string Names(const std::vector<ValueInfo>& values) {
  std::string names;
  for (const auto& value : values)
    names += (names.empty() ? "" : ", ") + value.name;
  return names;
}

// The typed field a datatype travels in, for messages.
std::string_view ContentsField(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "fp32_contents";
    case DataType::kFloat64:
      return "fp64_contents";
    case DataType::kInt64:
      return "int64_contents";
    case DataType::kInt32:
    case DataType::kInt8:
      return "int_contents";
    case DataType::kUint8:
      return "uint_contents";
    case DataType::kBool:
      return "bool_contents";
    case DataType::kUndefined:
      break;
  }
  return "?";
}

// Copies `values` into `out` as T, range-checked when T is narrower.
template <typename T, typename Repeated>
Status CopyElements(const Repeated& values, std::span<T> out, const std::string& where) {
  for (int i = 0; i < values.size(); ++i) {
    const auto value = values.Get(i);
    if constexpr (!std::is_same_v<T, std::decay_t<decltype(value)>>) {
      if (value < std::numeric_limits<T>::min() || value > std::numeric_limits<T>::max()) {
        return InvalidArgument(where + " element " + std::to_string(i) + " is " +
                               std::to_string(value) + ", out of range for its datatype");
      }
    }
    out[static_cast<std::size_t>(i)] = static_cast<T>(value);
  }
  return Status::Ok();
}

// Whether `contents` holds exactly `info`'s elements in the field of its datatype, and nothing in
// any other. Checked before the tensor is allocated: the shape alone, a few bytes of the message,
// may ask for terabytes.
Status CheckContents(const inference::InferTensorContents& contents, const TensorInfo& info,
                     const std::string& where) {
  const DataType type = info.type;
  const int64_t count = info.ElementCount();
  // Exactly one field may hold data, the datatype's own.
  const std::pair<std::string_view, int> fields[] = {
      {"bool_contents", contents.bool_contents_size()},
      {"int_contents", contents.int_contents_size()},
      {"int64_contents", contents.int64_contents_size()},
      {"uint_contents", contents.uint_contents_size()},
      {"uint64_contents", contents.uint64_contents_size()},
      {"fp32_contents", contents.fp32_contents_size()},
      {"fp64_contents", contents.fp64_contents_size()},
      {"bytes_contents", contents.bytes_contents_size()}};
  const std::string_view expected = ContentsField(type);
  for (const auto& [field, size] : fields) {
    if (size != 0 && field != expected) {
      return InvalidArgument(where + ": contents in " + std::string(field) + ", but datatype " +
                             std::string(ToString(type)) + " travels in " + std::string(expected));
    }
  }
  int64_t given = 0;
  for (const auto& [field, size] : fields)
    given += field == expected ? size : 0;
  if (given != count) {
    return InvalidArgument(where + ": " + std::string(expected) + " has " + std::to_string(given) +
                           " element(s), shape " + ToString(info.shape) + " needs " +
                           std::to_string(count));
  }
  return Status::Ok();
}

// The typed contents of `input` into `tensor`, whose type and element count CheckContents has
// checked them against.
Status CopyContents(const inference::InferTensorContents& contents, Tensor& tensor,
                    const std::string& where) {
  const DataType type = tensor.info().type;
  switch (type) {
    case DataType::kFloat32:
      return CopyElements(contents.fp32_contents(), tensor.Elements<float>(), where);
    case DataType::kFloat64:
      return CopyElements(contents.fp64_contents(), tensor.Elements<double>(), where);
    case DataType::kInt64:
      return CopyElements(contents.int64_contents(), tensor.Elements<int64_t>(), where);
    case DataType::kInt32:
      return CopyElements(contents.int_contents(), tensor.Elements<int32_t>(), where);
    case DataType::kInt8:
      return CopyElements(contents.int_contents(), tensor.Elements<int8_t>(), where);
    case DataType::kUint8:
      return CopyElements(contents.uint_contents(), tensor.Elements<uint8_t>(), where);
    case DataType::kBool:
      return CopyElements(contents.bool_contents(), tensor.Elements<bool>(), where);
    case DataType::kUndefined:
      break;
  }
  return InvalidArgument(where + ": datatype not supported");
}

Result<Tensor> ParseInput(const inference::ModelInferRequest::InferInputTensor& input,
                          const ValueInfo& expected, const std::string* raw) {
  const std::string where = "input " + Quoted(input.name());
  auto checked = CheckDataTypeMatches(where, input.datatype(), expected);
  if (!checked.ok())
    return checked.error();
  const DataType type = checked.value();
  BACKPLANE_RETURN_IF_ERROR(CheckRank(where, static_cast<std::size_t>(input.shape_size())));
  Shape shape;
  for (const int64_t dim : input.shape()) {
    if (dim < 0 || dim > kMaxRequestElements) {
      return InvalidArgument(where + ": 'shape' holds " + std::to_string(dim) +
                             ", which is not a dimension (a non-negative integer)");
    }
    shape.push_back(dim);
  }
  BACKPLANE_RETURN_IF_ERROR(CheckShapeMatches(where, shape, expected));
  const int64_t count = SaturatedElementCount(shape);
  if (count > kMaxRequestElements)
    return InvalidArgument(where + ": shape " + ToString(shape) + " has too many elements");
  if (raw != nullptr) {
    if (input.has_contents() && input.contents().ByteSizeLong() != 0) {
      return InvalidArgument(where + ": has both contents and raw_input_contents; send one");
    }
    const std::size_t needed = static_cast<std::size_t>(count) * ElementSize(type);
    if (raw->size() != needed) {
      return InvalidArgument(where + ": raw_input_contents holds " + std::to_string(raw->size()) +
                             " bytes, shape " + ToString(shape) + " of " +
                             std::string(ToString(type)) + " needs " + std::to_string(needed));
    }
    // Little-endian on the wire, as on every host this builds for (x86-64, aarch64).
    std::vector<std::byte> bytes(needed);
    if (needed != 0)
      std::memcpy(bytes.data(), raw->data(), needed);
    // Trap: a bool whose byte is neither 0 nor 1 is undefined behaviour wherever a backend or the
    // response reads it as bool. REST's binary data is refused alike, with the same message.
    if (type == DataType::kBool) {
      for (const std::byte flag : bytes) {
        if (flag != std::byte{0} && flag != std::byte{1})
          return InvalidArgument(where + ": BOOL binary data holds a byte other than 0 or 1");
      }
    }
    return Tensor(TensorInfo{type, shape}, std::move(bytes));
  }
  BACKPLANE_RETURN_IF_ERROR(CheckContents(input.contents(), TensorInfo{type, shape}, where));
  Tensor tensor(TensorInfo{type, shape});
  BACKPLANE_RETURN_IF_ERROR(CopyContents(input.contents(), tensor, where));
  return tensor;
}

template <typename T, typename Repeated>
void AppendElements(const Tensor& tensor, Repeated* out) {
  const auto elements = tensor.Elements<T>();
  out->Reserve(static_cast<int>(elements.size()));
  for (const T value : elements)
    out->Add(value);
}

void FillContents(const Tensor& tensor, inference::InferTensorContents& contents) {
  switch (tensor.info().type) {
    case DataType::kFloat32:
      return AppendElements<float>(tensor, contents.mutable_fp32_contents());
    case DataType::kFloat64:
      return AppendElements<double>(tensor, contents.mutable_fp64_contents());
    case DataType::kInt64:
      return AppendElements<int64_t>(tensor, contents.mutable_int64_contents());
    case DataType::kInt32:
      return AppendElements<int32_t>(tensor, contents.mutable_int_contents());
    case DataType::kInt8:
      return AppendElements<int8_t>(tensor, contents.mutable_int_contents());
    case DataType::kUint8:
      return AppendElements<uint8_t>(tensor, contents.mutable_uint_contents());
    case DataType::kBool:
      return AppendElements<bool>(tensor, contents.mutable_bool_contents());
    case DataType::kUndefined:
      return;
  }
}

// The request's per-call backend options: its parameters named options.<BackendId>.<key>
// (AddRequestOption), by the parameter's kind. An int64 is taken for a double option too by the
// runtime; a uint64 beyond int64 and an unset parameter are refused.
Result<CallOptions> CallOptionsOf(
    const google::protobuf::Map<std::string, inference::InferParameter>& parameters) {
  CallOptions options;
  for (const auto& [name, parameter] : parameters) {
    if (!std::string_view(name).starts_with(kRequestOptionPrefix))
      continue;
    OptionValue value;
    switch (parameter.parameter_choice_case()) {
      case inference::InferParameter::kBoolParam:
        value = parameter.bool_param();
        break;
      case inference::InferParameter::kInt64Param:
        value = parameter.int64_param();
        break;
      case inference::InferParameter::kDoubleParam:
        value = parameter.double_param();
        break;
      case inference::InferParameter::kStringParam:
        value = parameter.string_param();
        break;
      case inference::InferParameter::kUint64Param:
        if (parameter.uint64_param() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return InvalidArgument("inference request: parameter " + Quoted(name) +
                                 " is beyond int64, got " +
                                 std::to_string(parameter.uint64_param()));
        }
        value = static_cast<int64_t>(parameter.uint64_param());
        break;
      default:
        return InvalidArgument("inference request: parameter " + Quoted(name) + " has no value");
    }
    auto added = AddRequestOption(name, std::move(value), options);
    if (!added.ok())
      return added.error().WithContext("inference request: ");
  }
  return options;
}

}  // namespace

Result<InferenceRequest> ParseGrpcInferRequest(const inference::ModelInferRequest& message,
                                               const Network& network) {
  const bool raw = message.raw_input_contents_size() != 0;
  if (raw && message.raw_input_contents_size() != message.inputs_size()) {
    return InvalidArgument("raw_input_contents has " +
                           std::to_string(message.raw_input_contents_size()) + " entries for " +
                           std::to_string(message.inputs_size()) +
                           " input(s): send one per input, in order");
  }
  BACKPLANE_RETURN_IF_ERROR(
      CheckNoClassification("inference request", message.parameters().contains("classification")));
  const std::string expected_names = Names(network.inputs);
  std::map<std::string, Tensor, std::less<>> by_name;
  for (int i = 0; i < message.inputs_size(); ++i) {
    const auto& input = message.inputs(i);
    if (input.name().empty())
      return InvalidArgument("an input has no name (the model takes: " + expected_names + ")");
    BACKPLANE_RETURN_IF_ERROR(CheckNoClassification("input " + Quoted(input.name()),
                                                    input.parameters().contains("classification")));
    const auto expected = std::find_if(network.inputs.begin(), network.inputs.end(),
                                       [&](const ValueInfo& v) { return v.name == input.name(); });
    if (expected == network.inputs.end()) {
      return InvalidArgument("unknown input " + Quoted(input.name()) +
                             " (the model takes: " + expected_names + ")");
    }
    if (by_name.contains(input.name()))
      return InvalidArgument("input " + Quoted(input.name()) + " is given twice");
    auto tensor = ParseInput(input, *expected, raw ? &message.raw_input_contents(i) : nullptr);
    if (!tensor.ok())
      return tensor.error();
    by_name.emplace(input.name(), std::move(tensor).value());
  }
  InferenceRequest request;
  if (!message.id().empty())
    request.id = message.id();
  auto options = CallOptionsOf(message.parameters());
  if (!options.ok())
    return options.error();
  request.options = std::move(options).value();
  auto ordered = InputsInNetworkOrder(std::move(by_name), network);
  if (!ordered.ok())
    return ordered.error();
  request.inputs = std::move(ordered).value();
  for (const auto& output : message.outputs()) {
    const auto found = std::find_if(network.outputs.begin(), network.outputs.end(),
                                    [&](const ValueInfo& v) { return v.name == output.name(); });
    if (found == network.outputs.end()) {
      return InvalidArgument("unknown requested output " + Quoted(output.name()) +
                             " (the model's outputs: " + Names(network.outputs) + ")");
    }
    BACKPLANE_RETURN_IF_ERROR(
        CheckNoClassification("requested output " + Quoted(output.name()),
                              output.parameters().contains("classification")));
    const auto index = static_cast<std::size_t>(found - network.outputs.begin());
    if (std::find(request.outputs.begin(), request.outputs.end(), index) == request.outputs.end())
      request.outputs.push_back(index);
  }
  if (request.outputs.empty()) {
    for (std::size_t i = 0; i < network.outputs.size(); ++i)
      request.outputs.push_back(i);
  }
  return request;
}

void RenderGrpcInferResponse(std::string_view model, int64_t version,
                             const InferenceRequest& request, const Network& network,
                             std::span<const Tensor> outputs, bool raw,
                             inference::ModelInferResponse& response) {
  response.set_model_name(std::string(model));
  response.set_model_version(std::to_string(version));
  if (request.id)
    response.set_id(*request.id);
  for (const std::size_t index : request.outputs) {
    if (index >= outputs.size())
      continue;
    const Tensor& tensor = outputs[index];
    auto& output = *response.add_outputs();
    output.set_name(network.outputs[index].name);
    output.set_datatype(std::string(ToString(tensor.info().type)));
    for (const int64_t dim : tensor.info().shape)
      output.add_shape(dim);
    if (raw) {
      response.add_raw_output_contents(reinterpret_cast<const char*>(tensor.bytes().data()),
                                       tensor.bytes().size());
    } else {
      FillContents(tensor, *output.mutable_contents());
    }
  }
}

}  // namespace backplane::server
