// The client of bench/batching_bench.sh: many keep-alive clients, each sending one request after
// another to one running `backplane serve`, against several models side by side (the same network
// with dynamic batching off and on). A run of S seconds per model is cut into --slices slices
// (default 5) that alternate between the models (A B A B ...), so that the machine's noise, which
// drifts over seconds on a shared machine, falls on all of them alike.
//   backplane_bench_batching --http HOST:PORT --grpc HOST:PORT --models "wide wide_batched"
//       [--features 784] [--seconds S] [--slices N] [--think-us T] [--server-pid PID]
//       [--runs "rest:64 grpc:16 rest:1 grpc:1:64"]
// A run is transport:clients[:rows] (rows per request, default 1); transport rest, grpc (a thread
// per client, blocking calls) or grpc-async (calls kept in flight by their completions on gRPC's
// own threads: a lighter load generator on the server's cores). --think-us: each client idles
// that long after each answer (what an idle machine costs the next request). Every client sends its
// own seeded random rows (REST as JSON, gRPC as raw FP32) and checks every answer: the same rows
// must get the same outputs every time and from every model (within 1e-4: a batched row may run at
// another batch size, on other kernels). A wrong answer counts as failed. Prints one line per run
// and model: requests/s, rows/s, p50 and p99 latency, failures, and the largest difference of an
// answer from that client's first answer of the first model. With --server-pid PID, also the
// server's CPU time per request and the machine's (server and this client, /proc/PID/stat).
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <latch>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "grpc_service.grpc.pb.h"

namespace {
using Clock = std::chrono::steady_clock;

struct RunResult {
  double requests_per_second = 0;
  double server_us_per_request = 0;   // with --server-pid: its CPU time per request
  double machine_us_per_request = 0;  // the server's and this client's CPU time per request
  double p50_ms = 0;
  double p99_ms = 0;
  int failures = 0;
};

// One client's expected answer: its first answer (of the first model), and how far any later one
// strayed from it.
struct Reference {
  std::vector<float> outputs;
  double largest_difference = 0;
};

// Whether `outputs` matches the client's reference (the first answer becomes it).
bool Matches(Reference& reference, const std::vector<float>& outputs) {
  if (reference.outputs.empty()) {
    reference.outputs = outputs;
    return !outputs.empty();
  }
  if (outputs.size() != reference.outputs.size())
    return false;
  double largest = 0;
  for (std::size_t i = 0; i < outputs.size(); ++i)
    largest = std::max(largest, static_cast<double>(std::abs(outputs[i] - reference.outputs[i])));
  reference.largest_difference = std::max(reference.largest_difference, largest);
  return largest <= 1e-4;
}

// What the slices of one model add up to.
struct Tally {
  std::vector<double> latencies_ms;
  double seconds = 0;
  int failures = 0;
  double server_cpu_seconds = 0;
  double client_cpu_seconds = 0;

  // One run's clients: their latencies, its length, its failed answers.
  void Add(const std::vector<std::vector<double>>& latencies, double run_seconds, int failed) {
    for (const auto& each : latencies)
      latencies_ms.insert(latencies_ms.end(), each.begin(), each.end());
    seconds += run_seconds;
    failures += failed;
  }

  RunResult Result() {
    std::sort(latencies_ms.begin(), latencies_ms.end());
    RunResult result;
    result.failures = failures;
    if (latencies_ms.empty())
      return result;
    result.requests_per_second = latencies_ms.size() / seconds;
    result.server_us_per_request = server_cpu_seconds * 1e6 / latencies_ms.size();
    result.machine_us_per_request =
        (server_cpu_seconds + client_cpu_seconds) * 1e6 / latencies_ms.size();
    result.p50_ms = latencies_ms[latencies_ms.size() / 2];
    result.p99_ms = latencies_ms[std::min(latencies_ms.size() - 1, latencies_ms.size() * 99 / 100)];
    return result;
  }
};

// Runs `clients` threads for `seconds`, each with the call `make_caller(c)` returns (a call gives
// its outputs, empty on failure), into `tally`.
template <typename MakeCaller>
void RunClients(int clients, double seconds, std::chrono::microseconds think,
                MakeCaller make_caller, std::vector<Reference>& references, Tally& tally) {
  std::vector<std::vector<double>> latencies(clients);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  // The clock starts when every client has warmed up (connection open, first answer in): a
  // slow model's warm-up is not counted against its throughput.
  std::latch warmed(clients + 1);
  std::latch go(1);
  Clock::time_point end;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto call = make_caller(c);
      if (!Matches(references[c], call()))
        failures.fetch_add(1);
      warmed.count_down();
      go.wait();
      while (Clock::now() < end) {
        const auto start = Clock::now();
        if (!Matches(references[c], call()))
          failures.fetch_add(1);
        latencies[c].push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - start).count());
        if (think.count() > 0)
          std::this_thread::sleep_for(think);
      }
    });
  }
  warmed.arrive_and_wait();
  end = Clock::now() +
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  go.count_down();
  for (auto& thread : threads)
    thread.join();
  tally.Add(latencies, seconds, failures.load());
}

