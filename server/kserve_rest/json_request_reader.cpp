// The streaming reader of a KServe v2 REST infer body: SAX events straight into the inputs'
// tensors. Over 600 lines on purpose: it is one parser whose parts (the scalar conversions, the
// per-input data sink, the small-value documents, the event router, the per-input checks) only
// make sense together, and each is a class of its own below. The response writer is
// json_response_writer.cpp; the rules gRPC shares are serving/inference_request.cpp.
#include "kserve_rest/kserve_json.hpp"

#include "http/json_events.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <type_traits>

namespace backplane::server {
using nlohmann::json;

namespace {

// ---- Scalars ------------------------------------------------------------------------------

// One JSON value that is neither an array nor an object, as the SAX parser hands it over.
// `text` views the parser's buffer: valid only during the callback.
enum class ScalarKind : uint8_t { kInt64, kUint64, kDouble, kTrue, kFalse, kNull, kString };
struct Scalar {
  ScalarKind kind = ScalarKind::kNull;
  int64_t i = 0;
  uint64_t u = 0;
  double d = 0;
  std::string_view text;
};

// A client's JSON value as nlohmann prints it, for messages: its first kMaxQuotedBytes bytes.
std::string DumpExcerpt(const json& value) {
  return Excerpt(value.dump(-1, ' ', false, json::error_handler_t::replace));
}

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

using ElementWriter = Status (*)(const Scalar&, DataType, const std::string&, std::size_t, void*);

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

// ---- One input's "data", streamed ---------------------------------------------------------

// Takes the events of one input's "data" value and writes its elements into the tensor,
// checking the nesting against the shape on the way. Flat data is a list of scalars; nested
// data (its first element an array) must follow the shape exactly.
//
// The error Finish reports is the first thing wrong in document order (a level's element count
// is checked at its closing bracket, flat data's count at the end); every event after it is
// ignored, so a bad request costs no more conversion work.
class DataSink {
 public:
  // `data` is the tensor's buffer, or null when there is none (its shape needs more elements
  // than the body could hold: the count check fails anyway, and nothing is allocated).
  DataSink(void* data, const Shape& shape, DataType type, std::string quoted_input)
      : data_(data),
        shape_(shape),
        type_(type),
        input_(std::move(quoted_input)),
        count_(SaturatedElementCount(shape)),
        write_(WriterFor(type)) {}

  void BeginArray() {
    if (!error_.ok())
      return;
    if (depth_ == 0) {
      started_ = true;
      depth_ = 1;
      counts_.push_back(0);
      return;
    }
    if (!Element(/*is_array=*/true))
      return;
    // A nested level the shape allows.
    ++depth_;
    counts_.push_back(0);
  }

  void EndArray() {
    if (!error_.ok())
      return;
    const std::size_t dim = depth_ - 1;
    if (nested_ && counts_[dim] != shape_[dim]) {
      return Fail("nested data has " + std::to_string(counts_[dim]) + " element(s) at depth " +
                  std::to_string(dim) + ", shape " + ToString(shape_) + " needs " +
                  std::to_string(shape_[dim]));
    }
    counts_.pop_back();
    --depth_;
  }

  // A whole object (its contents are not handed over).
  void Object() {
    if (!error_.ok())
      return;
    if (depth_ == 0) {
      started_ = true;
      not_array_ = true;
      return;
    }
    Element(/*is_array=*/false, /*is_object=*/true);
  }

  void Value(const Scalar& value) {
    if (!error_.ok())
      return;
    if (depth_ == 0) {
      started_ = true;
      not_array_ = true;
      return;
    }
    if (!Element(/*is_array=*/false, /*is_object=*/false))
      return;
    const std::size_t index = nested_ ? elements_++ : top_count_ - 1;
    if (index >= static_cast<std::size_t>(std::min<int64_t>(count_, kMaxRequestElements)))
      return;  // too many: the count check reports it
    error_ = write_(value, type_, input_, index, data_);
  }

  // The index the next element would get: for naming a number the parser could not hold.
  std::size_t next_index() const { return nested_ ? elements_ : top_count_; }

