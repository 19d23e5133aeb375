// Helpers of the `backplane serve` end-to-end tests: a server process on a free loopback port,
// with its own copy of the CpuRef backend and of the example model repository.
#pragma once

#include <httplib.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "cli/serve_command.hpp"
#include "serving/inference.hpp"
#include "test_util.hpp"

namespace backplane::testing {

using namespace std::chrono_literals;

// A temporary server home: backends/ with a copy of CpuRef as Backplane_CpuRef_backend.so,
// models/ with a copy of the source tree's example repository (mnist, mlp).
class ServeHome {
 public:
  ServeHome();
  const std::filesystem::path& path() const { return dir_.path(); }
  std::filesystem::path backends() const { return dir_ / "backends"; }
  std::filesystem::path models() const { return dir_ / "models"; }
  std::filesystem::path backend_file() const { return backends() / "Backplane_CpuRef_backend.so"; }
  // Publishes a copy of `built` as backends()/`file_name` the safe way: write a temporary file
  // in the same directory, fsync, rename over (docs/loading-rules.md rule 7). Each call is a new
  // file identity: a hot deploy.
  void Publish(const std::filesystem::path& built, const std::string& file_name) const;
  // Publish of CpuRef over backend_file().
  void PublishBackendCopy() const;
  // Writes `text` to `relative` under path().
  void Write(const std::filesystem::path& relative, std::string_view text) const;

 private:
  TempDir dir_;
};

// A running `backplane serve`. Stopped with SIGKILL on destruction if still running.
class ServeProcess {
 public:
  // Starts BACKPLANE_EXECUTABLE serve --listen 127.0.0.1:0 --grpc-listen 127.0.0.1:0 (unless
  // `args` has --grpc-listen) plus `args`, with `env` added to the environment, and waits
  // (deadline 30 s) for its "listening on http://HOST:PORT" line (and the grpc:// one). Throws
  // std::runtime_error with the log when it exits or the deadline passes first.
  static std::unique_ptr<ServeProcess> Start(const std::vector<std::string>& args,
                                             const std::map<std::string, std::string>& env = {});
  // Runs a server that is expected to fail at start; returns its exit code and log.
  static CommandResult RunToExit(const std::vector<std::string>& args,
                                 std::chrono::milliseconds timeout = 30s);
  ~ServeProcess();

  int port() const { return port_; }
  int grpc_port() const { return grpc_port_; }  // 0 when gRPC is off
  std::string grpc_target() const { return "127.0.0.1:" + std::to_string(grpc_port_); }
  pid_t pid() const { return pid_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::unique_ptr<httplib::Client> Client() const;

  void Signal(int signal_number) const;
  // The exit code (128 + signal when killed), or nullopt when still running at the deadline.
  std::optional<int> WaitForExit(std::chrono::milliseconds timeout);
  // The signal that ended the process; 0 when it exited (or has not been waited for).
  int terminating_signal() const { return terminating_signal_; }
  std::string Log() const;
  // Polls the log until it contains `needle`.
  bool WaitForLog(std::string_view needle, std::chrono::milliseconds timeout) const;

 private:
  ServeProcess(pid_t pid, std::filesystem::path log_file);
  pid_t pid_;
  std::filesystem::path log_file_;
  int port_ = 0;
  int grpc_port_ = 0;
  std::optional<int> exit_code_;
  int terminating_signal_ = 0;
};

// Polls `condition` every 10 ms until it holds or `timeout` passes.
template <typename Condition>
bool Eventually(Condition condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition())
      return true;
    std::this_thread::sleep_for(10ms);
  }
  return condition();
}

// The KServe request body for MNIST test image `index` (0, 1, 2) of the shared data, and its
// label (5, 0, 4).
std::string MnistRequestBody(int index);
int MnistLabel(int index);
// argmax of a response's first output.
int ArgMax(const nlohmann::json& response);
std::filesystem::path MnistDataDir();  // the test images; see BACKPLANE_REQUIRE_PATH

// A POST with a JSON body; the body of the response parsed (null when not JSON).
struct JsonReply {
  int status = 0;  // 0: no response (connection error)
  nlohmann::json body;
  std::string text;
  std::string error;  // the connection error, when status is 0
};
JsonReply Post(httplib::Client& client, const std::string& path, const std::string& body,
               const httplib::Headers& headers = {});
JsonReply Get(httplib::Client& client, const std::string& path);
JsonReply Put(httplib::Client& client, const std::string& path, const std::string& body,
              const httplib::Headers& headers = {});

