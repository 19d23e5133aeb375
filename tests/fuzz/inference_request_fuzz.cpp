// libFuzzer target for the REST infer parser (server/kserve_rest/json_request_reader.cpp): a body,
// JSON or JSON plus binary tensor data, must give a request or an error, never a crash, a read
// outside the body, a write outside a tensor or a hang. An input is the
// Inference-Header-Content-Length header's text, a newline, then the body; an input without a
// newline is a body sent without the header (all JSON). A parsed request is rendered back, binary
// and JSON. The JSON reader under the parser (server/http/json_events.cpp) must accept exactly
// what nlohmann accepts (but a text with a NUL byte, which nlohmann reads as its end): a
// difference aborts. Seeds: corpus/inference_request; dictionary:
// inference_request.dict.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "http/json_events.hpp"
#include "kserve_rest/kserve_json.hpp"

namespace {

using namespace backplane;
using namespace backplane::server;

// Every datatype, dynamic dimensions, a rank-3 input: the paths of the parser.
const Network& FuzzNetwork() {
  static const Network network = [] {
    Network n;
    n.name = "fuzz";
    n.inputs.push_back({"x", {DataType::kFloat32, {-1, 3}}});
    n.inputs.push_back({"t", {DataType::kInt8, {2, -1, 2}}});
    n.inputs.push_back({"b", {DataType::kBool, {2}}});
    n.inputs.push_back({"i", {DataType::kInt64, {-1}}});
    n.inputs.push_back({"u", {DataType::kUint8, {1}}});
    n.inputs.push_back({"d", {DataType::kFloat64, {1}}});
    n.inputs.push_back({"k", {DataType::kInt32, {1}}});
    n.outputs.push_back({"y", {DataType::kFloat32, {-1}}});
    n.outputs.push_back({"z", {DataType::kBool, {-1}}});
    return n;
  }();
  return network;
}

// Takes every event: the read's outcome is the text's alone.
class AcceptEverything final : public JsonEventHandler {
 public:
  bool Null() override { return true; }
  bool Bool(bool) override { return true; }
  bool Int64(int64_t) override { return true; }
  bool Uint64(uint64_t) override { return true; }
  bool Double(double) override { return true; }
  bool String(std::string_view) override { return true; }
  bool Key(std::string_view) override { return true; }
  bool BeginObject() override { return true; }
  bool EndObject() override { return true; }
  bool BeginArray() override { return true; }
  bool EndArray() override { return true; }
  bool NumberOutOfRange(std::string_view) override { return false; }
  Status StopReason() const override { return InvalidArgument("a number out of range"); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t newline = input.find('\n');
  // The body in a buffer of its own, so that ASan sees a read past its end.
  const std::string body = newline == std::string::npos ? input : input.substr(newline + 1);
  const std::string header = newline == std::string::npos ? "" : input.substr(0, newline);
  auto split = SplitInferenceBody(body, header);
  if (!split.ok()) {
    volatile std::size_t sink = split.error().message().size();
    (void)sink;
    return 0;
  }
  // nlohmann's SAX parse nests without a limit, but fuzz inputs are short. It also ends the text
  // at a NUL byte, which JSON never holds: the reader refuses every text with one.
  AcceptEverything handler;
  const bool read = ReadJsonEvents(split->json, 1 << 20, handler).ok();
  if (split->json.find('\0') != std::string_view::npos
          ? read
          : read != nlohmann::json::accept(split->json))
    std::abort();
  auto parsed = ParseInferenceRequest(*split, FuzzNetwork(), ParseLimits{.max_json_depth = 16});
  if (!parsed.ok()) {
    volatile std::size_t sink = parsed.error().message().size();
    (void)sink;
    return 0;
  }
  // A parsed request renders: two of its inputs as the outputs, binary where it asked, and JSON.
  std::vector<Tensor> outputs;
  outputs.push_back(std::move(parsed->inputs[0]));
  outputs.push_back(std::move(parsed->inputs[2]));
  const auto rendered =
      RenderInferenceResponseWithBinary("fuzz", 1, *parsed, FuzzNetwork(), outputs);
  const auto text = RenderInferenceResponse("fuzz", 1, *parsed, FuzzNetwork(), outputs);
  volatile std::size_t sink = rendered.body.size() + rendered.json_length + text.size();
  (void)sink;
  return 0;
}
