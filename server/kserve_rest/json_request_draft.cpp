// The streaming pass of the REST infer body: a stack of small frames, one per open container,
// each knowing its one place in the request (the body, the request object, "inputs", an input,
// its "data", a document, a skipped value). The structure is fixed (body → request object →
// "inputs" array → input objects); every other value is built as a small document, streamed
// into its input's DataSink or DataLog ("data"), or skipped (unknown keys: refused later by
// name).
#include "kserve_rest/json_request_draft.hpp"

#include <memory>
#include <set>

#include "http/json_events.hpp"

namespace backplane::server::json_reader {
using nlohmann::json;

namespace {

// ---- Small values as documents --------------------------------------------------------------

// Builds one JSON value from SAX events: for the small parts of a request (id, parameters,
// outputs, an input's name, datatype, shape), which ParseInferenceRequest's checks read as
// documents.
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

// ---- The frames: one per open container --------------------------------------------------------

// What the frames below share: the network the request is for, the body's JSON size (the bound
// on what a shape may allocate), and the draft they fill.
struct ReadState {
  const Network& network;
  const std::size_t json_bytes;
  RequestDraft& draft;
};

// One open container (object or array) of the request and what its events mean there. The
// reader keeps a stack of them, innermost on top, and hands every event to the top one: a frame
// stands for one place in the request, so no callback asks where it is. A container's opening
// goes to the frame it opens in, which returns the frame for it (or null when it follows the
// nesting itself: a skipped value, a document, a "data"); its closing goes to the frame it
// opened, which then returns true and is popped. Thread-compatible, like the reader that owns
// them (one per request).
class Frame {
 public:
  virtual ~Frame() = default;
  virtual void OnScalar(const Scalar& value) = 0;
  virtual std::unique_ptr<Frame> OnBegin(bool is_array) = 0;
  virtual bool OnEnd() = 0;
  virtual void OnKey(std::string_view /*name*/) {}
  // For a number no double holds (1e400): where it is ("input 'x': element 3: "), or nullopt
  // when the frame below says it better (a document or a skipped value names its key).
  virtual std::optional<std::string> OverflowWhere() const { return std::nullopt; }
  // And the range it is out of.
  virtual std::string OverflowRange() const { return "range (larger than any double)"; }
};

// The first event of a value after a key: the whole value (a scalar), or its opening bracket.
struct ValueStart {
  const Scalar* scalar = nullptr;  // null: a container
  bool is_array = false;
};

// An object whose keys say what their values are: each value goes to Value() with the key just
// read (key()), and a key seen twice is noted in `repeated_keys`.
class ObjectFrame : public Frame {
 public:
  explicit ObjectFrame(std::vector<std::string>& repeated_keys) : repeated_keys_(repeated_keys) {}

  void OnScalar(const Scalar& value) final { Value({.scalar = &value}); }
  std::unique_ptr<Frame> OnBegin(bool is_array) final { return Value({.is_array = is_array}); }
  bool OnEnd() final { return true; }
  void OnKey(std::string_view name) final {
    key_ = name;
    if (!seen_keys_.emplace(name).second)
      repeated_keys_.emplace_back(name);
  }

 protected:
  // The value of key(): read by the frame returned (null when `start` is the whole value).
  virtual std::unique_ptr<Frame> Value(const ValueStart& start) = 0;
  const std::string& key() const { return key_; }

 private:
  std::vector<std::string>& repeated_keys_;
  std::string key_;
  std::set<std::string, std::less<>> seen_keys_;
};

// A value nobody reads (an unknown key's, refused later by name): its nesting is followed, its
// contents ignored.
class SkipFrame final : public Frame {
 public:
  void OnScalar(const Scalar&) override {}
  std::unique_ptr<Frame> OnBegin(bool) override {
    ++depth_;
    return nullptr;
  }
  bool OnEnd() override { return --depth_ == 0; }

 private:
  int depth_ = 1;
};

std::unique_ptr<Frame> SkipValue(const ValueStart& start) {
  return start.scalar != nullptr ? nullptr : std::make_unique<SkipFrame>();
}

// A small value built as a document into `*target`. Trap: the target is in the draft, and stays
// put only because the draft's inputs grow between elements of "inputs", never while a value
// inside one is open.
class DocumentFrame final : public Frame {
 public:
  DocumentFrame(json* target, bool is_array) : target_(target) {
    builder_.BeginContainer(is_array ? json::array() : json::object());
  }
  void OnScalar(const Scalar& value) override { builder_.Value(ToJson(value)); }
  std::unique_ptr<Frame> OnBegin(bool is_array) override {
    builder_.BeginContainer(is_array ? json::array() : json::object());
    return nullptr;
  }
  bool OnEnd() override {
    if (!builder_.EndContainer())
      return false;
    *target_ = builder_.Take();
    return true;
  }
  void OnKey(std::string_view name) override { builder_.Key(std::string(name)); }

