#include "serve_test_util.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>

#include <atomic>
#include <fstream>
#include <regex>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "backplane/onnx/network.hpp"
#include "onnx/model_builder.hpp"

namespace backplane::testing {
namespace fs = std::filesystem;
using nlohmann::json;

// ---- ServeHome ------------------------------------------------------------------------------

ServeHome::ServeHome() {
  fs::create_directory(backends());
  fs::permissions(backends(), fs::perms(0700));
  CopyFile(CpuRefBackend(), backend_file());
  fs::copy(fs::path(BACKPLANE_SOURCE_DIR) / "models", models(), fs::copy_options::recursive);
}

void ServeHome::Publish(const fs::path& built, const std::string& file_name) const {
  static std::atomic<int> counter{0};
  const fs::path temporary = backends() / (".publish-" + std::to_string(counter++) + ".tmp");
  CopyFile(built, temporary);
  const int fd = open(temporary.c_str(), O_RDONLY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
  fs::rename(temporary, backends() / file_name);
}

void ServeHome::PublishBackendCopy() const {
  Publish(CpuRefBackend(), backend_file().filename());
}

void ServeHome::Write(const fs::path& relative, std::string_view text) const {
  fs::create_directories((path() / relative).parent_path());
  WriteFile(path() / relative, text);
}

// ---- ServeProcess ---------------------------------------------------------------------------

ServeProcess::ServeProcess(pid_t pid, fs::path log_file)
    : pid_(pid), log_file_(std::move(log_file)) {}

ServeProcess::~ServeProcess() {
  if (!exit_code_) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  // Under the sanitizer presets the server reports its errors in its log, not in an exit code
  // a test would look at.
  const std::string log = Log();
  for (const char* report : {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                             "runtime error:", "WARNING: ThreadSanitizer"}) {
    if (log.find(report) != std::string::npos)
      ADD_FAILURE() << "backplane serve reported \"" << report << "\":\n" << log;
  }
  std::error_code error;
  fs::remove(log_file_, error);
}

namespace {

pid_t Spawn(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
            const fs::path& log_file) {
  // Everything the child needs is prepared before fork: between fork and exec a child of a
  // multi-threaded process may only call async-signal-safe functions (no malloc, no setenv).
  std::vector<std::string> argv_storage = {BACKPLANE_EXECUTABLE, "serve"};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<std::string> env_storage;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    if (!env.contains(std::string(text.substr(0, text.find('=')))))
      env_storage.emplace_back(text);
  }
  for (const auto& [name, value] : env)
    env_storage.push_back(name + "=" + value);
  std::vector<char*> argv;
  for (auto& arg : argv_storage)
    argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& entry : env_storage)
    envp.push_back(entry.data());
  envp.push_back(nullptr);
  const int fd = open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // A test process that crashes must not leave servers behind: the server gets SIGKILL when
    // the thread that started it ends (tests start servers from the main thread).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(127);
    dup2(fd, STDOUT_FILENO);  // dup2 clears O_CLOEXEC on the copies
    dup2(fd, STDERR_FILENO);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(fd);
  return pid;
}

fs::path NewLogFile() {
  static std::atomic<int> counter{0};
  return fs::temp_directory_path() / ("backplane-serve-test-" + std::to_string(getpid()) + "-" +
                                      std::to_string(counter++) + ".log");
}

}  // namespace

std::unique_ptr<ServeProcess> ServeProcess::Start(const std::vector<std::string>& args,
                                                  const std::map<std::string, std::string>& env) {
  // gRPC on a free port too, unless the test chooses: servers of parallel tests must never
  // meet on the default 8001.
  std::vector<std::string> all = {"--listen", "127.0.0.1:0"};
  const auto grpc_flag = std::find(args.begin(), args.end(), "--grpc-listen");
  if (grpc_flag == args.end())
    all.insert(all.end(), {"--grpc-listen", "127.0.0.1:0"});
  const bool grpc =
      grpc_flag == args.end() || (grpc_flag + 1 != args.end() && grpc_flag[1] != "off");
  all.insert(all.end(), args.begin(), args.end());
  const fs::path log_file = NewLogFile();
  std::unique_ptr<ServeProcess> process(new ServeProcess(Spawn(all, env, log_file), log_file));
  static const std::regex kListening(R"(listening on http://127\.0\.0\.1:([0-9]+))");
  static const std::regex kGrpcListening(R"(listening on grpc://[^:]+:([0-9]+))");
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    std::smatch match, grpc_match;
    const std::string log = process->Log();
    if (std::regex_search(log, match, kListening) &&
        (!grpc || std::regex_search(log, grpc_match, kGrpcListening))) {
      process->port_ = std::stoi(match[1].str());
      if (grpc)
        process->grpc_port_ = std::stoi(grpc_match[1].str());
      return process;
    }
    if (auto code = process->WaitForExit(0ms)) {
      throw std::runtime_error("backplane serve exited with " + std::to_string(*code) +
                               " before listening:\n" + log);
    }
    std::this_thread::sleep_for(10ms);
  }
  throw std::runtime_error("backplane serve did not listen within 30 s:\n" + process->Log());
}