  // What was wrong; "'data' (an array) is required" when the value was not an array.
  Status Finish() const {
    if (!started_ || not_array_)
      return InvalidArgument("input " + input_ + ": 'data' (an array) is required");
    if (!error_.ok())
      return error_;
    if (!nested_ && static_cast<int64_t>(top_count_) != count_) {
      return InvalidArgument("input " + input_ + ": 'data' has " + std::to_string(top_count_) +
                             " element(s), shape " + ToString(shape_) + " needs " +
                             (count_ > kMaxRequestElements ? "too many" : std::to_string(count_)));
    }
    return Status::Ok();
  }

 private:
  // An element of the array at depth_. Returns true when the caller goes on with it (a scalar
  // to write, or an array to descend into).
  bool Element(bool is_array, bool is_object = false) {
    if (!decided_) {
      decided_ = true;
      nested_ = is_array && !shape_.empty();
    }
    if (!nested_) {
      ++top_count_;
      if (is_array || is_object) {
        Fail("'data' mixes arrays and scalars at the top level");
        return false;
      }
      return true;
    }
    const std::size_t dim = depth_ - 1;
    ++counts_[dim];
    const bool last = dim + 1 >= shape_.size();
    if (last && (is_array || is_object)) {
      Fail("nested data is deeper than shape " + ToString(shape_));
      return false;
    }
    if (!last && !is_array) {
      Fail("nested data is shallower than shape " + ToString(shape_) + " (a scalar at depth " +
           std::to_string(dim) + ")");
      return false;
    }
    return true;
  }

  void Fail(const std::string& what) { error_ = InvalidArgument("input " + input_ + ": " + what); }

  void* data_;
  Shape shape_;
  DataType type_;
  std::string input_;
  int64_t count_;
  ElementWriter write_;

  bool started_ = false, not_array_ = false, decided_ = false, nested_ = false;
  std::size_t depth_ = 0;        // arrays open, the data array included
  std::size_t top_count_ = 0;    // flat: elements of the data array
  std::size_t elements_ = 0;     // nested: scalars at the last level
  std::vector<int64_t> counts_;  // nested: elements so far at each open level
  Status error_ = Status::Ok();  // the first thing wrong
};

// The events of a "data" that arrived before its input's name, datatype or shape, kept compact
// (a byte per event, 8 bytes per number) until they are known and replayed into a DataSink.
class DataLog {
 public:
  void BeginArray() { events_.push_back(kBeginArray); }
  void EndArray() { events_.push_back(kEndArray); }
  void Object() { events_.push_back(kObject); }
  void Value(const Scalar& value) {
    events_.push_back(static_cast<uint8_t>(value.kind));
    uint64_t payload = 0;
    switch (value.kind) {
      case ScalarKind::kInt64:
        payload = static_cast<uint64_t>(value.i);
        break;
      case ScalarKind::kUint64:
        payload = value.u;
        break;
      case ScalarKind::kDouble:
        payload = std::bit_cast<uint64_t>(value.d);
        break;
      case ScalarKind::kString:
        payload = strings_.size();
        strings_.emplace_back(value.text);
        break;
      default:
        return;  // true, false, null: the kind says it all
    }
    payloads_.push_back(payload);
    ++scalars_;
  }
  std::size_t scalars() const { return scalars_; }

  void ReplayInto(DataSink& sink) const {
    std::size_t next_payload = 0;
    for (uint8_t event : events_) {
      if (event == kBeginArray) {
        sink.BeginArray();
      } else if (event == kEndArray) {
        sink.EndArray();
      } else if (event == kObject) {
        sink.Object();
      } else {
        Scalar value;
        value.kind = static_cast<ScalarKind>(event);
        switch (value.kind) {
          case ScalarKind::kInt64:
            value.i = static_cast<int64_t>(payloads_[next_payload++]);
            break;
          case ScalarKind::kUint64:
            value.u = payloads_[next_payload++];
            break;
          case ScalarKind::kDouble:
            value.d = std::bit_cast<double>(payloads_[next_payload++]);
            break;
          case ScalarKind::kString:
            value.text = strings_[payloads_[next_payload++]];
            break;
          default:
            break;
        }
        sink.Value(value);
      }
    }
  }