// As RunClients, but the `clients` calls are kept in flight from no thread of ours: each call's
// completion (on gRPC's own threads) checks its answer and starts that client's next call. So the
// load generator is a few threads, not one per client (transport "grpc-async").
template <typename MakeAsyncCaller>
void RunAsyncClients(int clients, double seconds, MakeAsyncCaller make_caller,
                     std::vector<Reference>& references, Tally& tally) {
  using Outputs = std::vector<float>;
  // Shared with the completions, which may still be returning when the last one has reported.
  struct Run {
    std::vector<std::function<void(std::function<void(Outputs)>)>> calls;
    std::vector<Reference>* references = nullptr;
    std::vector<std::vector<double>> latencies;
    Clock::time_point end;
    std::mutex mutex;
    std::condition_variable changed;
    int failures = 0;  // guarded by mutex
    int running = 0;   // chains still calling, guarded by mutex
    std::function<void(int)> next;
    void Report(bool ok, bool done) {
      std::lock_guard lock(mutex);
      failures += ok ? 0 : 1;
      running -= done ? 1 : 0;
      changed.notify_all();
    }
  };
  auto run = std::make_shared<Run>();
  run->references = &references;
  run->latencies.resize(clients);
  for (int c = 0; c < clients; ++c) {
    run->calls.push_back(make_caller(c));
    // Warm-up, one call at a time: the connection, the first answer (the reference).
    {
      std::lock_guard lock(run->mutex);
      run->running = 1;
    }
    run->calls[c]([run, c](Outputs outputs) {
      run->Report(Matches((*run->references)[c], outputs), /*done=*/true);
    });
    std::unique_lock lock(run->mutex);
    run->changed.wait(lock, [&] { return run->running == 0; });
  }
  run->end = Clock::now() +
             std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  // One chain per client: a completion records its call and starts the next, or ends the chain.
  std::weak_ptr<Run> weak = run;
  run->next = [weak](int c) {
    const auto run = weak.lock();
    const auto start = Clock::now();
    run->calls[c]([run, c, start](Outputs outputs) {
      const bool ok = Matches((*run->references)[c], outputs);
      const auto now = Clock::now();
      run->latencies[c].push_back(std::chrono::duration<double, std::milli>(now - start).count());
      if (now < run->end) {
        if (!ok)
          run->Report(ok, /*done=*/false);
        run->next(c);
      } else {
        run->Report(ok, /*done=*/true);
      }
    });
  };
  {
    std::lock_guard lock(run->mutex);
    run->running = clients;
  }
  for (int c = 0; c < clients; ++c)
    run->next(c);
  {
    std::unique_lock lock(run->mutex);
    run->changed.wait(lock, [&] { return run->running == 0; });
  }
  // The completions have reported but may still be returning: the stubs and channels go here,
  // after gRPC has released every completion, never inside one.
  while (run.use_count() > 1)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  tally.Add(run->latencies, seconds, run->failures);
}

