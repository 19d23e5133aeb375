// The client of bench/batching_bench.sh: many keep-alive clients, each sending one request after
// another to one running `backplane serve`, against several models side by side (the same network
// with dynamic batching off and on), the models alternating within each run so that the machine's
// noise falls on all of them alike.
//   backplane_bench_batching --http HOST:PORT --grpc HOST:PORT --models "wide wide_batched"
//       [--features 784] [--seconds S] [--runs "rest:64 grpc:16 rest:1 grpc:1:64"]
// A run is transport:clients[:rows] (rows per request, default 1). Every client sends its own
// seeded random rows (REST as JSON, gRPC as raw FP32). Prints one line per run and model:
// requests/s, rows/s, p50 and p99 latency, failures.
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "grpc_service.grpc.pb.h"

namespace {
using Clock = std::chrono::steady_clock;

struct RunResult {
  double requests_per_second = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  int failures = 0;
};

// Runs `clients` threads, each with the call `make_caller(c)` returns, for `seconds`.
template <typename MakeCaller>
RunResult RunClients(int clients, double seconds, MakeCaller make_caller) {
  std::vector<std::vector<double>> latencies(clients);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto call = make_caller(c);
      if (!call())  // warm-up: connection open, first inference done
        failures.fetch_add(1);
      while (Clock::now() < end) {
        const auto start = Clock::now();
        if (!call())
          failures.fetch_add(1);
        latencies[c].push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  std::vector<double> all;
  for (auto& each : latencies)
    all.insert(all.end(), each.begin(), each.end());
  std::sort(all.begin(), all.end());
  RunResult result;
  result.failures = failures.load();
  if (all.empty())
    return result;
  result.requests_per_second = all.size() / seconds;
  result.p50_ms = all[all.size() / 2];
  result.p99_ms = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return result;
}

std::vector<float> SeededRows(int client, int rows, int features) {
  std::mt19937 random(20261202 + client);
  std::uniform_real_distribution<float> value(0.0f, 1.0f);
  std::vector<float> data(static_cast<std::size_t>(rows) * features);
  for (float& element : data)
    element = value(random);
  return data;
}

}  // namespace

int main(int argc, char** argv) {
  std::string http_address, grpc_address, models_text, runs_text = "rest:64 grpc:16 rest:1";
  double seconds = 5;
  int features = 784;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--http")
      http_address = argv[i + 1];
    else if (flag == "--grpc")
      grpc_address = argv[i + 1];
    else if (flag == "--models")
      models_text = argv[i + 1];
    else if (flag == "--runs")
      runs_text = argv[i + 1];
    else if (flag == "--seconds")
      seconds = std::stod(argv[i + 1]);
    else if (flag == "--features")
      features = std::stoi(argv[i + 1]);
  }
  std::vector<std::string> models;
  std::istringstream model_words(models_text);
  for (std::string model; model_words >> model;)
    models.push_back(model);
  if (http_address.empty() || grpc_address.empty() || models.empty()) {
    std::cerr << "usage: backplane_bench_batching --http HOST:PORT --grpc HOST:PORT --models "
                 "\"a b\" [--features 784] [--seconds S] [--runs \"rest:64 grpc:16 rest:1\"]\n";
    return 2;
  }
  const auto colon = http_address.rfind(':');
  const std::string http_host = http_address.substr(0, colon);
  const int http_port = std::stoi(http_address.substr(colon + 1));
  int connection = 0;

  std::printf("%-5s %7s %4s  %-22s %10s %10s %8s %8s %6s\n", "proto", "clients", "rows", "model",
              "requests/s", "rows/s", "p50 ms", "p99 ms", "failed");
  std::istringstream run_words(runs_text);
  for (std::string run; run_words >> run;) {
    std::istringstream parts(run);
    std::string transport, clients_text, rows_text = "1";
    std::getline(parts, transport, ':');
    std::getline(parts, clients_text, ':');
    std::getline(parts, rows_text, ':');
    const int clients = std::stoi(clients_text);
    const int rows = std::stoi(rows_text);
    for (const auto& model : models) {
      const auto rest_caller = [&](int c) {
        auto client = std::make_shared<httplib::Client>(http_host, http_port);
        client->set_keep_alive(true);
        client->set_tcp_nodelay(true);  // as curl does: headers and body are two writes
        const std::string body = nlohmann::json({{"inputs",
                                                  {{{"name", "x"},
                                                    {"shape", {rows, features}},
                                                    {"datatype", "FP32"},
                                                    {"data", SeededRows(c, rows, features)}}}}})
                                     .dump();
        const std::string path = "/v2/models/" + model + "/infer";
        return [client, body, path] {
          auto response = client->Post(path, body, "application/json");
          return response && response->status == 200;
        };
      };
      const auto grpc_caller = [&](int c) {
        grpc::ChannelArguments arguments;  // each client its own connection
        arguments.SetInt("backplane.bench.connection", ++connection);
        auto stub = std::shared_ptr<inference::GRPCInferenceService::Stub>(
            inference::GRPCInferenceService::NewStub(grpc::CreateCustomChannel(
                grpc_address, grpc::InsecureChannelCredentials(), arguments)));
        auto request = std::make_shared<inference::ModelInferRequest>();
        request->set_model_name(model);
        auto* input = request->add_inputs();
        input->set_name("x");
        input->set_datatype("FP32");
        input->add_shape(rows);
        input->add_shape(features);
        const auto data = SeededRows(c, rows, features);
        request->add_raw_input_contents(reinterpret_cast<const char*>(data.data()),
                                        data.size() * sizeof(float));
        return [stub, request] {
          grpc::ClientContext context;
          inference::ModelInferResponse response;
          return stub->ModelInfer(&context, *request, &response).ok() &&
                 response.raw_output_contents_size() == 1;
        };
      };
      const RunResult result = transport == "grpc" ? RunClients(clients, seconds, grpc_caller)
                                                   : RunClients(clients, seconds, rest_caller);
      std::printf("%-5s %7d %4d  %-22s %10.0f %10.0f %8.3f %8.3f %6d\n", transport.c_str(), clients,
                  rows, model.c_str(), result.requests_per_second,
                  result.requests_per_second * rows, result.p50_ms, result.p99_ms, result.failures);
      std::fflush(stdout);
    }
  }
  return 0;
}