 private:
  static constexpr uint8_t kBeginArray = 100, kEndArray = 101, kObject = 102;
  std::vector<uint8_t> events_;
  std::vector<uint64_t> payloads_;
  std::vector<std::string> strings_;
  std::size_t scalars_ = 0;
};

// ---- Small values as documents --------------------------------------------------------------

// Builds one JSON value from SAX events: for the small parts of a request (id, parameters,
// outputs, an input's name, datatype, shape), which the checks below read as documents.
class DocumentBuilder {
 public:
  // Each returns true when the value is complete.
  bool BeginContainer(json value) {
    stack_.push_back(Place(std::move(value)));
    return false;
  }
  bool EndContainer() {
    stack_.pop_back();
    return stack_.empty();
  }
  void Key(std::string key) { key_ = std::move(key); }
  bool Value(json value) {
    Place(std::move(value));
    return stack_.empty();
  }
  json Take() { return std::move(root_); }

 private:
  json* Place(json value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    json& slot = parent[key_];
    slot = std::move(value);
    return &slot;
  }

  json root_;
  std::vector<json*> stack_;
  std::string key_;
};

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

// ---- Checks shared by the streaming pass and the final one ------------------------------------

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

// An input's datatype and shape against the model's.
Result<TensorInfo> CheckTensorInfo(const std::optional<json>& datatype,
                                   const std::optional<json>& shape_value,
                                   const ValueInfo& expected, const std::string& where) {
  if (!datatype || !datatype->is_string())
    return InvalidArgument(where + ": 'datatype' (a string such as \"FP32\") is required");
  auto checked = CheckDataTypeMatches(where, datatype->get<std::string>(), expected);
  if (!checked.ok())
    return checked.error();
  const DataType type = checked.value();
  if (!shape_value || !shape_value->is_array())
    return InvalidArgument(where + ": 'shape' (an array of dimensions) is required");
  BACKPLANE_RETURN_IF_ERROR(CheckRank(where, shape_value->size()));
  Shape shape;
  for (const auto& dim : *shape_value) {
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0 ||
        (dim.is_number_unsigned() && dim.get<uint64_t>() > uint64_t(kMaxRequestElements))) {
      return InvalidArgument(where + ": 'shape' holds " + DumpExcerpt(dim) +
                             ", which is not a dimension (a non-negative integer)");
    }
    shape.push_back(dim.get<int64_t>());
  }
  BACKPLANE_RETURN_IF_ERROR(CheckShapeMatches(where, shape, expected));
  return TensorInfo{type, shape};
}

// ---- The request, as the streaming pass leaves it ---------------------------------------------

// One object of "inputs" with its small values as documents and its data already converted (or
// logged, or dropped when the input is refused whatever the data say).
struct InputDraft {
  std::optional<json> not_object;  // the element, when it is not an object
  std::optional<json> name, datatype, shape, parameters;
  std::vector<std::string> unknown_keys;
  std::vector<std::string> repeated_keys;
  bool has_data = false;
  enum class DataMode { kDirect, kLogged, kDropped } mode = DataMode::kDropped;
  std::optional<DataSink> sink;  // kDirect
  Tensor tensor;                 // kDirect: what the sink writes into
  std::optional<DataLog> log;    // kLogged

  std::string Where(std::size_t position) const {
    if (name && name->is_string())
      return "input " + Quoted(name->get<std::string>());
    return "inputs[" + std::to_string(position) + "]";
  }
};

struct RequestDraft {
  std::optional<std::string> not_object;  // the root's type name, when it is not an object
  std::vector<std::string> unknown_keys;
  std::vector<std::string> repeated_keys;
  std::optional<json> id, parameters, outputs;
  bool has_inputs = false, inputs_is_array = false;
  std::vector<InputDraft> inputs;
};

const ValueInfo* FindInput(const Network& network, std::string_view name) {
  for (const auto& candidate : network.inputs) {
    if (candidate.name == name)
      return &candidate;
  }
  return nullptr;
}

// The SAX handler: routes each event to what the current position in the request calls for.
// The structure it knows is fixed (root object → "inputs" array → input objects); every other
// value is built as a small document, streamed into a DataSink or DataLog ("data"), or skipped
// (unknown keys: refused later by name).
class RequestReader final : public JsonEventHandler {
 public:
  RequestReader(const Network& network, std::size_t json_bytes, RequestDraft& draft)
      : network_(network), json_bytes_(json_bytes), draft_(draft) {}