// Client threads of a test, stopped and joined on every way out of it (failed assertions too).
struct JoinAll {
  std::atomic<bool>& stop;
  std::vector<std::thread>& threads;
  ~JoinAll() {
    stop.store(true);
    for (auto& thread : threads) {
      if (thread.joinable())
        thread.join();
    }
  }
};

// A server in this process over `home`'s models and backends: REST on a free loopback port,
// gRPC too when `grpc`, the backend directory not watched (deploys are the test's reloads).
server::ServeConfig InProcessConfig(const ServeHome& home, bool grpc = false);
// server::StartServer, throwing std::runtime_error with its error when the server does not start.
server::RunningServer StartInProcess(const server::ServeConfig& config);

// One inference through the entry point the transports use (InferenceApi::Infer): the future has
// its outcome.
std::future<Result<server::InferenceOutcome>> StartInference(
    const server::InferenceApi& inference, const std::string& model,
    server::InferenceRequestParser parse, server::RunOn run_on = server::RunOn::kQueue,
    std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);
// The same, waited for.
Result<server::InferenceOutcome> InferNow(const server::InferenceApi& inference,
                                          const std::string& model,
                                          server::InferenceRequestParser parse);

// `count` floats drawn uniformly from [-bound, bound): the seeded weights of a model a test
// writes.
std::vector<float> UniformFloats(std::mt19937_64& random, std::size_t count, float bound);

// Identity over x [N, 4] (N symbolic): the fixture backends' model (TestValid's Identity adds its
// build's offset, TestCrash's dies the way x[0] says).
std::string RowIdentityModel();
// One row [first, 2, 3, 4] for RowIdentityModel, as a KServe v2 JSON body.
std::string RowRequest(float first);

// Client threads that send RowIdentityModel rows to `path` until stopped, each checking that
// the answer's first element is its row's (`first(client, i)` chooses it): counts the answers
// and keeps every failure. Stopped and joined on every way out of a test.
class RowClients {
 public:
  RowClients(int port, std::string path, int clients, std::function<float(int, int)> first);
  ~RowClients() { Stop(); }
  void Stop();
  int answered() const { return answered_.load(); }
  std::vector<std::string> failures() const;  // "503 {body}", in the order seen

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> answered_{0};
  mutable std::mutex mutex_;
  std::vector<std::string> failures_;  // guarded by mutex_
  std::vector<std::thread> threads_;
};

// ---- Progressive rollouts of TestValid -----------------------------------------------------

// A server in this process serving `identity` (RowIdentityModel) on TestValid, deploy policy
// progressive; deploys are explicit (the admin API's reload).
struct RolloutServer {
  static constexpr char kBackend[] = "TestValid";
  static constexpr auto kDecisionTimeout = std::chrono::seconds(90);

  ServeHome home;
  server::RunningServer running;
  std::filesystem::path backend_file() const { return home.backends() / "Test_Valid_backend.so"; }
  std::unique_ptr<httplib::Client> Client() const;
  // Publishes fixture `name` as TestValid's file (write beside, rename into place) and has the
  // server look at it, as the watcher would; the reload's answer.
  nlohmann::json Deploy(std::string_view name, const httplib::Headers& token = {}) const;
  nlohmann::json Rollout() const;  // GET …/rollout
  // Waits until the rollout has ended (promoted or rolled back); its last view.
  nlohmann::json WaitForDecision() const;
};

// `rollout_policy`: the config's "rollout" object. `files` (default: the Valid fixture as
// TestValid's file) writes the backend directory. Throws std::runtime_error when the server does
// not start.
std::unique_ptr<RolloutServer> StartRolloutServer(
    const std::string& rollout_policy, const std::string& admin_token = "",
    const std::function<void(const RolloutServer&)>& files = {});

// One server shared by every test of a suite: starting one per test would cost a second each.
// `Suite::PrepareHome(home)` (optional) writes what the suite needs before the start (a config,
// models) and returns arguments to add. Each suite (CRTP) has a server of its own.
template <typename Suite>
class SharedServerTest : public ::testing::Test {
 protected:
  static std::vector<std::string> PrepareHome(const ServeHome&) { return {}; }

  static void SetUpTestSuite() {
    home_ = std::make_unique<ServeHome>();
    std::vector<std::string> args = Suite::PrepareHome(*home_);
    args.insert(args.end(),
                {"--models", home_->models().string(), "--backends", home_->backends().string()});
    server_ = ServeProcess::Start(args);
  }
  static void TearDownTestSuite() {
    server_.reset();
    home_.reset();
  }
  void SetUp() override { client_ = server_->Client(); }

  static inline std::unique_ptr<ServeHome> home_;
  static inline std::unique_ptr<ServeProcess> server_;
  std::unique_ptr<httplib::Client> client_;
};

}  // namespace backplane::testing