CommandResult ServeProcess::RunToExit(const std::vector<std::string>& args,
                                      std::chrono::milliseconds timeout) {
  const fs::path log_file = NewLogFile();
  ServeProcess process(Spawn(args, {}, log_file), log_file);
  CommandResult result;
  result.exit_code = process.WaitForExit(timeout).value_or(-1);
  result.output = process.Log();
  return result;
}

std::unique_ptr<httplib::Client> ServeProcess::Client() const {
  auto client = std::make_unique<httplib::Client>("127.0.0.1", port_);
  client->set_connection_timeout(5, 0);
  client->set_read_timeout(30, 0);
  client->set_write_timeout(30, 0);
  return client;
}

void ServeProcess::Signal(int signal_number) const {
  kill(pid_, signal_number);
}

std::optional<int> ServeProcess::WaitForExit(std::chrono::milliseconds timeout) {
  if (exit_code_)
    return exit_code_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  do {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      terminating_signal_ = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      return exit_code_;
    }
    if (timeout > 0ms)
      std::this_thread::sleep_for(10ms);
  } while (std::chrono::steady_clock::now() < deadline);
  return std::nullopt;
}

std::string ServeProcess::Log() const {
  return ReadFile(log_file_);
}

bool ServeProcess::WaitForLog(std::string_view needle, std::chrono::milliseconds timeout) const {
  return Eventually([&] { return Log().find(needle) != std::string::npos; }, timeout);
}

// ---- MNIST ----------------------------------------------------------------------------------

namespace {
fs::path MnistDir() {
  return fs::path(BACKPLANE_SHARED_DATA) / "models" / "mnist";
}
}  // namespace

fs::path MnistDataDir() {
  return MnistDir() / "test_data_set_0";
}

server::ServeConfig InProcessConfig(const ServeHome& home, bool grpc) {
  server::ServeConfig config = server::DefaultServeConfig();
  config.models = home.models();
  config.backends = std::vector<fs::path>{home.backends()};
  config.listen = "127.0.0.1:0";
  config.grpc_listen = grpc ? "127.0.0.1:0" : server::kGrpcOff;
  config.watch_backends = false;
  return config;
}

server::RunningServer StartInProcess(const server::ServeConfig& config) {
  auto started = server::StartServer(config);
  if (!started.ok())
    throw std::runtime_error("server did not start: " + started.error().ToString());
  return std::move(started).value();
}

std::future<Result<server::InferenceOutcome>> StartInference(
    const server::InferenceApi& inference, const std::string& model,
    server::InferenceRequestParser parse, server::RunOn run_on,
    std::optional<std::chrono::steady_clock::time_point> deadline) {
  auto answer = std::make_shared<std::promise<Result<server::InferenceOutcome>>>();
  auto future = answer->get_future();
  inference.Infer(server::InferenceCall{.model = model,
                                        .version = "",
                                        .parse = std::move(parse),
                                        .run_on = run_on,
                                        .deadline = deadline,
                                        .done = [answer](Result<server::InferenceOutcome> outcome) {
                                          answer->set_value(std::move(outcome));
                                        }});
  return future;
}

Result<server::InferenceOutcome> InferNow(const server::InferenceApi& inference,
                                          const std::string& model,
                                          server::InferenceRequestParser parse) {
  return StartInference(inference, model, std::move(parse), server::RunOn::kCaller).get();
}

std::vector<float> UniformFloats(std::mt19937_64& random, std::size_t count, float bound) {
  std::uniform_real_distribution<float> value(-bound, bound);
  std::vector<float> values(count);
  for (float& v : values)
    v = value(random);
  return values;
}

std::string RowIdentityModel() {
  ModelBuilder builder;
  builder.Input("x", {-1, 4}).Output("y", {-1, 4});
  builder.Node("Identity", {"x"}, {"y"});
  return builder.Serialize();
}

std::string RowRequest(float first) {
  return nlohmann::json{{"inputs",
                         {{{"name", "x"},
                           {"shape", {1, 4}},
                           {"datatype", "FP32"},
                           {"data", {first, 2.0, 3.0, 4.0}}}}}}
      .dump();
}