  bool Null() override { return OnScalar(Scalar{.kind = ScalarKind::kNull}); }
  bool Bool(bool value) override {
    return OnScalar(Scalar{.kind = value ? ScalarKind::kTrue : ScalarKind::kFalse});
  }
  bool Int64(int64_t value) override {
    return OnScalar(Scalar{.kind = ScalarKind::kInt64, .i = value});
  }
  bool Uint64(uint64_t value) override {
    return OnScalar(Scalar{.kind = ScalarKind::kUint64, .u = value});
  }
  bool Double(double value) override {
    return OnScalar(Scalar{.kind = ScalarKind::kDouble, .d = value});
  }
  bool String(std::string_view value) override {
    return OnScalar(Scalar{.kind = ScalarKind::kString, .text = value});
  }
  bool BeginObject() override { return OnBegin(/*is_array=*/false); }
  bool EndObject() override { return OnEnd(/*is_array=*/false); }
  bool BeginArray() override { return OnBegin(/*is_array=*/true); }
  bool EndArray() override { return OnEnd(/*is_array=*/true); }
  bool Key(std::string_view name) override { return OnKey(name); }
  // A number a double cannot hold (1e400): the reader stops there, so name the place.
  bool NumberOutOfRange(std::string_view token) override {
    error_ = InvalidArgument(OverflowWhere() + Excerpt(token) + " is out of " + OverflowRange());
    return false;
  }
  Status StopReason() const override { return error_; }

 private:
  enum class Place { kStart, kRoot, kInputs, kInput, kEnd };
  enum class Consumer { kNone, kSkip, kDocument, kData };

  bool OnScalar(const Scalar& value) {
    switch (consumer_) {
      case Consumer::kSkip:
        return true;
      case Consumer::kDocument:
        if (builder_.Value(ToJson(value)))
          FinishDocument();
        return true;
      case Consumer::kData:
        if (object_depth_ == 0) {
          Feed([&](auto& target) { target.Value(value); });
          if (data_depth_ == 0)
            consumer_ = Consumer::kNone;
        }
        return true;
      case Consumer::kNone:
        break;
    }
    switch (place_) {
      case Place::kStart:
        draft_.not_object = json(ToJson(value)).type_name();
        place_ = Place::kEnd;
        return true;
      case Place::kRoot:
      case Place::kInput:
        return StartValue(/*container=*/std::nullopt, &value);
      case Place::kInputs:
        draft_.inputs.emplace_back().not_object = ToJson(value);
        return true;
      case Place::kEnd:
        return true;
    }
    return true;
  }

  bool OnBegin(bool is_array) {
    switch (consumer_) {
      case Consumer::kSkip:
        ++skip_depth_;
        return true;
      case Consumer::kDocument:
        builder_.BeginContainer(is_array ? json::array() : json::object());
        return true;
      case Consumer::kData:
        if (!is_array || object_depth_ > 0) {
          // Objects inside data are one opaque element; arrays inside them are part of it.
          if (object_depth_++ == 0)
            Feed([](auto& target) { target.Object(); });
          return true;
        }
        ++data_depth_;
        Feed([](auto& target) { target.BeginArray(); });
        return true;
      case Consumer::kNone:
        break;
    }
    switch (place_) {
      case Place::kStart:
        if (is_array) {
          draft_.not_object = "array";
          StartSkip();
          place_ = Place::kEnd;
        } else {
          place_ = Place::kRoot;
        }
        return true;
      case Place::kRoot:
      case Place::kInput:
        return StartValue(is_array, nullptr);
      case Place::kInputs:
        if (is_array) {
          // Not an input: kept as a document for the message that quotes it.
          draft_.inputs.emplace_back();
          target_ = &*(draft_.inputs.back().not_object = json());
          consumer_ = Consumer::kDocument;
          builder_ = DocumentBuilder();
          builder_.BeginContainer(json::array());
        } else {
          draft_.inputs.emplace_back();
          seen_input_keys_.clear();
          place_ = Place::kInput;
        }
        return true;
      case Place::kEnd:
        return true;
    }
    return true;
  }

