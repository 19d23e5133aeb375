// libFuzzer target for the REST infer parser (server/kserve_rest/json_request_reader.cpp): a body,
// JSON or JSON plus binary tensor data, must give a request or an error, never a crash, a read
// outside the body, a write outside a tensor or a hang. An input is the
// Inference-Header-Content-Length header's text, a newline, then the body; an input without a
// newline is a body sent without the header (all JSON). A parsed request is rendered back, binary
// and JSON.
//
// Checked (a difference aborts):
//  - the JSON reader under the parser (server/http/json_events.cpp) accepts exactly what nlohmann
//    accepts (but a text with a NUL byte, which nlohmann reads as its end);
//  - REST and gRPC agree on the same request: a request REST accepts, sent as a gRPC client holding
//    those tensors would send it (a ModelInferRequest built here, once with raw_input_contents and
//    once with typed contents), is accepted by ParseGrpcInferRequest
//    (server/kserve_grpc/grpc_tensors.cpp) with the same inputs (datatype, shape, bytes), the same
//    requested outputs and the same id. Not compared: an empty id (gRPC's "" is "no id"), and
//    whether an output goes back binary (REST's extension; gRPC answers raw when asked raw).
// grpc_request_fuzz checks the other direction from gRPC messages.
// Seeds: corpus/inference_request; dictionary: inference_request.dict.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "grpc_service.pb.h"
#include "http/json_events.hpp"
#include "kserve_grpc/grpc_tensors.hpp"
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

template <typename T, typename Repeated>
void AddElements(const Tensor& tensor, Repeated* out) {
  for (const T value : tensor.Elements<T>())
    out->Add(value);
}

// `request` as a gRPC client holding its tensors sends it: raw bytes or typed contents.
inference::ModelInferRequest AsGrpc(const InferenceRequest& request, bool raw) {
  inference::ModelInferRequest message;
  message.set_model_name("fuzz");
  if (request.id)
    message.set_id(*request.id);
  for (std::size_t i = 0; i < request.inputs.size(); ++i) {
    const Tensor& tensor = request.inputs[i];
    auto& input = *message.add_inputs();
    input.set_name(FuzzNetwork().inputs[i].name);
    input.set_datatype(std::string(ToString(tensor.info().type)));
    for (const int64_t dim : tensor.info().shape)
      input.add_shape(dim);
    if (raw) {
      message.add_raw_input_contents(reinterpret_cast<const char*>(tensor.bytes().data()),
                                     tensor.bytes().size());
      continue;
    }
    auto& contents = *input.mutable_contents();
    switch (tensor.info().type) {
      case DataType::kFloat32:
        AddElements<float>(tensor, contents.mutable_fp32_contents());
        break;
      case DataType::kFloat64:
        AddElements<double>(tensor, contents.mutable_fp64_contents());
        break;
      case DataType::kInt64:
        AddElements<int64_t>(tensor, contents.mutable_int64_contents());
        break;
      case DataType::kInt32:
        AddElements<int32_t>(tensor, contents.mutable_int_contents());
        break;
      case DataType::kInt8:
        AddElements<int8_t>(tensor, contents.mutable_int_contents());
        break;
      case DataType::kUint8:
        AddElements<uint8_t>(tensor, contents.mutable_uint_contents());
        break;
      case DataType::kBool:
        AddElements<bool>(tensor, contents.mutable_bool_contents());
        break;
      case DataType::kUndefined:
        break;
    }
  }
  for (const std::size_t index : request.outputs)
    message.add_outputs()->set_name(FuzzNetwork().outputs[index].name);
  return message;
}

[[noreturn]] void Differ(const std::string& what, const inference::ModelInferRequest& message) {
  std::fprintf(stderr,
               "inference_request_fuzz: REST and gRPC differ on the same request: %s\n"
               "gRPC message:\n%s\n",
               what.c_str(), message.DebugString().c_str());
  std::abort();
}

void CompareWithGrpc(const InferenceRequest& rest, bool raw) {
  const auto message = AsGrpc(rest, raw);
  auto grpc = ParseGrpcInferRequest(message, FuzzNetwork());
  if (!grpc.ok())
    Differ("REST accepts it, gRPC refuses it: " + grpc.error().ToString(), message);
  if (rest.id.value_or("") != grpc->id.value_or(""))
    Differ("the id", message);
  if (grpc->inputs.size() != rest.inputs.size())
    Differ("the number of inputs", message);
  for (std::size_t i = 0; i < rest.inputs.size(); ++i) {
    const Tensor& a = rest.inputs[i];
    const Tensor& b = grpc->inputs[i];
    if (a.info() != b.info())
      Differ("input '" + FuzzNetwork().inputs[i].name + "': its datatype or shape", message);
    if (a.bytes().size() != b.bytes().size() ||
        (!a.bytes().empty() && std::memcmp(a.data(), b.data(), a.bytes().size()) != 0))
      Differ("input '" + FuzzNetwork().inputs[i].name + "': its bytes", message);
  }
  if (grpc->outputs != rest.outputs)
    Differ("the requested outputs", message);
}

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
  CompareWithGrpc(*parsed, /*raw=*/true);
  CompareWithGrpc(*parsed, /*raw=*/false);
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