 private:
  json* target_;
  DocumentBuilder builder_;
};

std::unique_ptr<Frame> ReadDocument(std::optional<json>& document, const ValueStart& start) {
  if (start.scalar != nullptr) {
    document = ToJson(*start.scalar);
    return nullptr;
  }
  return std::make_unique<DocumentFrame>(&*(document = json()), start.is_array);
}

// Where the elements of a "data" go when its input is refused whatever they say: nowhere.
struct DroppedData {
  void BeginArray() {}
  void EndArray() {}
  void Object() {}
  void Value(const Scalar&) {}
  std::size_t next_index() const { return 0; }
};

// One input's "data" array, its events handed to `Target` (DataSink, DataLog or DroppedData),
// chosen once when the data start.
template <typename Target>
class DataFrame final : public Frame {
 public:
  DataFrame(Target& target, const InputDraft& input, std::size_t position, bool is_array)
      : target_(target), input_(input), position_(position) {
    OnBegin(is_array);
  }
  void OnScalar(const Scalar& value) override {
    if (object_depth_ == 0)
      target_.Value(value);
  }
  std::unique_ptr<Frame> OnBegin(bool is_array) override {
    if (!is_array || object_depth_ > 0) {
      // Objects inside data are one opaque element; arrays inside them are part of it.
      if (object_depth_++ == 0)
        target_.Object();
      return nullptr;
    }
    ++data_depth_;
    target_.BeginArray();
    return nullptr;
  }
  bool OnEnd() override {
    if (object_depth_ > 0) {
      --object_depth_;
    } else {
      --data_depth_;
      target_.EndArray();
    }
    return object_depth_ == 0 && data_depth_ == 0;
  }
  std::optional<std::string> OverflowWhere() const override {
    return input_.Where(position_) + ": element " + std::to_string(target_.next_index()) + ": ";
  }
  std::string OverflowRange() const override {
    if (input_.datatype && input_.datatype->is_string()) {
      const DataType type = ParseDataType(input_.datatype->get<std::string>());
      if (type != DataType::kUndefined)
        return "the " + std::string(ToString(type)) + " range";
    }
    return Frame::OverflowRange();
  }

 private:
  Target& target_;
  const InputDraft& input_;
  const std::size_t position_;
  int data_depth_ = 0;    // arrays open in this "data"
  int object_depth_ = 0;  // objects open in it (skipped: one element each)
};

// One object of "inputs". Trap: `input_` is an element of the draft's inputs, which grow only
// between input objects, never while this frame is open.
class InputFrame final : public ObjectFrame {
 public:
  InputFrame(const ReadState& state, InputDraft& input, std::size_t position)
      : ObjectFrame(input.repeated_keys), state_(state), input_(input), position_(position) {}

  std::optional<std::string> OverflowWhere() const override {
    return input_.Where(position_) + ": '" + key() + "': ";
  }

 private:
  std::unique_ptr<Frame> Value(const ValueStart& start) override {
    if (key() == "name")
      return ReadDocument(input_.name, start);
    if (key() == "datatype")
      return ReadDocument(input_.datatype, start);
    if (key() == "shape")
      return ReadDocument(input_.shape, start);
    if (key() == "parameters")
      return ReadDocument(input_.parameters, start);
    if (key() == "data") {
      StartData();
      switch (input_.mode) {
        case InputDraft::DataMode::kDirect:
          return Data(*input_.sink, start);
        case InputDraft::DataMode::kLogged:
          return Data(*input_.log, start);
        case InputDraft::DataMode::kDropped:
          break;
      }
      static DroppedData dropped;  // stateless: shared by every reader
      return Data(dropped, start);
    }
    input_.unknown_keys.push_back(key());
    return SkipValue(start);
  }

  template <typename Target>
  std::unique_ptr<Frame> Data(Target& target, const ValueStart& start) {
    if (start.scalar != nullptr) {
      target.Value(*start.scalar);  // not an array: DataSink::Finish says so
      return nullptr;
    }
    return std::make_unique<DataFrame<Target>>(target, input_, position_, start.is_array);
  }

  // Where the elements of this "data" go: straight into the tensor when the input's name,
  // datatype and shape came first and fit the model; nowhere when they came first and do not
  // (the input is refused for that before its data count); into a log otherwise.
  void StartData() {
    InputDraft& input = input_;
    input.has_data = true;
    input.sink.reset();
    input.log.reset();
    input.mode = InputDraft::DataMode::kLogged;
    if (!input.name)
      return input.log.emplace(), void();
    const ValueInfo* expected = input.name->is_string()
                                    ? FindInput(state_.network, input.name->get<std::string>())
                                    : nullptr;
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
    if (SaturatedElementCount(info->shape) <= static_cast<int64_t>(state_.json_bytes)) {
      input.tensor = Tensor(*info);
      buffer = input.tensor.data();
    }
    input.sink.emplace(buffer, info->shape, info->type, Quoted(input.name->get<std::string>()));
  }

  const ReadState& state_;
  InputDraft& input_;
  const std::size_t position_;
};

// The "inputs" array: each element a new input, read by an InputFrame when it is an object.
class InputsFrame final : public Frame {
 public:
  explicit InputsFrame(const ReadState& state) : state_(state) {}