  bool OnEnd(bool is_array) {
    switch (consumer_) {
      case Consumer::kSkip:
        if (--skip_depth_ == 0)
          consumer_ = Consumer::kNone;
        return true;
      case Consumer::kDocument:
        if (builder_.EndContainer())
          FinishDocument();
        return true;
      case Consumer::kData:
        if (object_depth_ > 0) {
          --object_depth_;
        } else {
          --data_depth_;
          Feed([](auto& target) { target.EndArray(); });
        }
        if (object_depth_ == 0 && data_depth_ == 0)
          consumer_ = Consumer::kNone;
        return true;
      case Consumer::kNone:
        break;
    }
    (void)is_array;
    switch (place_) {
      case Place::kRoot:
        place_ = Place::kEnd;
        break;
      case Place::kInputs:
        place_ = Place::kRoot;
        break;
      case Place::kInput:
        place_ = Place::kInputs;
        break;
      default:
        break;
    }
    return true;
  }

  bool OnKey(std::string_view name) {
    if (consumer_ == Consumer::kDocument) {
      builder_.Key(std::string(name));
      return true;
    }
    if (consumer_ != Consumer::kNone)
      return true;  // inside a skipped value or an object among the data
    key_ = name;
    if (place_ == Place::kRoot) {
      if (!seen_root_keys_.emplace(name).second)
        draft_.repeated_keys.emplace_back(name);
    } else if (place_ == Place::kInput) {
      if (!seen_input_keys_.emplace(name).second)
        draft_.inputs.back().repeated_keys.emplace_back(name);
    }
    return true;
  }

  // The value after key_ in the root or an input object: `container` is set for [ or {,
  // `scalar` for anything else.
  bool StartValue(std::optional<bool> container, const Scalar* scalar) {
    std::optional<json>* document = nullptr;
    if (place_ == Place::kRoot) {
      if (key_ == "id") {
        document = &draft_.id;
      } else if (key_ == "parameters") {
        document = &draft_.parameters;
      } else if (key_ == "outputs") {
        document = &draft_.outputs;
      } else if (key_ == "inputs") {
        draft_.has_inputs = true;
        if (container == true) {
          draft_.inputs_is_array = true;
          place_ = Place::kInputs;
          return true;
        }
        draft_.inputs_is_array = false;
      } else {
        draft_.unknown_keys.push_back(key_);
      }
    } else {
      InputDraft& input = draft_.inputs.back();
      if (key_ == "name") {
        document = &input.name;
      } else if (key_ == "datatype") {
        document = &input.datatype;
      } else if (key_ == "shape") {
        document = &input.shape;
      } else if (key_ == "parameters") {
        document = &input.parameters;
      } else if (key_ == "data") {
        StartData(input);
        consumer_ = Consumer::kData;
        data_depth_ = 0;
        object_depth_ = 0;
        if (scalar != nullptr) {
          OnScalar(*scalar);
        } else {
          OnBegin(*container);
        }
        return true;
      } else {
        input.unknown_keys.push_back(key_);
      }
    }
    if (document == nullptr) {
      if (container)
        StartSkip();
      return true;
    }
    if (scalar != nullptr) {
      *document = ToJson(*scalar);
      return true;
    }
    target_ = &*(*document = json());
    builder_ = DocumentBuilder();
    builder_.BeginContainer(*container ? json::array() : json::object());
    consumer_ = Consumer::kDocument;
    return true;
  }

