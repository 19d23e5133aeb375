// The pure parts of `backplane serve` on their own: config files, listen addresses, KServe JSON
// tensors of every datatype (the example models take FP32 only), JSON depth, metrics text; and
// the model repository in-process, on a runtime of its own.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <future>
#include <limits>
#include <thread>
#include <vector>

#include "backplane/loader/loader.hpp"
#include "config/server_config.hpp"
#include "http/body_budget.hpp"
#include "http/http_server.hpp"
#include "kserve_rest/kserve_json.hpp"
#include "metrics/metrics.hpp"
#include "serve_test_util.hpp"
#include "serving/model_repository.hpp"
#include "test_util.hpp"

namespace backplane::server {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// REST's statuses for the runtime's codes, as gRPC's codes map to HTTP: the two transports give
// one failure the same meaning (an empty batch CpuAcc cannot run was 400 on REST and
// UNIMPLEMENTED on gRPC).
TEST(HttpStatusTest, CodesMapAsTheirGrpcCounterparts) {
  EXPECT_EQ(HttpStatusFor(StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(StatusCode::kUnimplemented), 501);
  EXPECT_EQ(HttpStatusFor(StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFor(StatusCode::kResourceExhausted), 503);
  EXPECT_EQ(HttpStatusFor(StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatusFor(StatusCode::kInternal), 500);
}

TEST(ServeConfigTest, AnUnknownKeyIsNamedWithTheKnownOnes) {
  testing::TempDir dir;
  testing::WriteFile(dir / "serve.json", R"({"listen": "127.0.0.1:9000", "max_inflight": 3})");
  ServeConfig config = DefaultServeConfig();
  Status status = ApplyConfigFile(dir / "serve.json", config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("unknown key 'max_inflight' (known: models, backends,"));
  // All or nothing: the valid key before it was not applied either.
  EXPECT_EQ(config.listen, "127.0.0.1:8000");
}

TEST(ServeConfigTest, ValuesAreTypedAndRangeChecked) {
  testing::TempDir dir;
  const auto apply = [&](const std::string& text) {
    testing::WriteFile(dir / "serve.json", text);
    ServeConfig config = DefaultServeConfig();
    return ApplyConfigFile(dir / "serve.json", config).message();
  };
  EXPECT_THAT(apply(R"({"max_buffered_body_bytes": -1})"),
              HasSubstr("'max_buffered_body_bytes' must be between 1024 and 1099511627776"));
  EXPECT_THAT(apply(R"({"max_buffered_body_bytes": "256M"})"),
              HasSubstr("'max_buffered_body_bytes' must be an integer"));
  EXPECT_THAT(apply(R"({"max_body_bytes": 1048576, "max_buffered_body_bytes": 65536})"),
              HasSubstr("'max_buffered_body_bytes' (65536) must be at least 'max_body_bytes' "
                        "(1048576)"));
  EXPECT_THAT(apply(R"({"http_threads": 0})"),
              HasSubstr("'http_threads' must be between 1 and 4096, got 0"));
  EXPECT_THAT(apply(R"({"watch_backends": "yes"})"),
              HasSubstr("'watch_backends' must be true or false"));
  EXPECT_THAT(apply(R"({"swap_policy": "hot"})"),
              HasSubstr("'swap_policy' must be \"migrate\" or \"pin\""));
  EXPECT_THAT(apply(R"({"listen": "8000"})"), HasSubstr("listen address '8000' has no port"));
  EXPECT_THAT(apply(R"({"grpc_listen": "8001"})"),
              HasSubstr("'grpc_listen': listen address '8001' has no port"));
  EXPECT_THAT(apply(R"({"backends": "/opt"})"), HasSubstr("must be an array of strings"));
  EXPECT_THAT(apply("[]"), HasSubstr("must hold a JSON object"));
  EXPECT_THAT(apply("{"), HasSubstr("is not valid JSON"));
}

// Found by tests/fuzz/model_config_fuzz: a file of deeply nested arrays parsed (nlohmann's parser
// keeps its stack on the heap), then the error message's dump() of the value recursed once per
// level and overflowed the stack. Both config parsers now refuse the nesting before any value is
// kept.
std::string DeeplyNested(std::string_view key, int depth) {
  return "{\"" + std::string(key) + "\": " + std::string(depth, '[') + std::string(depth, ']') +
         "}";
}

TEST(ServeConfigTest, RefusesNestingDeeperThanAConfigFileNeeds) {
  ServeConfig config = DefaultServeConfig();
  const Status status =
      ApplyConfigText(DeeplyNested("backends", 1'000'000), "/etc/serve.json", config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "config file /etc/serve.json nests JSON deeper than 16 levels (a config file needs 3 "
            "at most)");
  EXPECT_FALSE(config.backends.has_value());  // untouched
  // A comment's brackets are no nesting.
  EXPECT_TRUE(
      ApplyConfigText("// [[[[[[[[[[[[[[[[[[[[\n{\"backends\": [\"b\"]}", "/s.json", config).ok());
}

TEST(ModelRepositoryTest, RefusesAConfigJsonNestedDeeperThanAConfigNeeds) {
  for (const char* key : {"backends", "version_policy", "max_in_flight"}) {
    auto config = ParseModelConfigText(DeeplyNested(key, 1'000'000), "repo/m/config.json");
    ASSERT_FALSE(config.ok()) << key;
    EXPECT_EQ(config.error().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(config.error().message(),
              "repo/m/config.json nests JSON deeper than 16 levels (a config file needs 3 at "
              "most)");
  }
  // What a config needs still parses.
  auto config = ParseModelConfigText(R"({"version_policy": {"specific": [2, 1]}})", "c.json");
  ASSERT_TRUE(config.ok()) << config.error().message();
  EXPECT_EQ(config->version_policy.versions, (std::vector<int64_t>{1, 2}));
}

TEST(ServeConfigTest, RelativePathsAreRelativeToTheFileAndEveryKeyApplies) {
  testing::TempDir dir;
  testing::WriteFile(dir / "serve.json", R"({
    // comments are allowed
    "models": "repo", "backends": ["be", "/abs"], "backend_preferences": ["CpuRef"],
    "listen": "[::1]:0", "log_level": "debug", "admin_token": "t", "http_threads": 4,
    "max_body_bytes": 2048, "max_buffered_body_bytes": 4096, "max_json_depth": 5,
    "max_header_bytes": 2048, "grpc_max_concurrent_streams": 50,
    "read_timeout_ms": 100, "write_timeout_ms": 200, "keep_alive_timeout_s": 3,
    "keep_alive_max_requests": 10, "inference_threads": 2, "max_in_flight": 7,
    "swap_policy": "pin", "watch_backends": false, "watch_debounce_ms": 10,
    "rescan_interval_ms": 0, "grpc_listen": "off", "deploy_policy": "progressive",
    "rollout": {"steps": [50, 100]}, "state_dir": "state", "crash_grace_s": 30})");
  ServeConfig config = DefaultServeConfig();
  ASSERT_TRUE(ApplyConfigFile(dir / "serve.json", config).ok());
  EXPECT_EQ(config.models, dir.path() / "repo");
  ASSERT_TRUE(config.backends.has_value());
  EXPECT_EQ(*config.backends, (std::vector<std::filesystem::path>{dir.path() / "be", "/abs"}));
  EXPECT_EQ(config.listen, "[::1]:0");
  EXPECT_EQ(config.max_body_bytes, 2048u);
  EXPECT_EQ(config.max_buffered_body_bytes, 4096u);
  EXPECT_EQ(config.grpc_max_concurrent_streams, 50);
  EXPECT_EQ(config.read_timeout, std::chrono::milliseconds(100));
  EXPECT_EQ(config.keep_alive_timeout, std::chrono::seconds(3));
  EXPECT_EQ(config.swap_policy, "pin");
  EXPECT_FALSE(config.watch_backends);
  EXPECT_EQ(config.rescan_interval, std::chrono::milliseconds(0));
  EXPECT_EQ(config.grpc_listen, "off");
  EXPECT_EQ(config.deploy_policy, "progressive");
  EXPECT_EQ(config.rollout.steps, (std::vector<double>{50, 100}));
  EXPECT_EQ(config.state_dir, dir.path() / "state");
  EXPECT_EQ(config.crash_grace, std::chrono::seconds(30));
  // Every key of the table is documented with its default.
  // 20 + the transport's five + grpc_listen + trust + max_buffered_body_bytes + rollout's two
  // + grpc_max_concurrent_streams + backend_isolation and worker + state_dir and crash_grace_s
  EXPECT_EQ(DescribeConfigKeys().size(), 38u);
}

TEST(ServeConfigTest, TrustedBackendsAreDigestsFromOneSource) {
  testing::TempDir dir;
  const std::string digest(64, 'a');
  const auto apply = [&](const std::string& text, ServeConfig& config) {
    testing::WriteFile(dir / "serve.json", text);
    return ApplyConfigFile(dir / "serve.json", config);
  };
  ServeConfig config = DefaultServeConfig();
  EXPECT_FALSE(config.trusted_backends.has_value());
  EXPECT_TRUE(config.trusted_backends_file.empty());
  auto none = MakeTrustPolicy(config);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none.share(), nullptr);

  // Upper case is read as sha256sum -c would, and kept lowercase like the loader's digests.
  ASSERT_TRUE(apply(R"({"trusted_backends": [")" + std::string(64, 'A') + R"("]})", config).ok());
  EXPECT_EQ(config.trusted_backends, std::vector<std::string>{digest});
  auto listed = MakeTrustPolicy(config);
  ASSERT_TRUE(listed.ok()) << listed.error().ToString();
  EXPECT_EQ(listed->Describe(), "1 digest(s) given at start");

  ServeConfig malformed = DefaultServeConfig();
  Status status = apply(R"({"trusted_backends": [")" + digest + R"(", "sha256:abc"]})", malformed);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "config file " + (dir / "serve.json").string() +
                                  ": 'trusted_backends' entry 1: 'sha256:abc' is not a SHA-256 "
                                  "digest: it has 10 characters, a digest 64 hex digits");
  EXPECT_FALSE(malformed.trusted_backends.has_value()) << "a bad file applies nothing";
  EXPECT_THAT(apply(R"({"trusted_backends": "abc"})", malformed).message(),
              HasSubstr("'trusted_backends' must be an array of strings"));

  // Both: refused, naming both keys.
  status =
      apply(R"({"trusted_backends": [], "trusted_backends_file": "trusted.sha256"})", malformed);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("'trusted_backends' and 'trusted_backends_file' are both set"));

  // The file: relative to the config file, read when the policy is made.
  ServeConfig from_file = DefaultServeConfig();
  ASSERT_TRUE(apply(R"({"trusted_backends_file": "trusted.sha256"})", from_file).ok());
  EXPECT_EQ(from_file.trusted_backends_file, dir.path() / "trusted.sha256");
  auto missing = MakeTrustPolicy(from_file);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message(),
            "'trusted_backends_file': cannot open trusted backend list " +
                (dir / "trusted.sha256").string() + ": No such file or directory");
  testing::WriteFile(dir / "trusted.sha256", digest + "  a.so\n" + digest.substr(1) + "  b.so\n");
  auto bad_line = MakeTrustPolicy(from_file);
  ASSERT_FALSE(bad_line.ok());
  EXPECT_THAT(bad_line.error().message(),
              HasSubstr("'trusted_backends_file': " + (dir / "trusted.sha256").string() +
                        " line 2: '" + digest.substr(1) + "' is not a SHA-256 digest"));
  testing::WriteFile(dir / "trusted.sha256", "# ci\n" + digest + "  a.so\n");
  auto good = MakeTrustPolicy(from_file);
  ASSERT_TRUE(good.ok()) << good.error().ToString();
  EXPECT_EQ(good->Describe(), "1 digest(s) from " + (dir / "trusted.sha256").string());
  // Signing keys: PEM files relative to the config file, read when the policy is made; with a
  // list, content either trusts loads.
  ServeConfig signed_config = DefaultServeConfig();
  EXPECT_THAT(apply(R"({"trusted_signing_keys": []})", signed_config).message(),
              HasSubstr("'trusted_signing_keys' is empty"));
  ASSERT_TRUE(apply(R"({"trusted_signing_keys": ["keys/ci.pub"], "trusted_backends_file": )"
                    R"("trusted.sha256"})",
                    signed_config)
                  .ok());
  ASSERT_TRUE(signed_config.trusted_signing_keys.has_value());
  EXPECT_EQ(*signed_config.trusted_signing_keys,
            std::vector<std::filesystem::path>{dir.path() / "keys/ci.pub"});
  auto no_key = MakeTrustPolicy(signed_config);
  ASSERT_FALSE(no_key.ok());
  EXPECT_THAT(no_key.error().message(),
              HasSubstr("'trusted_signing_keys': cannot open signing key " +
                        (dir / "keys/ci.pub").string()));
  std::filesystem::create_directory(dir / "keys");
  testing::WriteFile(dir / "keys/ci.pub",
                     "-----BEGIN PUBLIC KEY-----\n"
                     "MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n"
                     "-----END PUBLIC KEY-----\n");
  auto either = MakeTrustPolicy(signed_config);
  ASSERT_TRUE(either.ok()) << either.error().ToString();
  EXPECT_EQ(either->Describe(), "1 digest(s) from " + (dir / "trusted.sha256").string() +
                                    " or 1 signing key(s): " + (dir / "keys/ci.pub").string());

