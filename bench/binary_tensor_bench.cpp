// JSON against the binary tensor data extension, medians side by side:
//   parse   ParseInferenceRequest on the body, in process (no HTTP)
//   e2e     POST /v2/models/<m>/infer through a running `backplane serve` (--url), response read
// for MNIST (FP32 [1,1,28,28], JSON in and out vs binary in and out) and for a large input
// (FP32 [1, N] through Relu). `--write-large-model PATH` writes that model (binary_tensor_bench.sh
// does both).
#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kserve_rest/kserve_json.hpp"
#include "model_builder.hpp"

namespace {

using namespace backplane;
using namespace backplane::server;
using Clock = std::chrono::steady_clock;

constexpr int64_t kLargeElements = 1'000'000;

struct Case {
  std::string label;
  std::string model;
  Network network;
  std::string json_body;
  std::string binary_body;
  std::size_t binary_json_length = 0;
};

Case MakeCase(const std::string& label, const std::string& model, const std::string& input,
              const std::string& output, Shape shape, int reps_seed) {
  Case c{label, model, {}, {}, {}, 0};
  int64_t count = 1;
  for (int64_t dim : shape)
    count *= dim;
  c.network.inputs.push_back({input, {DataType::kFloat32, shape}});
  c.network.outputs.push_back({output, {DataType::kFloat32, {-1}}});
  std::mt19937 random(reps_seed);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& value : values)
    value = uniform(random);

  std::string shape_text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      shape_text += ',';
    shape_text += std::to_string(shape[i]);
  }
  shape_text += "]";
  std::string data;
  char buffer[32];
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i)
      data += ',';
    const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, values[i]);
    data.append(buffer, end);
  }
  c.json_body = R"({"inputs":[{"name":")" + input + R"(","shape":)" + shape_text +
                R"(,"datatype":"FP32","data":[)" + data + "]}]}";
  const std::string header = R"({"inputs":[{"name":")" + input + R"(","shape":)" + shape_text +
                             R"(,"datatype":"FP32","parameters":{"binary_data_size":)" +
                             std::to_string(values.size() * 4) +
                             R"(}}],"parameters":{"binary_data_output":true}})";
  c.binary_json_length = header.size();
  c.binary_body = header;
  c.binary_body.append(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  return c;
}

template <typename Work>
double MedianMs(int reps, Work work) {
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    const auto start = Clock::now();
    work();
    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string url;
  int reps = 31;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--write-large-model" && i + 1 < argc) {
      backplane::testing::ModelBuilder model;
      model.Input("x", {1, kLargeElements}).Output("y", {1, kLargeElements});
      model.Node("Relu", {"x"}, {"y"});
      std::ofstream(argv[++i], std::ios::binary) << model.Serialize();
      return 0;
    }
    if (arg == "--url" && i + 1 < argc)
      url = argv[++i];
    else if (arg == "--reps" && i + 1 < argc)
      reps = std::stoi(argv[++i]);
  }

  std::vector<Case> cases;
  cases.push_back(MakeCase("mnist", "mnist", "Input3", "Plus214_Output_0", {1, 1, 28, 28}, 1));
  cases.push_back(MakeCase("large 1M FP32", "large", "x", "y", {1, kLargeElements}, 2));

  std::printf("%-14s %-6s %12s %12s %14s %14s\n", "input", "path", "body bytes", "parse ms",
              "e2e ms", "response bytes");
  for (const Case& c : cases) {
    for (bool binary : {false, true}) {
      const std::string& body = binary ? c.binary_body : c.json_body;
      const InferenceBody split{
          .json = binary ? std::string_view(body).substr(0, c.binary_json_length)
                         : std::string_view(body),
          .binary =
              binary ? std::string_view(body).substr(c.binary_json_length) : std::string_view(),
          .has_binary_header = binary};
      const int parse_reps = c.model == "mnist" ? reps * 10 : reps;
      const double parse_ms = MedianMs(parse_reps, [&] {
        auto parsed = ParseInferenceRequest(split, c.network, ParseLimits{});
        if (!parsed.ok()) {
          std::fprintf(stderr, "%s\n", parsed.error().ToString().c_str());
          std::exit(1);
        }
      });
      double e2e_ms = 0;
      std::size_t response_bytes = 0;
      if (!url.empty()) {
        httplib::Client client(url);
        client.set_read_timeout(60, 0);
        httplib::Headers headers;
        if (binary)
          headers.emplace(kInferenceHeaderContentLength, std::to_string(c.binary_json_length));
        const std::string path = "/v2/models/" + c.model + "/infer";
        e2e_ms = MedianMs(reps, [&] {
          auto reply = client.Post(path, headers, body,
                                   binary ? "application/octet-stream" : "application/json");
          if (!reply || reply->status != 200) {
            std::fprintf(stderr, "%s: %s\n", path.c_str(),
                         reply ? reply->body.substr(0, 300).c_str() : "no response");
            std::exit(1);
          }
          response_bytes = reply->body.size();
        });
      }
      std::printf("%-14s %-6s %12zu %12.3f %14.3f %14zu\n", c.label.c_str(),
                  binary ? "binary" : "json", body.size(), parse_ms, e2e_ms, response_bytes);
    }
  }
  return 0;
}