  void StartSkip() {
    consumer_ = Consumer::kSkip;
    skip_depth_ = 1;
  }

  void FinishDocument() {
    *target_ = builder_.Take();
    consumer_ = Consumer::kNone;
  }

  // Where the elements of this "data" go: straight into the tensor when the input's name,
  // datatype and shape came first and fit the model; nowhere when they came first and do not
  // (the input is refused for that before its data count); into a log otherwise.
  void StartData(InputDraft& input) {
    input.has_data = true;
    input.sink.reset();
    input.log.reset();
    input.mode = InputDraft::DataMode::kLogged;
    if (!input.name)
      return input.log.emplace(), void();
    const ValueInfo* expected =
        input.name->is_string() ? FindInput(network_, input.name->get<std::string>()) : nullptr;
    if (expected == nullptr) {
      input.mode = InputDraft::DataMode::kDropped;
      return;
    }
    if (!input.datatype || !input.shape)
      return input.log.emplace(), void();
    auto info = CheckTensorInfo(input.datatype, input.shape, *expected, "");
    if (!info.ok()) {
      input.mode = InputDraft::DataMode::kDropped;
      return;
    }
    input.mode = InputDraft::DataMode::kDirect;
    void* buffer = nullptr;
    // Each element takes at least one byte of JSON: a shape needing more cannot be what the
    // data hold, so nothing that large is allocated on a body's word.
    if (SaturatedElementCount(info->shape) <= static_cast<int64_t>(json_bytes_)) {
      input.tensor = Tensor(*info);
      buffer = input.tensor.data();
    }
    input.sink.emplace(buffer, info->shape, info->type, Quoted(input.name->get<std::string>()));
  }

  template <typename Action>
  void Feed(Action action) {
    InputDraft& input = draft_.inputs.back();
    if (input.mode == InputDraft::DataMode::kDirect)
      action(*input.sink);
    else if (input.mode == InputDraft::DataMode::kLogged)
      action(*input.log);
  }

  std::string OverflowWhere() const {
    if (consumer_ == Consumer::kData && !draft_.inputs.empty()) {
      const InputDraft& input = draft_.inputs.back();
      std::size_t index = 0;
      if (input.mode == InputDraft::DataMode::kDirect)
        index = input.sink->next_index();
      else if (input.mode == InputDraft::DataMode::kLogged)
        index = input.log->scalars();
      return input.Where(draft_.inputs.size() - 1) + ": element " + std::to_string(index) + ": ";
    }
    if (place_ == Place::kInput || place_ == Place::kInputs) {
      if (place_ == Place::kInputs || draft_.inputs.empty())
        return "'inputs': ";
      return draft_.inputs.back().Where(draft_.inputs.size() - 1) + ": '" + key_ + "': ";
    }
    return key_.empty() ? std::string() : "'" + key_ + "': ";
  }

  std::string OverflowRange() const {
    if (consumer_ == Consumer::kData && !draft_.inputs.empty()) {
      const InputDraft& input = draft_.inputs.back();
      if (input.datatype && input.datatype->is_string()) {
        const DataType type = ParseDataType(input.datatype->get<std::string>());
        if (type != DataType::kUndefined)
          return "the " + std::string(ToString(type)) + " range";
      }
    }
    return "range (larger than any double)";
  }

  const Network& network_;
  const std::size_t json_bytes_;
  RequestDraft& draft_;
  Status error_ = Status::Ok();

  Place place_ = Place::kStart;
  Consumer consumer_ = Consumer::kNone;
  std::string key_;
  int skip_depth_ = 0;
  int data_depth_ = 0;    // arrays open in the current "data"
  int object_depth_ = 0;  // objects open in it (skipped: one element each)
  DocumentBuilder builder_;
  json* target_ = nullptr;
  std::set<std::string, std::less<>> seen_root_keys_, seen_input_keys_;
};

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
  RequestReader reader(network, body.json.size(), draft);
  BACKPLANE_RETURN_IF_ERROR(ReadJsonEvents(body.json, limits.max_json_depth, reader));

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

  InferenceRequest request;
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