  EXPECT_THAT(ConfigToJson(from_file), HasSubstr("\"trusted_backends_file\": \"" +
                                                 (dir / "trusted.sha256").string() + "\""));
}

// --check-config printed the key's description ("none (every backend runs in the server)")
// whatever the file set, so an operator could not see which backends run isolated, and the
// rendering could not be applied again (found by server_config_fuzz, which applies it again).
TEST(ServeConfigTest, CheckConfigShowsTheConfiguredBackendIsolation) {
  ServeConfig config = DefaultServeConfig();
  EXPECT_TRUE(json::parse(ConfigToJson(config))["backend_isolation"].is_null());
  const Status applied = ApplyConfigText(
      R"({"backend_isolation": {"AcmeFast": "process", "*": "none"}})", "/etc/serve.json", config);
  ASSERT_TRUE(applied.ok()) << applied.ToString();
  const json shown = json::parse(ConfigToJson(config))["backend_isolation"];
  EXPECT_EQ(shown, json::parse(R"({"*": "none", "AcmeFast": "process"})"));

  ServeConfig again = DefaultServeConfig();
  ASSERT_TRUE(
      ApplyConfigText(json{{"backend_isolation", shown}}.dump(), "/etc/serve.json", again).ok());
  EXPECT_EQ(again.backend_isolation, config.backend_isolation);
}

