// The streaming parser of infer bodies (kserve_rest/kserve_json.hpp): key order, errors in
// document order, numbers JSON cannot hold, the depth limit, and the binary tensor data
// extension; and where gRPC's mapping (kserve_grpc/grpc_tensors.hpp) must answer as REST does.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "grpc_service.pb.h"
#include "kserve_grpc/grpc_tensors.hpp"
#include "kserve_rest/kserve_json.hpp"

namespace backplane::server {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// x: FP32 [-1, 3]; flags: BOOL [2]; ids: INT64 [2]. Outputs y (FP32) and z (INT64).
Network ThreeInputs() {
  Network network;
  network.name = "three";
  network.inputs.push_back({"x", {DataType::kFloat32, {-1, 3}}});
  network.inputs.push_back({"flags", {DataType::kBool, {2}}});
  network.inputs.push_back({"ids", {DataType::kInt64, {2}}});
  network.outputs.push_back({"y", {DataType::kFloat32, {-1}}});
  network.outputs.push_back({"z", {DataType::kInt64, {-1}}});
  return network;
}

constexpr char kFlagsAndIds[] =
    R"({"name":"flags","shape":[2],"datatype":"BOOL","data":[true,false]},)"
    R"({"name":"ids","shape":[2],"datatype":"INT64","data":[-9007199254740993,7]})";

Result<InferenceRequest> Parse(std::string_view json_text, std::string_view binary = {},
                               int max_depth = 32) {
  static const Network network = ThreeInputs();
  return ParseInferenceRequest(
      InferenceBody{.json = json_text, .binary = binary, .has_binary_header = !binary.empty()},
      network, ParseLimits{.max_json_depth = max_depth});
}

// The request with input x as given.
std::string WithX(const std::string& x) {
  return R"({"inputs":[)" + x + "," + kFlagsAndIds + "]}";
}

std::string Error(const Result<InferenceRequest>& parsed) {
  return parsed.ok() ? std::string("ok") : parsed.error().message();
}

TEST(InferenceParserTest, DataBeforeShapeAndDatatypeReadsTheSame) {
  for (const std::string& x :
       {std::string(R"({"name":"x","shape":[2,3],"datatype":"FP32","data":[1,2,3,4,5,6.5]})"),
        std::string(R"({"data":[[1,2,3],[4,5,6.5]],"shape":[2,3],"datatype":"FP32","name":"x"})"),
        std::string(R"({"data":[1,2,3,4,5,6.5],"name":"x","datatype":"FP32","shape":[2,3]})")}) {
    auto parsed = Parse(WithX(x));
    ASSERT_TRUE(parsed.ok()) << x << ": " << parsed.error().ToString();
    ASSERT_EQ(parsed->inputs.size(), 3u);
    EXPECT_EQ(parsed->inputs[0].info().shape, (Shape{2, 3}));
    const auto values = parsed->inputs[0].Elements<float>();
    EXPECT_EQ(std::vector<float>(values.begin(), values.end()),
              (std::vector<float>{1, 2, 3, 4, 5, 6.5f}));
    EXPECT_EQ(parsed->inputs[1].Elements<uint8_t>()[0], 1);
    EXPECT_EQ(parsed->inputs[2].Elements<int64_t>()[0], -9007199254740993);
  }
}

// Zero rows: an empty tensor, whatever the key order (with "data" first it is read from the
// events kept until the shape is known; its buffer is null, and it was once taken for one not
// kept: a 500).
TEST(InferenceParserTest, ZeroRowsParseInEveryKeyOrder) {
  for (const std::string& x :
       {std::string(R"({"name":"x","shape":[0,3],"datatype":"FP32","data":[]})"),
        std::string(R"({"data":[],"datatype":"FP32","name":"x","shape":[0,3]})")}) {
    auto parsed = Parse(WithX(x));
    ASSERT_TRUE(parsed.ok()) << x << ": " << parsed.error().ToString();
    EXPECT_EQ(parsed->inputs[0].info().shape, (Shape{0, 3})) << x;
    EXPECT_TRUE(parsed->inputs[0].bytes().empty()) << x;
  }
}

TEST(InferenceParserTest, KeyOrderDoesNotChangeTheMessage) {
  for (const auto& [first, later] : std::vector<std::pair<std::string, std::string>>{
           {R"({"name":"x","shape":[1,3],"datatype":"FP32","data":[1,2]})",
            R"({"data":[1,2],"datatype":"FP32","shape":[1,3],"name":"x"})"},
           {R"({"name":"x","shape":[1,3],"datatype":"FP32","data":[1,"two",3]})",
            R"({"data":[1,"two",3],"name":"x","shape":[1,3],"datatype":"FP32"})"},
           {R"({"name":"x","shape":[2,3],"datatype":"FP32","data":[[1,2,3],[4,5]]})",
            R"({"data":[[1,2,3],[4,5]],"shape":[2,3],"name":"x","datatype":"FP32"})"}}) {
    const std::string message = Error(Parse(WithX(first)));
    EXPECT_NE(message, "ok");
    EXPECT_EQ(Error(Parse(WithX(later))), message);
  }
  EXPECT_THAT(Error(Parse(WithX(R"({"data":[1,2],"shape":[1,3],"name":"x","datatype":"FP32"})"))),
              HasSubstr("input 'x': 'data' has 2 element(s), shape [1,3] needs 3"));
}

TEST(InferenceParserTest, NestedDataErrorsComeInDocumentOrder) {
  // The first thing wrong in the text is the one named; a level's length is checked at its
  // closing bracket.
  EXPECT_THAT(Error(Parse(WithX(
                  R"({"name":"x","shape":[2,3],"datatype":"FP32","data":[[1,2],[1,2,3],[1]]})"))),
              HasSubstr("nested data has 2 element(s) at depth 1, shape [2,3] needs 3"));
  EXPECT_THAT(
      Error(Parse(WithX(
          R"({"name":"x","shape":[2,3],"datatype":"FP32","data":[[1,2,3],[4,5,6],[7,8,9]]})"))),
      HasSubstr("nested data has 3 element(s) at depth 0, shape [2,3] needs 2"));
  EXPECT_THAT(Error(Parse(WithX(
                  R"({"name":"x","shape":[2,3],"datatype":"FP32","data":[[1,2,3],[1,[2],3]]})"))),
              HasSubstr("input 'x': nested data is deeper than shape [2,3]"));
  EXPECT_THAT(
      Error(Parse(WithX(R"({"name":"x","shape":[2,3],"datatype":"FP32","data":[[1,2,3],4]})"))),
      HasSubstr("nested data is shallower than shape [2,3] (a scalar at depth 0)"));
  EXPECT_THAT(Error(Parse(WithX(
                  R"({"name":"x","shape":[2,3],"datatype":"FP32","data":[[1,"a",3],[1,2]]})"))),
              HasSubstr("input 'x' element 1 is \"a\", expected a number for FP32"));
  EXPECT_THAT(
      Error(Parse(WithX(R"({"name":"x","shape":[2,3],"datatype":"FP32","data":[[1,2,3],[1,2]]})"))),
      HasSubstr("nested data has 2 element(s) at depth 1, shape [2,3] needs 3"));
  EXPECT_THAT(
      Error(Parse(WithX(R"({"name":"x","shape":[1,3],"datatype":"FP32","data":[1,[2],3,4]})"))),
      HasSubstr("'data' mixes arrays and scalars at the top level"));
  EXPECT_THAT(
      Error(Parse(WithX(R"({"name":"x","shape":[1,3],"datatype":"FP32","data":[1,"b",3,4]})"))),
      HasSubstr("input 'x' element 1 is \"b\""));
  EXPECT_THAT(
      Error(Parse(WithX(R"({"name":"x","shape":[1,3],"datatype":"FP32","data":[1,2,3,4]})"))),
      HasSubstr("'data' has 4 element(s), shape [1,3] needs 3"));
  EXPECT_THAT(
      Error(Parse(WithX(R"({"name":"x","shape":[1,3],"datatype":"FP32","data":[1,{"a":[1]},3]})"))),
      HasSubstr("'data' mixes arrays and scalars at the top level"));
  EXPECT_THAT(Error(Parse(WithX(R"({"name":"x","shape":[1,3],"datatype":"FP32","data":{"a":1}})"))),
              HasSubstr("input 'x': 'data' (an array) is required"));
}

TEST(InferenceParserTest, UnknownKeysAreNamedInDocumentOrder) {
  EXPECT_THAT(Error(Parse(R"({"zeta":1,"alpha":2,"inputs":[]})")),
              HasSubstr("inference request: unknown key 'zeta'"));
  EXPECT_THAT(Error(Parse(WithX(
                  R"({"name":"x","zz":1,"aa":2,"shape":[1,3],"datatype":"FP32","data":[1,2,3]})"))),
              HasSubstr("input 'x': unknown key 'zz'"));
}

TEST(InferenceParserTest, NumbersNoDoubleHoldsNameTheirPlace) {
  EXPECT_EQ(
      Error(Parse(WithX(R"({"name":"x","shape":[1,3],"datatype":"FP32","data":[1,2,1e400]})"))),
      "input 'x': element 2: 1e400 is out of the FP32 range");
  EXPECT_EQ(
      Error(Parse(WithX(R"({"name":"x","shape":[1,3],"datatype":"FP32","data":[[-1e400,2,3]]})"))),
      "input 'x': element 0: -1e400 is out of the FP32 range");
  // Before the datatype is known the element is still named.
  EXPECT_EQ(
      Error(Parse(WithX(R"({"name":"x","data":[1,1e999,3],"shape":[1,3],"datatype":"FP32"})"))),
      "input 'x': element 1: 1e999 is out of range (larger than any double)");
  EXPECT_THAT(Error(Parse(WithX(R"({"name":"x","shape":[1,1e400],"datatype":"FP32","data":[]})"))),
              HasSubstr("input 'x': 'shape': 1e400 is out of range"));
  EXPECT_THAT(Error(Parse(R"({"id":"a","parameters":{"p":1e400},"inputs":[]})")),
              HasSubstr("'parameters': 1e400 is out of range"));
  // Every place of the request names itself: the body, "inputs", an input refused whatever its
  // data say, an input whose data came before its name, a skipped key, a scalar "data".
  const std::string kBeyond = " is out of range (larger than any double)";
  EXPECT_EQ(Error(Parse("1e400")), "1e400" + kBeyond);
  EXPECT_EQ(Error(Parse(R"({"inputs":[1e400]})")), "'inputs': 1e400" + kBeyond);
  EXPECT_EQ(Error(Parse(R"({"inputs":[[1e400]]})")), "'inputs': 1e400" + kBeyond);
  EXPECT_EQ(Error(Parse(R"({"inputs":[{"name":"nope","data":[1,1e400]}]})")),
            "input 'nope': element 0: 1e400" + kBeyond);
  EXPECT_EQ(Error(Parse(R"({"inputs":[{"data":[1,2,1e400]}]})")),
            "inputs[0]: element 2: 1e400" + kBeyond);
  EXPECT_EQ(Error(Parse(R"({"zeta":[{"k":1e400}]})")), "'zeta': 1e400" + kBeyond);
  EXPECT_EQ(Error(Parse(R"({"inputs":[{"name":"x","data":1e400}]})")),
            "input 'x': 'data': 1e400" + kBeyond);
  // Finite but beyond FP32: the element and its value.
  EXPECT_THAT(
      Error(Parse(WithX(R"({"name":"x","shape":[1,3],"datatype":"FP32","data":[1,2,1e300]})"))),
      HasSubstr("input 'x' element 2 is 1e+300, out of range for FP32"));
}

TEST(InferenceParserTest, RefusesEmptyShapeWhoseOtherDimsOverflow) {
  // No elements, but kernels multiply the other dims (2^80 here) as rows and columns: the bound
  // is on the non-zero dims (core's kMaxElementCount), in JSON, binary and gRPC requests alike.
  Network network;
  network.name = "dynamic";
  network.inputs.push_back({"x", {DataType::kFloat32, {-1, -1, -1}}});
  network.outputs.push_back({"y", {DataType::kFloat32, {-1, -1, -1}}});
  const std::string x =
      R"({"inputs":[{"name":"x","shape":[0,1099511627776,1099511627776],"datatype":"FP32",)";
  for (const std::string& data :
       {std::string(R"("data":[]}]})"), std::string(R"("parameters":{"binary_data_size":0}}]})")}) {
    auto parsed = ParseInferenceRequest(
        InferenceBody{.json = x + data, .binary = {}, .has_binary_header = false}, network,
        ParseLimits{});
    ASSERT_FALSE(parsed.ok()) << data;
    EXPECT_EQ(parsed.error().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.error().message(), HasSubstr("needs too many")) << data;
  }
}

TEST(InferenceParserTest, DepthIsLimitedBeforeParsing) {
  const std::string deep =
      WithX(R"({"name":"x","shape":[1,3],"datatype":"FP32","data":[[[[[[1]]]]]]})");
  EXPECT_THAT(Error(Parse(deep, {}, 6)), HasSubstr("malformed JSON: nested deeper than 6 levels"));
  EXPECT_THAT(Error(Parse(std::string(100000, '['), {}, 32)),
              HasSubstr("nested deeper than 32 levels at byte 32 (max_json_depth)"));
  EXPECT_THAT(Error(Parse(R"({"inputs": [)")), HasSubstr("malformed JSON: parse error"));
  EXPECT_THAT(Error(Parse("")), HasSubstr("the request body is empty"));
}

std::string Bytes(const void* data, std::size_t size) {
  return std::string(static_cast<const char*>(data), size);
}

TEST(InferenceParserTest, BinaryInputsTakeTheirBytesInInputOrder) {
  const float x[] = {1.5f, -2, 3, 4, 5, 6};
  const uint8_t flags[] = {0, 1};
  const int64_t ids[] = {std::numeric_limits<int64_t>::min(), 42};
  // The request's input order (ids, x, flags) is the order of the bytes, not the model's.
  const std::string header =
      R"({"inputs":[{"name":"ids","shape":[2],"datatype":"INT64","parameters":{"binary_data_size":16}},)"
      R"({"name":"x","shape":[2,3],"datatype":"FP32","parameters":{"binary_data_size":24}},)"
      R"({"name":"flags","shape":[2],"datatype":"BOOL","parameters":{"binary_data_size":2}}],)"
      R"("outputs":[{"name":"z","parameters":{"binary_data":true}},{"name":"y"}]})";
  const std::string binary = Bytes(ids, sizeof ids) + Bytes(x, sizeof x) + Bytes(flags, 2);
  auto parsed = Parse(header, binary);
  ASSERT_TRUE(parsed.ok()) << parsed.error().ToString();
  EXPECT_EQ(parsed->inputs[0].Elements<float>()[0], 1.5f);
  EXPECT_EQ(parsed->inputs[0].Elements<float>()[5], 6.0f);
  EXPECT_EQ(parsed->inputs[1].Elements<uint8_t>()[1], 1);
  EXPECT_EQ(parsed->inputs[2].Elements<int64_t>()[0], std::numeric_limits<int64_t>::min());
  EXPECT_EQ(parsed->outputs, (std::vector<std::size_t>{1, 0}));
  EXPECT_EQ(parsed->binary_outputs, (std::vector<bool>{true, false}));
}

TEST(InferenceParserTest, BinaryOutputsDefaultToTheRequestParameter) {
  auto all =
      Parse(R"({"parameters":{"binary_data_output":true},"inputs":[)" +
            std::string(R"({"name":"x","shape":[1,3],"datatype":"FP32","data":[1,2,3]},)") +
            kFlagsAndIds +
            R"(],"outputs":[{"name":"y"},{"name":"z","parameters":{"binary_data":false}}]})");
  ASSERT_TRUE(all.ok()) << all.error().ToString();
  EXPECT_EQ(all->binary_outputs, (std::vector<bool>{true, false}));
}

TEST(InferenceParserTest, BadBinaryRequestsNameWhatIsWrong) {
  const std::string ids_and_flags =
      R"({"name":"flags","shape":[2],"datatype":"BOOL","data":[true,false]},)"
      R"({"name":"ids","shape":[2],"datatype":"INT64","data":[1,2]})";
  const auto x_binary = [&](const std::string& parameters, const std::string& extra = "") {
    return R"({"inputs":[{"name":"x","shape":[1,3],"datatype":"FP32")" + extra +
           R"(,"parameters":)" + parameters + "}," + ids_and_flags + "]}";
  };
  const std::string twelve(12, '\0');
  EXPECT_EQ(Error(Parse(x_binary(R"({"binary_data_size":8})"), twelve)),
            "input 'x': binary_data_size is 8 byte(s), shape [1,3] of FP32 needs 12");
  EXPECT_EQ(Error(Parse(x_binary(R"({"binary_data_size":12})", R"(,"data":[1,2,3])"), twelve)),
            "input 'x': has both 'data' and parameter 'binary_data_size'; send one of them");
  EXPECT_THAT(Error(Parse(x_binary(R"({"binary_data_size":12})"), std::string(8, '\0'))),
              HasSubstr("input 'x': binary_data_size 12 runs past the binary data (8 byte(s) "
                        "after the JSON header, 0 taken by earlier inputs)"));
  EXPECT_EQ(Error(Parse(x_binary(R"({"binary_data_size":12})"), std::string(20, '\0'))),
            "the binary data after the JSON header is 20 byte(s), but the inputs' "
            "binary_data_size add up to 12");
  EXPECT_THAT(Error(Parse(x_binary(R"({"binary_data_size":12})"))),
              HasSubstr("no Inference-Header-Content-Length header"));
  EXPECT_THAT(
      Error(Parse(x_binary(R"({"binary_data_size":-12})"), twelve)),
      HasSubstr("'binary_data_size' must be a byte count (a non-negative integer), got -12"));
  EXPECT_THAT(Error(Parse(x_binary(R"({"binary_data":true})"), twelve)),
              HasSubstr("parameter 'binary_data' belongs on a requested output"));
  // BOOL is one byte per element, 0 or 1.
  const std::string flags_binary =
      R"({"inputs":[{"name":"x","shape":[1,3],"datatype":"FP32","data":[1,2,3]},)"
      R"({"name":"flags","shape":[2],"datatype":"BOOL","parameters":{"binary_data_size":2}},)"
      R"({"name":"ids","shape":[2],"datatype":"INT64","data":[1,2]}]})";
  EXPECT_THAT(Error(Parse(flags_binary, std::string("\x01\x02", 2))),
              HasSubstr("input 'flags': BOOL binary data holds a byte other than 0 or 1"));
}

// Found by grpc_request_fuzz (REST and gRPC must agree): raw_input_contents for a BOOL input were
// copied as they came, so a byte of 2 became a bool no C++ code may read, where REST's binary
// data refuses it.
TEST(InferenceParserTest, GrpcRawBoolBytesAreZeroOrOneAsInRestBinaryData) {
  const Network network = ThreeInputs();
  auto request = [](std::string flags) {
    inference::ModelInferRequest message;
    const std::pair<const char*, const char*> inputs[] = {
        {"x", "FP32"}, {"flags", "BOOL"}, {"ids", "INT64"}};
    for (const auto& [name, datatype] : inputs) {
      auto* input = message.add_inputs();
      input->set_name(name);
      input->set_datatype(datatype);
    }
    message.mutable_inputs(0)->add_shape(1);
    message.mutable_inputs(0)->add_shape(3);
    message.mutable_inputs(1)->add_shape(2);
    message.mutable_inputs(2)->add_shape(2);
    message.add_raw_input_contents(std::string(12, '\0'));
    message.add_raw_input_contents(std::move(flags));
    message.add_raw_input_contents(std::string(16, '\0'));
    return message;
  };
  const auto accepted = ParseGrpcInferRequest(request(std::string("\x01\x00", 2)), network);
  ASSERT_TRUE(accepted.ok()) << accepted.error().ToString();
  ASSERT_EQ(accepted->inputs[1].bytes().size(), 2u);
  EXPECT_EQ(accepted->inputs[1].bytes()[0], std::byte{1});
  EXPECT_EQ(accepted->inputs[1].bytes()[1], std::byte{0});

  const auto refused = ParseGrpcInferRequest(request(std::string("\x01\x02", 2)), network);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.error().message(),
            "input 'flags': BOOL binary data holds a byte other than 0 or 1");
}

