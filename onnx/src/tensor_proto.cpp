// ONNX TensorProto <-> Tensor, and the TensorProto files of ONNX test data.
#include <bit>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "onnx_tensor.hpp"

namespace backplane {
namespace {

// raw_data is little-endian by the ONNX spec; copying it as-is is only right on such a host.
static_assert(std::endian::native == std::endian::little, "TensorProto raw_data is little-endian");

bool ToDataType(int32_t onnx_type, DataType* type) {
  switch (onnx_type) {
    case onnx::TensorProto::FLOAT:
    case onnx::TensorProto::UINT8:
    case onnx::TensorProto::INT8:
    case onnx::TensorProto::INT32:
    case onnx::TensorProto::INT64:
    case onnx::TensorProto::BOOL:
    case onnx::TensorProto::DOUBLE:
      *type = static_cast<DataType>(onnx_type);  // DataType uses ONNX's numbering
      return true;
    default:
      return false;
  }
}

std::string OnnxTypeName(int32_t onnx_type) {
  if (onnx::TensorProto::DataType_IsValid(onnx_type))
    return onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(onnx_type));
  return "data type " + std::to_string(onnx_type);
}

// Copies a typed repeated field into `out`, converting each element to T.
template <typename T, typename Field>
Status CopyTyped(const Field& field, int64_t count, std::string_view what,
                 std::string_view field_name, std::vector<std::byte>* out) {
  if (static_cast<int64_t>(field.size()) != count)
    return InvalidArgument(std::string(what) + " has " + std::to_string(field.size()) + " " +
                           std::string(field_name) + " values for " + std::to_string(count) +
                           " elements");
  out->resize(static_cast<std::size_t>(count) * sizeof(T));
  for (int64_t i = 0; i < count; ++i) {
    const auto stored = field.Get(static_cast<int>(i));
    // INT8 and UINT8 arrive widened in int32_data: a value outside T would wrap silently (a
    // zero point of 300 would become 44).
    if constexpr (std::is_integral_v<T> && sizeof(T) == 1) {
      if (stored < std::numeric_limits<T>::min() || stored > std::numeric_limits<T>::max())
        return InvalidArgument(std::string(what) + " holds " + std::to_string(stored) + " at " +
                               std::to_string(i) + ", outside the range of its data type");
    }
    T value = static_cast<T>(stored);
    std::memcpy(out->data() + i * sizeof(T), &value, sizeof(T));
  }
  return Status::Ok();
}

}  // namespace

Result<Tensor> TensorFromProto(const onnx::TensorProto& proto, std::string_view what) {
  const std::string name(what);
  if (proto.data_location() == onnx::TensorProto::EXTERNAL || proto.external_data_size() > 0)
    return Unimplemented(name + " uses external data, which is not supported");
  if (proto.has_segment())
    return Unimplemented(name + " is segmented, which is not supported");
  TensorInfo info;
  if (!ToDataType(proto.data_type(), &info.type))
    return Unimplemented(name + " has unsupported data type " + OnnxTypeName(proto.data_type()));
  info.shape.assign(proto.dims().begin(), proto.dims().end());
  // Before anything is sized by it: the declared dims against the data below, and the byte size,
  // are only meaningful for a count that did not wrap.
  auto count = CheckedElementCount(info.shape, name);
  if (!count.ok())
    return count.error();
  const std::size_t byte_size = static_cast<std::size_t>(*count) * ElementSize(info.type);

  std::vector<std::byte> data;
  if (proto.has_raw_data()) {
    if (proto.raw_data().size() != byte_size)
      return InvalidArgument(name + " has " + std::to_string(proto.raw_data().size()) +
                             " bytes of raw_data, expected " + std::to_string(byte_size) +
                             " for shape " + ToString(info.shape) + " " +
                             std::string(ToString(info.type)));
    data.resize(byte_size);
    if (byte_size > 0)
      std::memcpy(data.data(), proto.raw_data().data(), byte_size);
    return Tensor(std::move(info), std::move(data));
  }
  Status status;
  switch (info.type) {
    case DataType::kFloat32:
      status = CopyTyped<float>(proto.float_data(), *count, what, "float_data", &data);
      break;
    case DataType::kInt64:
      status = CopyTyped<int64_t>(proto.int64_data(), *count, what, "int64_data", &data);
      break;
    case DataType::kFloat64:
      status = CopyTyped<double>(proto.double_data(), *count, what, "double_data", &data);
      break;
    case DataType::kInt32:
      status = CopyTyped<int32_t>(proto.int32_data(), *count, what, "int32_data", &data);
      break;
    case DataType::kInt8:
      status = CopyTyped<int8_t>(proto.int32_data(), *count, what, "int32_data", &data);
      break;
    case DataType::kUint8:
    case DataType::kBool:
      status = CopyTyped<uint8_t>(proto.int32_data(), *count, what, "int32_data", &data);
      break;
    case DataType::kUndefined:
      return Internal(name + ": undefined data type after conversion");
  }
  if (!status.ok())
    return status;
  return Tensor(std::move(info), std::move(data));
}

Result<onnx::TensorProto> TensorToProto(const Tensor& tensor, std::string_view name) {
  const TensorInfo& info = tensor.info();
  if (info.type == DataType::kUndefined)
    return InvalidArgument("tensor '" + std::string(name) + "' has no data type");
  for (int64_t dim : info.shape) {
    if (dim < 0)
      return InvalidArgument("tensor '" + std::string(name) + "' has a dynamic shape " +
                             ToString(info.shape));
  }
  auto byte_size = CheckedByteSize(info, "tensor '" + std::string(name) + "'");
  if (!byte_size.ok())
    return byte_size.error();
  if (tensor.bytes().size() != *byte_size)
    return InvalidArgument("tensor '" + std::string(name) + "' holds " +
                           std::to_string(tensor.bytes().size()) + " bytes, its shape " +
                           ToString(info.shape) + " needs " + std::to_string(*byte_size));
  onnx::TensorProto proto;
  proto.set_name(std::string(name));
  proto.set_data_type(static_cast<int32_t>(info.type));
  for (int64_t dim : info.shape)
    proto.add_dims(dim);
  proto.set_raw_data(tensor.bytes().data(), tensor.bytes().size());
  return proto;
}

Result<Tensor> ReadTensorProtoFile(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file)
    return NotFound("cannot open tensor file " + path.string());
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad())
    return InvalidArgument("cannot read tensor file " + path.string());
  const std::string bytes = std::move(contents).str();
  onnx::TensorProto proto;
  if (bytes.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !proto.ParseFromString(bytes))
    return InvalidArgument(path.string() +
                           " is not a valid ONNX TensorProto (protobuf parse failed)");
  return TensorFromProto(proto, "tensor file " + path.string());
}

Status WriteTensorProtoFile(const std::filesystem::path& path, const Tensor& tensor,
                            std::string_view name) {
  auto proto = TensorToProto(tensor, name);
  if (!proto.ok())
    return proto.error();
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file)
    return NotFound("cannot create tensor file " + path.string());
  if (!proto->SerializeToOstream(&file) || !file.flush())
    return Internal("cannot write tensor file " + path.string());
  return Status::Ok();
}

}  // namespace backplane