TEST(ServeConfigTest, ListenAddresses) {
  auto ipv4 = ParseListenAddress("127.0.0.1:8000");
  ASSERT_TRUE(ipv4.ok());
  EXPECT_EQ(ipv4->host, "127.0.0.1");
  EXPECT_EQ(ipv4->port, 8000);
  auto ipv6 = ParseListenAddress("[::1]:0");
  ASSERT_TRUE(ipv6.ok());
  EXPECT_EQ(ipv6->host, "::1");
  EXPECT_EQ(ipv6->ToString(), "[::1]:0");
  EXPECT_FALSE(ParseListenAddress("localhost:65536").ok());
  EXPECT_FALSE(ParseListenAddress(":80").ok());
  EXPECT_FALSE(ParseListenAddress("::1:80").ok());
  EXPECT_FALSE(ParseListenAddress("host:8o").ok());
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
}

// A network with one input of each datatype (the request side only looks at inputs/outputs).
Network EveryDatatype() {
  Network network;
  network.name = "every";
  for (auto [name, type] :
       std::vector<std::pair<std::string, DataType>>{{"f32", DataType::kFloat32},
                                                     {"f64", DataType::kFloat64},
                                                     {"i64", DataType::kInt64},
                                                     {"i32", DataType::kInt32},
                                                     {"i8", DataType::kInt8},
                                                     {"u8", DataType::kUint8},
                                                     {"b", DataType::kBool}}) {
    network.inputs.push_back({name, {type, {2}}});
  }
  network.outputs.push_back({"out", {DataType::kFloat32, {-1}}});
  return network;
}