// The one output of a gRPC answer, raw FP32; empty when it has not exactly one.
std::vector<float> RawOutputs(const inference::ModelInferResponse& response) {
  if (response.raw_output_contents_size() != 1)
    return {};
  const std::string& bytes = response.raw_output_contents(0);
  std::vector<float> outputs(bytes.size() / sizeof(float));
  std::memcpy(outputs.data(), bytes.data(), outputs.size() * sizeof(float));
  return outputs;
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
  int slices = 5;
  std::chrono::microseconds think{0};
  int features = 784;
  std::string server_pid;
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
    else if (flag == "--slices")
      slices = std::max(1, std::stoi(argv[i + 1]));
    else if (flag == "--server-pid")
      server_pid = argv[i + 1];
    else if (flag == "--think-us")
      think = std::chrono::microseconds(std::stoll(argv[i + 1]));
  }
  std::vector<std::string> models;
  std::istringstream model_words(models_text);
  for (std::string model; model_words >> model;)
    models.push_back(model);
  if (http_address.empty() || grpc_address.empty() || models.empty()) {
    std::cerr << "usage: backplane_bench_batching --http HOST:PORT --grpc HOST:PORT --models "
                 "\"a b\" [--features 784] [--seconds S] [--slices N] [--think-us T] [--runs "
                 "\"rest:64 grpc:16 rest:1\"]\n";
    return 2;
  }
  const auto colon = http_address.rfind(':');
  const std::string http_host = http_address.substr(0, colon);
  const int http_port = std::stoi(http_address.substr(colon + 1));
  int connection = 0;

  std::printf("%-5s %7s %4s  %-22s %10s %10s %8s %8s %6s %9s", "proto", "clients", "rows", "model",
              "requests/s", "rows/s", "p50 ms", "p99 ms", "failed", "max diff");
  std::printf(server_pid.empty() ? "\n" : " %10s %11s\n", "server us", "machine us");
  std::istringstream run_words(runs_text);
  for (std::string run; run_words >> run;) {
    std::istringstream parts(run);
    std::string transport, clients_text, rows_text = "1";
    std::getline(parts, transport, ':');
    std::getline(parts, clients_text, ':');
    std::getline(parts, rows_text, ':');
    const int clients = std::stoi(clients_text);
    const int rows = std::stoi(rows_text);
    // Every model's clients compare with the same references: one model's answers against
    // another's.
    std::vector<Reference> references(clients);
    std::vector<Tally> tallies(models.size());
    for (int slice = 0; slice < slices; ++slice) {
      for (std::size_t m = 0; m < models.size(); ++m) {
        const std::string& model = models[m];
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
          return [client, body, path]() -> std::vector<float> {
            auto response = client->Post(path, body, "application/json");
            if (!response || response->status != 200)
              return {};
            const auto answer = nlohmann::json::parse(response->body, nullptr, false);
            if (!answer.is_object() || !answer.contains("outputs"))
              return {};
            return answer["outputs"][0]["data"].get<std::vector<float>>();
          };
        };
        // A client's own connection (stub) and its request, for either gRPC caller.
        const auto grpc_client = [&](int c) {
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
          return std::pair{stub, request};
        };
        const auto grpc_caller = [&](int c) {
          return [client = grpc_client(c)]() -> std::vector<float> {
            grpc::ClientContext context;
            inference::ModelInferResponse response;
            if (!client.first->ModelInfer(&context, *client.second, &response).ok())
              return {};
            return RawOutputs(response);
          };
        };
        const auto grpc_async_caller = [&](int c) {
          return [client = grpc_client(c)](std::function<void(std::vector<float>)> done) {
            struct InFlight {
              grpc::ClientContext context;
              inference::ModelInferResponse response;
            };
            auto call = std::make_shared<InFlight>();
            client.first->async()->ModelInfer(
                &call->context, client.second.get(), &call->response,
                [call, done = std::move(done)](grpc::Status status) {
                  done(status.ok() ? RawOutputs(call->response) : std::vector<float>{});
                });
          };
        };
        const double server_before =
            server_pid.empty() ? 0 : backplane::bench::ProcessCpuSeconds(server_pid);
        const double client_before = backplane::bench::ProcessCpuSeconds("self");
        if (transport == "grpc-async")
          RunAsyncClients(clients, seconds / slices, grpc_async_caller, references, tallies[m]);
        else if (transport == "grpc")
          RunClients(clients, seconds / slices, think, grpc_caller, references, tallies[m]);
        else
          RunClients(clients, seconds / slices, think, rest_caller, references, tallies[m]);
        if (!server_pid.empty())
          tallies[m].server_cpu_seconds +=
              backplane::bench::ProcessCpuSeconds(server_pid) - server_before;
        tallies[m].client_cpu_seconds +=
            backplane::bench::ProcessCpuSeconds("self") - client_before;
      }
    }
    double largest_difference = 0;
    for (const auto& reference : references)
      largest_difference = std::max(largest_difference, reference.largest_difference);
    for (std::size_t m = 0; m < models.size(); ++m) {
      const RunResult result = tallies[m].Result();
      std::printf("%-5s %7d %4d  %-22s %10.0f %10.0f %8.3f %8.3f %6d %9.2g", transport.c_str(),
                  clients, rows, models[m].c_str(), result.requests_per_second,
                  result.requests_per_second * rows, result.p50_ms, result.p99_ms, result.failures,
                  largest_difference);
      if (!server_pid.empty())
        std::printf(" %10.1f %11.1f", result.server_us_per_request, result.machine_us_per_request);
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  return 0;
}
