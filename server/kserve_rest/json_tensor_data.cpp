#include "kserve_rest/json_tensor_data.hpp"

#include <cmath>
#include <limits>
#include <type_traits>

#include "backplane/core/quoted.hpp"

namespace backplane::server::json_reader {
using nlohmann::json;

std::string DumpExcerpt(const json& value) {
  return Excerpt(value.dump(-1, ' ', false, json::error_handler_t::replace));
}

namespace {

// The value as JSON prints it (nlohmann's dump), for messages: 1e+300, "two", null; a long
// string as its first kMaxQuotedBytes bytes.
std::string Dump(const Scalar& value) {
  switch (value.kind) {
    case ScalarKind::kInt64:
      return std::to_string(value.i);
    case ScalarKind::kUint64:
      return std::to_string(value.u);
    case ScalarKind::kDouble:
      return json(value.d).dump();
    case ScalarKind::kTrue:
      return "true";
    case ScalarKind::kFalse:
      return "false";
    case ScalarKind::kNull:
      return "null";
    case ScalarKind::kString:
      return DumpExcerpt(json(std::string(value.text)));
  }
  return "?";
}

// One element into `out` as T, or why not. The message names "input 'x' element 17"; it is
// only built on failure (this runs once per element of a request).
template <typename T>
Status ConvertElement(const Scalar& value, DataType type, const std::string& input,
                      std::size_t index, T* out) {
  const auto where = [&] { return "input " + input + " element " + std::to_string(index); };
  const auto wrong = [&](std::string_view expected) {
    return InvalidArgument(where() + " is " + Dump(value) + ", expected " + std::string(expected) +
                           " for " + std::string(ToString(type)));
  };
  const auto out_of_range = [&] {
    return InvalidArgument(where() + " is " + Dump(value) + ", out of range for " +
                           std::string(ToString(type)));
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (value.kind != ScalarKind::kTrue && value.kind != ScalarKind::kFalse)
      return wrong("true or false");
    *out = value.kind == ScalarKind::kTrue;
  } else if constexpr (std::is_floating_point_v<T>) {
    double number;
    switch (value.kind) {
      case ScalarKind::kInt64:
        number = static_cast<double>(value.i);
        break;
      case ScalarKind::kUint64:
        number = static_cast<double>(value.u);
        break;
      case ScalarKind::kDouble:
        number = value.d;
        break;
      default:
        return wrong("a number");
    }
    if (std::isfinite(number) && std::abs(number) > std::numeric_limits<T>::max())
      return out_of_range();
    *out = static_cast<T>(number);
  } else {
    if (value.kind == ScalarKind::kUint64) {
      if (value.u > static_cast<uint64_t>(std::numeric_limits<T>::max()))
        return out_of_range();
      *out = static_cast<T>(value.u);
    } else if (value.kind == ScalarKind::kInt64) {
      const int64_t number = value.i;
      if (number < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          static_cast<uint64_t>(std::max<int64_t>(number, 0)) >
              static_cast<uint64_t>(std::numeric_limits<T>::max()))
        return out_of_range();
      *out = static_cast<T>(number);
    } else {
      return wrong("an integer");
    }
  }
  return Status::Ok();
}

template <typename T>
Status WriteElement(const Scalar& value, DataType type, const std::string& input, std::size_t index,
                    void* data) {
  if constexpr (std::is_same_v<T, bool>) {
    bool flag = false;
    BACKPLANE_RETURN_IF_ERROR(ConvertElement<bool>(value, type, input, index, &flag));
    if (data != nullptr)
      static_cast<uint8_t*>(data)[index] = flag ? 1 : 0;  // BOOL: one byte, 0 or 1
    return Status::Ok();
  } else {
    T converted{};
    BACKPLANE_RETURN_IF_ERROR(ConvertElement<T>(value, type, input, index, &converted));
    if (data != nullptr)
      static_cast<T*>(data)[index] = converted;
    return Status::Ok();
  }
}

}  // namespace

ElementWriter WriterFor(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return &WriteElement<float>;
    case DataType::kFloat64:
      return &WriteElement<double>;
    case DataType::kInt64:
      return &WriteElement<int64_t>;
    case DataType::kInt32:
      return &WriteElement<int32_t>;
    case DataType::kInt8:
      return &WriteElement<int8_t>;
    case DataType::kUint8:
      return &WriteElement<uint8_t>;
    case DataType::kBool:
      return &WriteElement<bool>;
    case DataType::kUndefined:
      break;
  }
  return nullptr;
}

json ToJson(const Scalar& value) {
  switch (value.kind) {
    case ScalarKind::kInt64:
      return value.i;
    case ScalarKind::kUint64:
      return value.u;
    case ScalarKind::kDouble:
      return value.d;
    case ScalarKind::kTrue:
      return true;
    case ScalarKind::kFalse:
      return false;
    case ScalarKind::kNull:
      return nullptr;
    case ScalarKind::kString:
      return std::string(value.text);
  }
  return nullptr;
}

}  // namespace backplane::server::json_reader