json Request(const std::string& name, const std::string& datatype, const json& data) {
  json inputs = json::array();
  for (const auto& [input, type] :
       std::vector<std::pair<std::string, std::string>>{{"f32", "FP32"},
                                                        {"f64", "FP64"},
                                                        {"i64", "INT64"},
                                                        {"i32", "INT32"},
                                                        {"i8", "INT8"},
                                                        {"u8", "UINT8"},
                                                        {"b", "BOOL"}}) {
    json values = type == "BOOL" ? json::array({true, false}) : json::array({1, 2});
    if (input == name) {
      values = data;
      EXPECT_EQ(type, datatype);
    }
    inputs.push_back({{"name", input}, {"shape", {2}}, {"datatype", type}, {"data", values}});
  }
  return {{"inputs", inputs}};
}

// A request held as a JSON document, rendered to text and parsed as the server parses a body.
Result<InferenceRequest> ParseDocument(const json& body, const Network& network) {
  const std::string text = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return ParseInferenceRequest(InferenceBody{.json = text}, network, ParseLimits{});
}

TEST(InferenceApiTest, ConvertsEveryDatatype) {
  const Network network = EveryDatatype();
  auto parsed = ParseDocument(
      Request("i64", "INT64", {int64_t{-9007199254740993}, uint64_t{9223372036854775807u}}),
      network);
  ASSERT_TRUE(parsed.ok()) << parsed.error().ToString();
  ASSERT_EQ(parsed->inputs.size(), 7u);
  EXPECT_EQ(parsed->inputs[0].Elements<float>()[1], 2.0f);
  EXPECT_EQ(parsed->inputs[1].Elements<double>()[0], 1.0);
  EXPECT_EQ(parsed->inputs[2].Elements<int64_t>()[0], -9007199254740993);
  EXPECT_EQ(parsed->inputs[2].Elements<int64_t>()[1], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(parsed->inputs[5].Elements<uint8_t>()[1], 2);
  EXPECT_EQ(parsed->inputs[6].Elements<uint8_t>()[0], 1);
  EXPECT_EQ(parsed->inputs[6].Elements<uint8_t>()[1], 0);
  EXPECT_EQ(parsed->outputs, std::vector<std::size_t>{0});
}

TEST(InferenceApiTest, RefusesValuesOutsideTheDatatype) {
  const Network network = EveryDatatype();
  const auto error = [&](const std::string& name, const std::string& type, const json& data) {
    auto parsed = ParseDocument(Request(name, type, data), network);
    return parsed.ok() ? std::string("ok") : parsed.error().message();
  };
  EXPECT_THAT(error("u8", "UINT8", {1, 256}), HasSubstr("input 'u8' element 1 is 256, out of range "
                                                        "for UINT8"));
  EXPECT_THAT(error("u8", "UINT8", {-1, 0}), HasSubstr("is -1, out of range for UINT8"));
  EXPECT_THAT(error("i8", "INT8", {-129, 0}), HasSubstr("out of range for INT8"));
  EXPECT_THAT(error("i32", "INT32", {1.5, 0}), HasSubstr("is 1.5, expected an integer for INT32"));
  EXPECT_THAT(error("i64", "INT64", {uint64_t{18446744073709551615u}, 0}),
              HasSubstr("out of range for INT64"));
  EXPECT_THAT(error("b", "BOOL", {1, 0}), HasSubstr("is 1, expected true or false for BOOL"));
  EXPECT_THAT(error("f32", "FP32", {nullptr, 0}), HasSubstr("is null, expected a number"));
  EXPECT_THAT(error("f64", "FP64", {true, 0}), HasSubstr("is true, expected a number for FP64"));
  EXPECT_EQ(error("f64", "FP64", {1e300, 0}), "ok");
}

TEST(InferenceApiTest, RendersShortestFloatsAndNullForNonFinite) {
  Network network;
  network.outputs.push_back({"y", {DataType::kFloat32, {3}}});
  Tensor output(TensorInfo{DataType::kFloat32, {3}});
  output.Elements<float>()[0] = 0.1f;
  output.Elements<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  output.Elements<float>()[2] = -2702.9026f;
  InferenceRequest request;
  request.id = "a\"b";
  request.outputs = {0};
  const std::vector<Tensor> outputs = {std::move(output)};
  const std::string text = RenderInferenceResponse("m", 3, request, network, outputs);
  EXPECT_EQ(text, R"({"model_name":"m","model_version":"3","id":"a\"b","outputs":[{"name":"y",)"
                  R"("datatype":"FP32","shape":[3],"data":[0.1,null,-2702.9026]}]})");
  EXPECT_FALSE(json::parse(text, nullptr, false).is_discarded());
}

TEST(JsonBodyTest, DepthIsCountedOutsideStringsOnly) {
  EXPECT_TRUE(ParseJsonBody(R"({"a": "[[[[[[[[[[[["})", 2).ok());
  EXPECT_TRUE(ParseJsonBody(R"({"a": "\"[[[[[[["})", 2).ok());
  const auto deep = ParseJsonBody(R"({"a": [[1]]})", 2);
  ASSERT_FALSE(deep.ok());
  EXPECT_THAT(deep.error().message(), HasSubstr("nested deeper than 2 levels at byte 7"));
  const auto malformed = ParseJsonBody("{\"a\": tru}", 8);
  ASSERT_FALSE(malformed.ok());
  EXPECT_THAT(malformed.error().message(), HasSubstr("malformed JSON: parse error at line 1"));
}

TEST(MetricsTest, EscapesLabelValuesAndAccumulatesBuckets) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  constexpr double kBounds[] = {0.1, 1};
  Histogram histogram(kBounds);
  histogram.Observe(0.05);
  histogram.Observe(0.1);  // a bound belongs to its own bucket (le = less or equal)
  histogram.Observe(0.5);
  histogram.Observe(7);
  const auto snapshot = histogram.Read();
  EXPECT_EQ(snapshot.cumulative_counts, (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(snapshot.count, 4u);
  EXPECT_DOUBLE_EQ(snapshot.sum, 7.65);

  ServerMetrics metrics;
  metrics.ForModel("we\"ird").requests = 2;
  const std::string text = metrics.Render(nullptr, nullptr);
  EXPECT_THAT(text, HasSubstr("backplane_inference_requests_total{model=\"we\\\"ird\"} 2\n"));
}

TEST(MetricsTest, ShapeProgramsPerModelVersion) {
  ServerMetrics metrics;
  const ShapeProgramSample samples[] = {{.model = "mlp",
                                         .version = "1",
                                         .hits = 7,
                                         .misses = 3,
                                         .compiles = 2,
                                         .compile_failures = 1,
                                         .evictions = 4,
                                         .programs = 2,
                                         .capacity = 8}};
  const std::string text = metrics.Render(nullptr, nullptr, samples);
  const std::string labels = "{model=\"mlp\",version=\"1\"";
  for (const std::string& line :
       {"backplane_network_shape_program_requests_total" + labels + ",result=\"hit\"} 7\n",
        "backplane_network_shape_program_requests_total" + labels + ",result=\"miss\"} 3\n",
        "backplane_network_shape_program_compiles_total" + labels + "} 2\n",
        "backplane_network_shape_program_compile_failures_total" + labels + "} 1\n",
        "backplane_network_shape_program_evictions_total" + labels + "} 4\n",
        "backplane_network_shape_programs" + labels + "} 2\n",
        "backplane_network_shape_program_capacity" + labels + "} 8\n",
        std::string("# TYPE backplane_network_shape_program_compiles_total counter\n"),
        std::string("# TYPE backplane_network_shape_programs gauge\n")}) {
    EXPECT_THAT(text, HasSubstr(line));
  }
}

TEST(BodyBudgetTest, ReservesUpToTheLimitAndGivesBackOnDestruction) {
  std::atomic<int64_t> gauge{0};
  BodyBudget budget(100, &gauge);
  auto first = budget.TryReserve(60);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->bytes(), 60u);
  // All or nothing: a refusal takes nothing.
  EXPECT_FALSE(budget.TryReserve(41));
  EXPECT_EQ(budget.in_use(), 60u);
  {
    auto second = budget.TryReserve(40);  // exactly the limit
    ASSERT_TRUE(second);
    EXPECT_EQ(gauge.load(), 100);
    EXPECT_FALSE(budget.TryReserve(1));
  }
  EXPECT_EQ(budget.in_use(), 60u);
  // A near-2^64 request must not wrap around the limit.
  EXPECT_FALSE(budget.TryReserve(std::numeric_limits<std::size_t>::max() - 10));
  BodyReservation moved = std::move(*first);
  EXPECT_EQ(first->bytes(), 0u);
  first.reset();
  EXPECT_EQ(budget.in_use(), 60u);  // the moved-from one gave nothing back
  moved.Release();
  EXPECT_EQ(budget.in_use(), 0u);
  EXPECT_EQ(gauge.load(), 0);
}

TEST(BodyBudgetTest, AChunkedBodyGrowsItsReservationWhileItFits) {
  BodyBudget budget(100);
  auto chunked = budget.TryReserve(0);
  ASSERT_TRUE(chunked);
  EXPECT_TRUE(chunked->Grow(70));
  EXPECT_FALSE(chunked->Grow(31));
  EXPECT_EQ(chunked->bytes(), 70u);  // a refused chunk leaves what was held
  EXPECT_TRUE(chunked->Grow(30));
  chunked.reset();
  EXPECT_EQ(budget.in_use(), 0u);
  BodyReservation none;
  EXPECT_FALSE(none.Grow(1));  // no budget to grow from
}

// Under contention the sum held never passes the limit, and everything comes back (run under
// the tsan preset for the races).
TEST(BodyBudgetTest, ConcurrentReservationsNeverPassTheLimit) {
  constexpr std::size_t kLimit = 1000;
  BodyBudget budget(kLimit);
  std::atomic<bool> over{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20000; ++i) {
        auto reservation = budget.TryReserve(static_cast<std::size_t>(100 + (i + t) % 300));
        if (budget.in_use() > kLimit)
          over.store(true);
        if (reservation && !reservation->Grow(50) && budget.in_use() > kLimit)
          over.store(true);
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_FALSE(over.load());
  EXPECT_EQ(budget.in_use(), 0u);
}

// Issue 10: a request that outlived its model's unload unloaded the network on its own thread,
// which takes the runtime's lock (held through a whole backend swap) and calls backend hooks.
TEST(ModelRepositoryTest, TheLastRequestOnAnUnloadedModelLeavesTheUnloadToTheReaper) {
  testing::ServeHome home;
  const auto backend_loader = loader::Loader::Shared().value();
  ServerMetrics metrics;
  auto runtime = Runtime::Create({.backend_paths = std::vector{home.backends()}});
  ASSERT_TRUE(runtime.ok()) << runtime.error().ToString();
  ModelRepository repository(home.models(), *runtime.value(), metrics);
  ASSERT_TRUE(repository.Load("mlp").ok());
  auto resolved = ResolveModel(repository, "mlp", "");
  ASSERT_TRUE(resolved.ok());
  std::optional<ResolvedModel> request = std::move(resolved).value();
  const NetworkId network = request->version->network_id();
  ASSERT_TRUE(repository.Unload("mlp").ok());

  // The reaper waits until we have looked, so that the unload cannot have happened yet.
  std::promise<void> looked;
  ASSERT_TRUE(
      backend_loader->reaper()->Post([done = looked.get_future().share()] { done.wait(); }));
  request.reset();  // the request thread's last reference
  const bool still_loaded = runtime.value()->GetNetwork(network).ok();
  looked.set_value();
  EXPECT_TRUE(still_loaded);
  backend_loader->WaitForUnloads();
  const auto unloaded = runtime.value()->GetNetwork(network);
  ASSERT_FALSE(unloaded.ok());
  EXPECT_EQ(unloaded.error().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace backplane::server
