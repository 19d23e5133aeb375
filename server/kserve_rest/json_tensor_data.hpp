// The elements of a KServe v2 REST infer body's "data", streamed: each JSON scalar as the event
// reader hands it over, converted into its input's tensor (DataSink), or kept compact until the
// input's name, datatype and shape are known (DataLog). Private to kserve_rest: the request
// frames (json_request_draft.cpp) feed these; ParseInferenceRequest replays and finishes them.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/core/tensor.hpp"
#include "serving/inference_request.hpp"

namespace backplane::server::json_reader {

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
std::string DumpExcerpt(const nlohmann::json& value);

// A scalar as a JSON document (the small values of a request are read as documents).
nlohmann::json ToJson(const Scalar& value);

// Converts one element to `type` and stores it at `index` of `data` (null: checked only), or
// says why not, naming "input <input> element <index>". Built for the tensor's type once.
using ElementWriter = Status (*)(const Scalar&, DataType, const std::string&, std::size_t, void*);
ElementWriter WriterFor(DataType type);

// Takes the events of one input's "data" value and writes its elements into the tensor,
// checking the nesting against the shape on the way. Flat data is a list of scalars; nested
// data (its first element an array) must follow the shape exactly.
//
// The error Finish reports is the first thing wrong in document order (a level's element count
// is checked at its closing bracket, flat data's count at the end); every event after it is
// ignored, so a bad request costs no more conversion work. Thread-compatible.
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
// Thread-compatible.
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
  // The index the next element would get (for naming a number the parser could not hold).
  std::size_t next_index() const { return scalars_; }

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

}  // namespace backplane::server::json_reader