RowClients::RowClients(int port, std::string path, int clients,
                       std::function<float(int, int)> first) {
  for (int c = 0; c < clients; ++c) {
    threads_.emplace_back([this, port, path, c, first] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(30, 0);
      for (int i = 0; !stop_.load(); ++i) {
        const float row = first(c, i);
        JsonReply reply = Post(client, path, RowRequest(row));
        if (reply.status == 200 && reply.body["outputs"][0]["data"][0] == row) {
          ++answered_;
        } else {
          std::lock_guard lock(mutex_);
          failures_.push_back(std::to_string(reply.status) + " " + reply.text);
        }
      }
    });
  }
}

void RowClients::Stop() {
  stop_.store(true);
  for (auto& thread : threads_) {
    if (thread.joinable())
      thread.join();
  }
}

std::vector<std::string> RowClients::failures() const {
  std::lock_guard lock(mutex_);
  return failures_;
}

std::string MnistRequestBody(int index) {
  auto tensor =
      ReadTensorProtoFile(MnistDir() / ("test_data_set_" + std::to_string(index)) / "input_0.pb");
  if (!tensor.ok())
    throw std::runtime_error(tensor.error().ToString());
  json data = json::array();
  for (float value : tensor->Elements<float>())
    data.push_back(value);
  return json({{"id", "image-" + std::to_string(index)},
               {"inputs",
                {{{"name", "Input3"},
                  {"shape", tensor->info().shape},
                  {"datatype", "FP32"},
                  {"data", data}}}}})
      .dump();
}

int MnistLabel(int index) {
  static constexpr int kLabels[] = {5, 0, 4};
  return kLabels[index];
}

int ArgMax(const json& response) {
  const auto& data = response.at("outputs").at(0).at("data");
  int best = 0;
  for (int i = 1; i < static_cast<int>(data.size()); ++i) {
    if (data[i].get<double>() > data[best].get<double>())
      best = i;
  }
  return best;
}

// ---- HTTP -----------------------------------------------------------------------------------

namespace {
JsonReply ToReply(const httplib::Result& result) {
  JsonReply reply;
  if (!result) {
    reply.error = httplib::to_string(result.error());
    return reply;
  }
  reply.status = result->status;
  reply.text = result->body;
  reply.body = json::parse(result->body, nullptr, false);
  if (reply.body.is_discarded())
    reply.body = nullptr;
  return reply;
}
}  // namespace

JsonReply Post(httplib::Client& client, const std::string& path, const std::string& body,
               const httplib::Headers& headers) {
  return ToReply(client.Post(path.c_str(), headers, body, "application/json"));
}

JsonReply Get(httplib::Client& client, const std::string& path) {
  return ToReply(client.Get(path.c_str()));
}

JsonReply Put(httplib::Client& client, const std::string& path, const std::string& body,
              const httplib::Headers& headers) {
  return ToReply(client.Put(path.c_str(), headers, body, "application/json"));
}

// ---- Progressive rollouts of TestValid -----------------------------------------------------

std::unique_ptr<httplib::Client> RolloutServer::Client() const {
  auto client = std::make_unique<httplib::Client>("127.0.0.1", running.http.port);
  client->set_read_timeout(30, 0);
  return client;
}

json RolloutServer::Deploy(std::string_view name, const httplib::Headers& token) const {
  home.Publish(Fixture(name), backend_file().filename());
  auto client = Client();
  return Post(*client, std::string("/v2/backends/") + kBackend + "/reload", "", token).body;
}

json RolloutServer::Rollout() const {
  auto client = Client();
  return Get(*client, std::string("/v2/backends/") + kBackend + "/rollout").body;
}

json RolloutServer::WaitForDecision() const {
  json view;
  Eventually(
      [&] {
        view = Rollout();
        return view["phase"] == "promoted" || view["phase"] == "rolled_back";
      },
      kDecisionTimeout);
  return view;
}

std::unique_ptr<RolloutServer> StartRolloutServer(
    const std::string& rollout_policy, const std::string& admin_token,
    const std::function<void(const RolloutServer&)>& files) {
  auto server = std::make_unique<RolloutServer>();
  server->home.Write("models/identity/1/model.onnx", RowIdentityModel());
  server->home.Write("models/identity/config.json", R"({"backends": ["TestValid"]})");
  if (files)
    files(*server);
  else
    CopyFile(Fixture("Valid"), server->backend_file());
  server::ServeConfig config = InProcessConfig(server->home);
  config.admin_token = admin_token;
  Status applied = server::ApplyConfigText(
      R"({"deploy_policy": "progressive", "rollout": )" + rollout_policy + "}", "test.json",
      config);
  if (!applied.ok())
    throw std::runtime_error(applied.ToString());
  auto started = server::StartServer(config);
  if (!started.ok())
    throw std::runtime_error("server did not start: " + started.error().ToString());
  server->running = std::move(started).value();
  return server;
}

}  // namespace backplane::testing
