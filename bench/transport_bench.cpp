// REST JSON against gRPC raw tensors on one running `backplane serve`, native clients on both
// sides (cpp-httplib keep-alive, the generated gRPC stub), side by side in one run: for each
// client count, every client thread has its own connection and sends MNIST requests back to back
// for S seconds, the transports alternating. bench/grpc_bench.sh starts the server and runs it:
//   backplane_bench_transport --http HOST:PORT --grpc HOST:PORT --request FILE [--seconds S]
//                             [--clients "1 4"] [--model mnist] [--server-pid PID] [--bare]
// Prints one line per transport and client count: requests/s, p50 and p99 latency, failures,
// and with --server-pid the server's and the machine's (server and this client) CPU time per
// request. --bare adds each transport's cheapest call (REST GET /v2/health/live, gRPC
// ServerLive): the floor the HTTP front and the gRPC library set under any inference.
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "grpc_service.grpc.pb.h"

namespace {
using Clock = std::chrono::steady_clock;

struct Result {
  double requests_per_second = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  int failures = 0;
  double server_us_per_request = 0;
  double machine_us_per_request = 0;
};

// Runs `clients` threads, each with a call made by `make_caller()`, for `seconds`.
template <typename MakeCaller>
Result Run(int clients, double seconds, const std::string& server_pid, MakeCaller make_caller) {
  const double server_before =
      server_pid.empty() ? 0 : backplane::bench::ProcessCpuSeconds(server_pid);
  const double client_before = backplane::bench::ProcessCpuSeconds("self");
  std::vector<std::vector<double>> latencies(clients);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto call = make_caller();
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
  const double server_cpu =
      server_pid.empty() ? 0 : backplane::bench::ProcessCpuSeconds(server_pid) - server_before;
  const double client_cpu = backplane::bench::ProcessCpuSeconds("self") - client_before;
  std::vector<double> all;
  for (auto& each : latencies)
    all.insert(all.end(), each.begin(), each.end());
  std::sort(all.begin(), all.end());
  Result result;
  if (all.empty())
    return result;
  result.requests_per_second = all.size() / seconds;
  result.p50_ms = all[all.size() / 2];
  result.p99_ms = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  result.failures = failures.load();
  result.server_us_per_request = server_cpu * 1e6 / static_cast<double>(all.size());
  result.machine_us_per_request = (server_cpu + client_cpu) * 1e6 / static_cast<double>(all.size());
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  std::string http_address, grpc_address, request_file, client_counts = "1 4", model = "mnist";
  std::string server_pid;
  double seconds = 5;
  bool bare = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--bare") {
      bare = true;
      continue;
    }
    if (i + 1 >= argc)
      break;
    if (flag == "--http")
      http_address = argv[i + 1];
    else if (flag == "--grpc")
      grpc_address = argv[i + 1];
    else if (flag == "--request")
      request_file = argv[i + 1];
    else if (flag == "--seconds")
      seconds = std::stod(argv[i + 1]);
    else if (flag == "--clients")
      client_counts = argv[i + 1];
    else if (flag == "--model")
      model = argv[i + 1];
    else if (flag == "--server-pid")
      server_pid = argv[i + 1];
    ++i;
  }
  if (http_address.empty() || grpc_address.empty() || request_file.empty()) {
    std::cerr
        << "usage: backplane_bench_transport --http HOST:PORT --grpc HOST:PORT --request FILE "
           "[--seconds S] [--clients \"1 4\"] [--model mnist] [--server-pid PID] [--bare]\n";
    return 2;
  }
  std::ifstream in(request_file);
  std::stringstream text;
  text << in.rdbuf();
  const std::string json_body = text.str();
  const auto request_json = nlohmann::json::parse(json_body);
  const auto& input = request_json["inputs"][0];

  // The same tensor as raw little-endian FP32.
  inference::ModelInferRequest raw_request;
  raw_request.set_model_name(model);
  auto* raw_input = raw_request.add_inputs();
  raw_input->set_name(input["name"].get<std::string>());
  raw_input->set_datatype(input["datatype"].get<std::string>());
  for (const auto& dim : input["shape"])
    raw_input->add_shape(dim.get<int64_t>());
  std::vector<float> values;
  const auto flatten = [&](const nlohmann::json& value, auto& self) -> void {
    if (value.is_array()) {
      for (const auto& element : value)
        self(element, self);
    } else {
      values.push_back(value.get<float>());
    }
  };
  flatten(input["data"], flatten);
  raw_request.add_raw_input_contents(reinterpret_cast<const char*>(values.data()),
                                     values.size() * sizeof(float));

  const auto colon = http_address.rfind(':');
  const std::string http_host = http_address.substr(0, colon);
  const int http_port = std::stoi(http_address.substr(colon + 1));
  // Each client its own connection, as the REST clients have. Counted atomically: every client
  // thread makes its own (Run).
  std::atomic<int> connection{0};
  const auto rest_client = [&] {
    auto client = std::make_shared<httplib::Client>(http_host, http_port);
    client->set_keep_alive(true);
    client->set_tcp_nodelay(true);  // as curl does: headers and body are two writes
    return client;
  };
  const auto grpc_stub = [&] {
    grpc::ChannelArguments arguments;
    arguments.SetInt("backplane.bench.connection", ++connection);
    return std::shared_ptr<inference::GRPCInferenceService::Stub>(
        inference::GRPCInferenceService::NewStub(grpc::CreateCustomChannel(
            grpc_address, grpc::InsecureChannelCredentials(), arguments)));
  };

  const auto rest_caller = [&] {
    return [client = rest_client(), &json_body, path = "/v2/models/" + model + "/infer"] {
      auto response = client->Post(path, json_body, "application/json");
      return response && response->status == 200;
    };
  };
  const auto grpc_caller = [&] {
    return [stub = grpc_stub(), &raw_request] {
      grpc::ClientContext context;
      inference::ModelInferResponse response;
      return stub->ModelInfer(&context, raw_request, &response).ok() &&
             response.raw_output_contents_size() == 1;
    };
  };
  const auto rest_live = [&] {
    return [client = rest_client()] {
      auto response = client->Get("/v2/health/live");
      return response && response->status == 200;
    };
  };
  const auto grpc_live = [&] {
    return [stub = grpc_stub()] {
      grpc::ClientContext context;
      inference::ServerLiveResponse response;
      return stub->ServerLive(&context, inference::ServerLiveRequest(), &response).ok() &&
             response.live();
    };
  };

  std::cout << "transport (native clients)  clients  requests/s  p50 ms  p99 ms  failed"
            << (server_pid.empty() ? "" : "  server us  machine us") << "\n";
  const auto print = [&](const char* name, int clients, const Result& result) {
    std::printf("%-27s %8d %11.0f %7.3f %7.3f %7d", name, clients, result.requests_per_second,
                result.p50_ms, result.p99_ms, result.failures);
    if (!server_pid.empty())
      std::printf(" %10.1f %11.1f", result.server_us_per_request, result.machine_us_per_request);
    std::printf("\n");
  };
  std::istringstream counts(client_counts);
  for (int clients; counts >> clients;) {
    print("REST JSON", clients, Run(clients, seconds, server_pid, rest_caller));
    print("gRPC raw", clients, Run(clients, seconds, server_pid, grpc_caller));
    if (bare) {
      print("REST live (no work)", clients, Run(clients, seconds, server_pid, rest_live));
      print("gRPC ServerLive (no work)", clients, Run(clients, seconds, server_pid, grpc_live));
    }
  }
  return 0;
}
