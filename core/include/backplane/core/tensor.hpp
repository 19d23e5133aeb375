// Tensor descriptions and non-owning views, shared by the host and backends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "backplane/core/status.hpp"

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

// Unchecked: only for shapes that passed CheckedElementCount (every Network value, every tensor
// the runtime hands a backend). On a shape from a model or a request it can wrap around (to 4
// for [4611686018427387905,4]) and size a buffer far smaller than the shape says.
inline int64_t ElementCount(const Shape& shape) {
  int64_t count = 1;
  for (int64_t dim : shape)
    count *= dim;
  return count;
}

// "[2,3]". A shape of more than 16 dimensions (only a hostile request has one) is shortened to its
// first 8 and last 2: "[1,2,3,4,5,6,7,8,...,9,10] (50000 dims)", so that messages stay bounded.
inline std::string ToString(const Shape& shape) {
  constexpr std::size_t kHead = 8, kTail = 2, kMaxWritten = 16;
  const bool shortened = shape.size() > kMaxWritten;
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shortened && i == kHead) {
      text += ",...";
      i = shape.size() - kTail;
    }
    if (i > 0)
      text += ",";
    text += std::to_string(shape[i]);
  }
  text += "]";
  if (shortened)
    text += " (" + std::to_string(shape.size()) + " dims)";
  return text;
}

// The one rule for products of dimensions (model import, shape inference, the runtime's
// allocation, the backends, the server's requests): a shape may have at most kMaxElementCount
// elements. Far above any real tensor (4 TiB of FP32), and low enough that a byte size (x 8) or
// the sum of a few such products never overflows int64.
//
// Trap: a shape with a zero dimension holds nothing, yet kernels multiply subsets of its other
// dimensions (rows x columns, outer x inner); [0, 2^62, 2^62] would overflow those. So the bound
// is on the product of the non-zero dimensions, and then every partial product fits as well.
inline constexpr int64_t kMaxElementCount = int64_t{1} << 40;

// The product of the positive dimensions in `dims` (zeros and unknown, negative, dimensions are
// skipped), or nullopt when it exceeds kMaxElementCount. Each step is checked before it
// multiplies, so hostile dimensions never overflow.
constexpr std::optional<int64_t> BoundedDimProduct(std::span<const int64_t> dims) {
  int64_t product = 1;
  for (int64_t dim : dims) {
    if (dim <= 0)
      continue;
    if (dim > kMaxElementCount / product)
      return std::nullopt;
    product *= dim;
  }
  return product;
}

// a + b and a * b for dimension arithmetic on values a model may set to anything (pads,
// dilations, group, kernel sizes): nullopt when the result overflows or leaves
// [0, kMaxElementCount], so that whatever it feeds stays within the same bound.
constexpr std::optional<int64_t> BoundedAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum) || sum < 0 || sum > kMaxElementCount)
    return std::nullopt;
  return sum;
}
constexpr std::optional<int64_t> BoundedMul(int64_t a, int64_t b) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product) || product < 0 || product > kMaxElementCount)
    return std::nullopt;
  return product;
}

// "<what>: shape [..] has too many elements: the product of its dimensions overflows the limit
// of 2^40 (1099511627776)", the message every refusal of an oversized shape gives.
inline Status ElementCountOverflow(std::string_view what, const Shape& shape) {
  return InvalidArgument(std::string(what) + ": shape " + ToString(shape) +
                         " has too many elements: the product of its dimensions overflows the "
                         "limit of 2^40 (" +
                         std::to_string(kMaxElementCount) + ")");
}

// For shapes that may still have unknown (negative) dimensions, such as a model's declared
// inputs: refuses, naming `what`, when the known dimensions alone already exceed the bound.
inline Status CheckKnownElementCount(const Shape& shape, std::string_view what) {
  if (!BoundedDimProduct(shape))
    return ElementCountOverflow(what, shape);
  return Status::Ok();
}

// The element count of a concrete shape: kInvalidArgument naming `what` for a negative
// (unresolved) dimension or for a product over the bound.
inline Result<int64_t> CheckedElementCount(const Shape& shape, std::string_view what) {
  for (int64_t dim : shape) {
    if (dim < 0)
      return InvalidArgument(std::string(what) + ": shape " + ToString(shape) +
                             " has a negative dimension " + std::to_string(dim));
  }
  if (!BoundedDimProduct(shape))
    return ElementCountOverflow(what, shape);
  return ElementCount(shape);  // cannot overflow now
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

// The bytes a concrete tensor takes: CheckedElementCount's refusals, else the count times the
// element size (which the bound keeps far from overflow).
inline Result<std::size_t> CheckedByteSize(const TensorInfo& info, std::string_view what) {
  auto count = CheckedElementCount(info.shape, what);
  if (!count.ok())
    return count.error();
  return static_cast<std::size_t>(*count) * ElementSize(info.type);
}

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
  // A copy of what `view` shows, owned (a request's inputs kept past the call that lent them).
  static Tensor CopyOf(const ConstTensorView& view) {
    const auto* bytes = static_cast<const std::byte*>(view.data);
    return Tensor(view.info, std::vector<std::byte>(bytes, bytes + view.info.ByteSize()));
  }

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

// Calls `visit(T{})` with the C++ type of an element of `type`: BOOL as uint8_t (one byte each,
// 0 or 1), UNDEFINED as std::byte.
template <typename Visit>
decltype(auto) VisitElementType(DataType type, Visit&& visit) {
  switch (type) {
    case DataType::kFloat32:
      return visit(float{});
    case DataType::kUint8:
    case DataType::kBool:
      return visit(uint8_t{});
    case DataType::kInt8:
      return visit(int8_t{});
    case DataType::kInt32:
      return visit(int32_t{});
    case DataType::kInt64:
      return visit(int64_t{});
    case DataType::kFloat64:
      return visit(double{});
    case DataType::kUndefined:
      break;
  }
  return visit(std::byte{});
}

// A view's elements as numbers of their own type, widened to double (INT8 -1 is -1, not 255),
// for comparing outputs of any type. Empty for UNDEFINED. INT64 beyond 2^53 loses its low bits.
inline std::vector<double> ElementsAsDoubles(const ConstTensorView& view) {
  return VisitElementType(view.info.type, [&](auto tag) -> std::vector<double> {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, std::byte>) {
      return {};
    } else {
      const auto values = view.Elements<T>();
      return {values.begin(), values.end()};
    }
  });
}

}  // namespace backplane