TEST(InferenceParserTest, SplitsTheBodyAtTheHeaderLength) {
  auto split = SplitInferenceBody("{}abc", "2");
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->json, "{}");
  EXPECT_EQ(split->binary, "abc");
  EXPECT_EQ(SplitInferenceBody("{}abc", "")->json, "{}abc");
  EXPECT_EQ(SplitInferenceBody("{}", "9").error().message(),
            "Inference-Header-Content-Length is 9 but the body has only 2 byte(s)");
  EXPECT_EQ(SplitInferenceBody("{}", "2x").error().message(),
            "Inference-Header-Content-Length '2x' is not a byte count");
}

TEST(InferenceParserTest, RendersBinaryOutputsAfterTheJson) {
  Network network;
  network.outputs.push_back({"y", {DataType::kFloat32, {2}}});
  network.outputs.push_back({"b", {DataType::kBool, {2}}});
  Tensor y(TensorInfo{DataType::kFloat32, {2}});
  y.Elements<float>()[0] = 0.5f;
  y.Elements<float>()[1] = -1;
  Tensor b(TensorInfo{DataType::kBool, {2}});
  b.Elements<uint8_t>()[1] = 1;
  InferenceRequest request;
  request.outputs = {1, 0};
  request.binary_outputs = {true, true};
  std::vector<Tensor> outputs;
  outputs.push_back(std::move(y));
  outputs.push_back(std::move(b));
  const auto rendered = RenderInferenceResponseWithBinary("m", 1, request, network, outputs);
  ASSERT_TRUE(rendered.has_binary);
  const std::string header = rendered.body.substr(0, rendered.json_length);
  EXPECT_EQ(header,
            R"({"model_name":"m","model_version":"1","outputs":[{"name":"b","datatype":"BOOL",)"
            R"("shape":[2],"parameters":{"binary_data_size":2}},{"name":"y","datatype":"FP32",)"
            R"("shape":[2],"parameters":{"binary_data_size":8}}]})");
  ASSERT_EQ(rendered.body.size(), rendered.json_length + 10);
  EXPECT_EQ(rendered.body.substr(rendered.json_length, 2), std::string("\x00\x01", 2));
  float y_back[2];
  std::memcpy(y_back, rendered.body.data() + rendered.json_length + 2, sizeof y_back);
  EXPECT_EQ(y_back[0], 0.5f);
  EXPECT_EQ(y_back[1], -1.0f);
  // The JSON-only rendering ignores the request's binary flags.
  EXPECT_THAT(RenderInferenceResponse("m", 1, request, network, outputs),
              HasSubstr(R"("data":[false,true])"));
}

