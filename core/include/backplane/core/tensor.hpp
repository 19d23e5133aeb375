// Tensor descriptions and non-owning views, shared by the host and backends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace backplane {

// Element types, numbered as ONNX's TensorProto.DataType so that import is a cast.
enum class DataType : int32_t {
  kUndefined = 0,
  kFloat32 = 1,
  kUint8 = 2,
  kInt8 = 3,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 9,
  kFloat64 = 11,
};

constexpr std::size_t ElementSize(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return 4;
    case DataType::kUint8:
      return 1;
    case DataType::kInt8:
      return 1;
    case DataType::kInt32:
      return 4;
    case DataType::kInt64:
      return 8;
    case DataType::kBool:
      return 1;
    case DataType::kFloat64:
      return 8;
    case DataType::kUndefined:
      return 0;
  }
  return 0;
}

constexpr std::string_view ToString(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "FP32";
    case DataType::kUint8:
      return "UINT8";
    case DataType::kInt8:
      return "INT8";
    case DataType::kInt32:
      return "INT32";
    case DataType::kInt64:
      return "INT64";
    case DataType::kBool:
      return "BOOL";
    case DataType::kFloat64:
      return "FP64";
    case DataType::kUndefined:
      return "UNDEFINED";
  }
  return "UNDEFINED";
}

// Dimensions, outermost first. A negative dimension is unknown until a request fixes it.
using Shape = std::vector<int64_t>;

inline int64_t ElementCount(const Shape& shape) {
  int64_t count = 1;
  for (int64_t dim : shape)
    count *= dim;
  return count;
}

inline std::string ToString(const Shape& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      text += ",";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

struct TensorInfo {
  DataType type = DataType::kUndefined;
  Shape shape;

  int64_t ElementCount() const { return backplane::ElementCount(shape); }
  std::size_t ByteSize() const {
    return static_cast<std::size_t>(ElementCount()) * ElementSize(type);
  }
  friend bool operator==(const TensorInfo&, const TensorInfo&) = default;
};

// A read-only view of tensor data owned by someone else; valid for the duration of a call.
struct ConstTensorView {
  TensorInfo info;
  const void* data = nullptr;

  template <typename T>
  std::span<const T> Elements() const {
    return {static_cast<const T*>(data), static_cast<std::size_t>(info.ElementCount())};
  }
};

// A writable view of tensor data owned by someone else; valid for the duration of a call.
struct TensorView {
  TensorInfo info;
  void* data = nullptr;

  template <typename T>
  std::span<T> Elements() const {
    return {static_cast<T*>(data), static_cast<std::size_t>(info.ElementCount())};
  }
};

// A tensor that owns its data (constants, request inputs and outputs). Thread-compatible.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(TensorInfo info) : info_(std::move(info)), data_(info_.ByteSize()) {}
  Tensor(TensorInfo info, std::vector<std::byte> data)
      : info_(std::move(info)), data_(std::move(data)) {}

  const TensorInfo& info() const { return info_; }
  std::span<const std::byte> bytes() const { return data_; }
  std::span<std::byte> bytes() { return data_; }
  void* data() { return data_.data(); }
  const void* data() const { return data_.data(); }

  template <typename T>
  std::span<T> Elements() {
    return {reinterpret_cast<T*>(data_.data()), data_.size() / sizeof(T)};
  }
  template <typename T>
  std::span<const T> Elements() const {
    return {reinterpret_cast<const T*>(data_.data()), data_.size() / sizeof(T)};
  }

  ConstTensorView View() const { return {info_, data_.data()}; }
  TensorView MutableView() { return {info_, data_.data()}; }

 private:
  TensorInfo info_;
  std::vector<std::byte> data_;
};

}  // namespace backplane
