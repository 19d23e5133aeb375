#include "serving/inference_request.hpp"

#include "backplane/core/quoted.hpp"

namespace backplane::server {
namespace {

constexpr DataType kDataTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kInt64,
                                   DataType::kInt32,   DataType::kInt8,    DataType::kUint8,
                                   DataType::kBool};

std::string SupportedDataTypes() {
  std::string names;
  for (DataType type : kDataTypes)
    names += (names.empty() ? "" : ", ") + std::string(ToString(type));
  return names;
}

}  // namespace

int64_t SaturatedElementCount(const Shape& shape) {
  return BoundedDimProduct(shape) ? ElementCount(shape) : kMaxRequestElements + 1;
}

Status CheckRank(const std::string& where, std::size_t dims) {
  if (dims <= kMaxRequestRank)
    return Status::Ok();
  return InvalidArgument(where + ": 'shape' has " + std::to_string(dims) + " dims, more than " +
                         std::to_string(kMaxRequestRank));
}

Result<DataType> CheckDataTypeMatches(const std::string& where, std::string_view name,
                                      const ValueInfo& expected) {
  const DataType type = ParseDataType(name);
  if (type == DataType::kUndefined) {
    return InvalidArgument(where + ": datatype " + Quoted(name) +
                           " is not supported (supported: " + SupportedDataTypes() + ")");
  }
  if (type != expected.info.type) {
    return InvalidArgument(where + ": datatype " + std::string(ToString(type)) +
                           " does not match the model's " +
                           std::string(ToString(expected.info.type)));
  }
  return type;
}

Status CheckShapeMatches(const std::string& where, const Shape& shape, const ValueInfo& expected) {
  bool shape_matches = shape.size() == expected.info.shape.size();
  for (std::size_t i = 0; shape_matches && i < shape.size(); ++i)
    shape_matches = expected.info.shape[i] < 0 || expected.info.shape[i] == shape[i];
  if (!shape_matches) {
    return InvalidArgument(where + ": shape " + ToString(shape) + " does not match the model's " +
                           ToString(expected.info.shape) + " (-1: any size)");
  }
  return Status::Ok();
}

Status CheckNoClassification(const std::string& where, bool has_classification) {
  if (!has_classification)
    return Status::Ok();
  return InvalidArgument(where +
                         ": parameter 'classification' (Triton's classification extension) is "
                         "not supported");
}

Result<std::vector<Tensor>> InputsInNetworkOrder(std::map<std::string, Tensor, std::less<>> by_name,
                                                 const Network& network) {
  std::string expected_names;
  for (const auto& input : network.inputs)
    expected_names += (expected_names.empty() ? "" : ", ") + input.name;
  std::vector<Tensor> inputs;
  inputs.reserve(network.inputs.size());
  for (const auto& input : network.inputs) {
    auto it = by_name.find(input.name);
    if (it == by_name.end()) {
      return InvalidArgument(
          "missing input " + Quoted(input.name) + " (" + std::string(ToString(input.info.type)) +
          " " + ToString(input.info.shape) + "; the model takes: " + expected_names + ")");
    }
    inputs.push_back(std::move(it->second));
  }
  return inputs;
}

DataType ParseDataType(std::string_view name) {
  for (DataType type : kDataTypes) {
    if (ToString(type) == name)
      return type;
  }
  return DataType::kUndefined;
}

Result<bool> AddRequestOption(std::string_view name, OptionValue value, CallOptions& options) {
  if (!name.starts_with(kRequestOptionPrefix))
    return false;
  const std::string_view rest = name.substr(kRequestOptionPrefix.size());
  const std::size_t dot = rest.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == rest.size()) {
    return InvalidArgument("request parameter " + Quoted(name) +
                           " must be named options.<backend>.<option>, e.g. "
                           "options.CpuRef.check_finite");
  }
  // The runtime's refusals name backend and key as given: bounded here, so that a hostile name
  // is not echoed back whole.
  if (dot > kMaxQuotedBytes || rest.size() - dot - 1 > kMaxQuotedBytes) {
    return InvalidArgument("request parameter " + Quoted(name) + ": a backend id or option name " +
                           "longer than " + std::to_string(kMaxQuotedBytes) + " bytes");
  }
  options[std::string(rest.substr(0, dot))].insert_or_assign(std::string(rest.substr(dot + 1)),
                                                             std::move(value));
  return true;
}

}  // namespace backplane::server