// Issue 44: a 1 MiB string element or a 1 MiB-digit number came back whole in the 400 (1,048,673
// bytes). Every client value a message quotes is cut at kMaxQuotedBytes, its size said.
TEST(InferenceParserTest, MessagesQuoteABoundedPartOfAnyClientValue) {
  const std::string mib_string = "\"" + std::string(std::size_t{1} << 20, 's') + "\"";
  const std::string mib_number = "1" + std::string((std::size_t{1} << 20) - 1, '0');
  const std::string long_key(100000, 'k');
  struct Case {
    std::string request;
    std::string message;
  };
  const Case cases[] = {
      {WithX(R"({"name":"x","shape":[1,3],"datatype":"FP32","data":[1,)" + mib_string + ",3]}"),
       "input 'x' element 1 is \"sss"},
      {WithX(R"({"name":"x","shape":[1,3],"datatype":"FP32","data":[1,)" + mib_number + ",3]}"),
       "10000"},
      {WithX(R"({"name":"x","shape":[)" + mib_string + R"(,3],"datatype":"FP32","data":[1,2,3]})"),
       "input 'x': 'shape' holds \"sss"},
      {R"({"id":[)" + mib_string + "]," +
           WithX(R"({"name":"x","shape":[1,3],"datatype":"FP32",)"
                 R"("data":[1,2,3]})")
               .substr(1),
       "'id' must be a string, got [\"sss"},
      {R"({")" + long_key + R"(":1,)" +
           WithX(R"({"name":"x","shape":[1,3],"datatype":"FP32",)"
                 R"("data":[1,2,3]})")
               .substr(1),
       "inference request: unknown key 'kkk"},
      {WithX(R"({"name":"x","shape":[1,3],"datatype":"FP32","data":[1,2,3],")" + long_key +
             R"(":1})"),
       "unknown key 'kkk"},
  };
  for (const Case& c : cases) {
    const std::string message = Error(Parse(c.request));
    EXPECT_LT(message.size(), 400u) << message.substr(0, 400);
    EXPECT_THAT(message, HasSubstr(c.message)) << message.substr(0, 400);
    EXPECT_THAT(message, ::testing::ContainsRegex("\\.\\.\\.'? \\([0-9]+ bytes\\)"))
        << message.substr(0, 400);
  }
}

}  // namespace
}  // namespace backplane::server