  void OnScalar(const Scalar& value) override {
    state_.draft.inputs.emplace_back().not_object = ToJson(value);
  }
  std::unique_ptr<Frame> OnBegin(bool is_array) override {
    InputDraft& input = state_.draft.inputs.emplace_back();
    // Not an input: kept as a document for the message that quotes it.
    if (is_array)
      return std::make_unique<DocumentFrame>(&*(input.not_object = json()), /*is_array=*/true);
    return std::make_unique<InputFrame>(state_, input, state_.draft.inputs.size() - 1);
  }
  bool OnEnd() override { return true; }
  std::optional<std::string> OverflowWhere() const override { return "'inputs': "; }

 private:
  const ReadState& state_;
};

// The request object: its known keys' values, "inputs" read input by input, unknown keys noted.
class RequestFrame final : public ObjectFrame {
 public:
  explicit RequestFrame(const ReadState& state)
      : ObjectFrame(state.draft.repeated_keys), state_(state) {}

  std::optional<std::string> OverflowWhere() const override {
    return key().empty() ? std::string() : "'" + key() + "': ";
  }

 private:
  std::unique_ptr<Frame> Value(const ValueStart& start) override {
    RequestDraft& draft = state_.draft;
    if (key() == "id")
      return ReadDocument(draft.id, start);
    if (key() == "parameters")
      return ReadDocument(draft.parameters, start);
    if (key() == "outputs")
      return ReadDocument(draft.outputs, start);
    if (key() == "inputs") {
      draft.has_inputs = true;
      draft.inputs_is_array = start.scalar == nullptr && start.is_array;
      if (draft.inputs_is_array)
        return std::make_unique<InputsFrame>(state_);
      return SkipValue(start);
    }
    draft.unknown_keys.push_back(key());
    return SkipValue(start);
  }

  const ReadState& state_;
};

// The bottom of the stack, never popped: the body's one value, which must be an object.
class BodyFrame final : public Frame {
 public:
  explicit BodyFrame(const ReadState& state) : state_(state) {}

  void OnScalar(const Scalar& value) override {
    if (!read_)
      state_.draft.not_object = json(ToJson(value)).type_name();
    read_ = true;
  }
  std::unique_ptr<Frame> OnBegin(bool is_array) override {
    if (read_)
      return nullptr;
    read_ = true;
    if (!is_array)
      return std::make_unique<RequestFrame>(state_);
    state_.draft.not_object = "array";
    return std::make_unique<SkipFrame>();
  }
  bool OnEnd() override { return false; }
  std::optional<std::string> OverflowWhere() const override { return std::string(); }

 private:
  const ReadState& state_;
  bool read_ = false;
};

// The event handler: hands each event to the frame on top of the stack.
class RequestReader final : public JsonEventHandler {
 public:
  RequestReader(const Network& network, std::size_t json_bytes, RequestDraft& draft)
      : state_{network, json_bytes, draft} {
    frames_.push_back(std::make_unique<BodyFrame>(state_));
  }

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
  bool EndObject() override { return OnEnd(); }
  bool BeginArray() override { return OnBegin(/*is_array=*/true); }
  bool EndArray() override { return OnEnd(); }
  bool Key(std::string_view name) override {
    frames_.back()->OnKey(name);
    return true;
  }
  // A number a double cannot hold (1e400): the reader stops there, so name the place.
  bool NumberOutOfRange(std::string_view token) override {
    std::string where;
    for (auto frame = frames_.rbegin(); frame != frames_.rend(); ++frame) {
      if (auto said = (*frame)->OverflowWhere()) {
        where = std::move(*said);
        break;
      }
    }
    error_ =
        InvalidArgument(where + Excerpt(token) + " is out of " + frames_.back()->OverflowRange());
    return false;
  }
  Status StopReason() const override { return error_; }

 private:
  bool OnScalar(const Scalar& value) {
    frames_.back()->OnScalar(value);
    return true;
  }
  bool OnBegin(bool is_array) {
    if (auto opened = frames_.back()->OnBegin(is_array))
      frames_.push_back(std::move(opened));
    return true;
  }
  bool OnEnd() {
    if (frames_.back()->OnEnd())
      frames_.pop_back();
    return true;
  }

  const ReadState state_;
  std::vector<std::unique_ptr<Frame>> frames_;  // the BodyFrame first, never popped
  Status error_ = Status::Ok();
};

}  // namespace

const ValueInfo* FindInput(const Network& network, std::string_view name) {
  for (const auto& candidate : network.inputs) {
    if (candidate.name == name)
      return &candidate;
  }
  return nullptr;
}

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

Status ReadRequestDraft(std::string_view json_text, int max_depth, const Network& network,
                        RequestDraft& draft) {
  RequestReader reader(network, json_text.size(), draft);
  return ReadJsonEvents(json_text, max_depth, reader);
}

}  // namespace backplane::server::json_reader
