// `backplane serve` over its life: start and startup errors, a hot reload of the backend file
// under load, graceful shutdown with requests in flight.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <thread>

#include "config/server_config.hpp"
#include "serve_test_util.hpp"

namespace backplane::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

// The mlp example's request of `rows` rows (seeded values) for client `c`.
std::string MlpRowsBody(int c, int rows) {
  std::vector<float> data;
  for (int i = 0; i < rows * 4; ++i)
    data.push_back(static_cast<float>((c * 31 + i * 7) % 13) / 13.0f - 0.5f);
  return json({{"inputs",
                {{{"name", "features"},
                  {"shape", {rows, 4}},
                  {"datatype", "FP32"},
                  {"data", data}}}}})
      .dump();
}

// Batched (issue 21): the same swaps under clients of the mlp example with dynamic batching on,
// each answer compared with the one its request got alone before the first swap.
class HotReloadUnderLoadTest : public ::testing::TestWithParam<bool> {};

TEST_P(HotReloadUnderLoadTest, HotReloadUnderLoadFailsNoRequest) {
  const bool batching = GetParam();
  if (!batching)
    BACKPLANE_REQUIRE_PATH(MnistDataDir());
  ServeHome home;
  home.Write("config.json", R"({"watch_debounce_ms": 50})");
  if (batching) {
    home.Write("models/mlp/config.json",
               R"({"backends": ["CpuRef"], "max_batch_size": 16, "dynamic_batching":
                   {"max_queue_delay_us": 2000, "preferred_batch_sizes": [4]}})");
  }
  const std::string model = batching ? "mlp" : "mnist";
  auto server =
      ServeProcess::Start({"--config", (home.path() / "config.json").string(), "--models",
                           home.models().string(), "--backends", home.backends().string()});
  auto client = server->Client();
  const uint64_t initial = Get(*client, "/v2/backends/CpuRef").body["active_generation"];

  // What each client sends, and whether an answer is right: real digits' labels, or the mlp's
  // answer to the same request before any swap.
  const int client_count = batching ? 6 : 3;
  std::vector<std::string> bodies;
  std::vector<std::function<bool(const JsonReply&)>> right;
  for (int c = 0; c < client_count; ++c) {
    if (!batching) {
      bodies.push_back(MnistRequestBody(c));
      right.push_back([c](const JsonReply& reply) { return ArgMax(reply.body) == MnistLabel(c); });
      continue;
    }
    bodies.push_back(MlpRowsBody(c, 1 + c % 2));
    const auto alone = Post(*client, "/v2/models/mlp/infer", bodies.back());
    ASSERT_EQ(alone.status, 200) << alone.text;
    right.push_back([expected = alone.body["outputs"][0]["data"].get<std::vector<float>>()](
                        const JsonReply& reply) {
      const auto data = reply.body["outputs"][0]["data"].get<std::vector<float>>();
      if (data.size() != expected.size())
        return false;
      for (std::size_t i = 0; i < data.size(); ++i) {
        if (std::abs(data[i] - expected[i]) > 1e-6f)
          return false;
      }
      return true;
    });
  }

  // Clients infer while the backend file is replaced under them.
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0};
  std::atomic<int> failed{0};
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  std::vector<std::thread> clients;
  JoinAll join_all{stop, clients};
  for (int c = 0; c < client_count; ++c) {
    clients.emplace_back([&, c] {
      auto own = server->Client();
      const std::string& body = bodies[c];
      while (!stop.load()) {
        const auto reply = Post(*own, "/v2/models/" + model + "/infer", body);
        if (reply.status == 200 && right[c](reply)) {
          ++ok;
        } else {
          ++failed;
          std::lock_guard lock(failures_mutex);
          failures.push_back(std::to_string(reply.status) + " " + reply.error + " " + reply.text);
        }
      }
    });
  }
  uint64_t generation = initial;
  for (int swap = 0; swap < 4; ++swap) {
    const int ok_before = ok.load();
    home.PublishBackendCopy();
    const bool switched = Eventually(
        [&] {
          const auto reply = Get(*client, "/v2/backends/CpuRef");
          return reply.status == 200 &&
                 reply.body["active_generation"].get<uint64_t>() > generation;
        },
        20s);
    ASSERT_TRUE(switched) << "swap " << swap << " never became active\n" << server->Log();
    generation = Get(*client, "/v2/backends/CpuRef").body["active_generation"];
    // Requests keep succeeding on the new generation before the next swap.
    EXPECT_TRUE(Eventually([&] { return ok.load() > ok_before + 3; }, 20s));
  }
  stop.store(true);
  for (auto& thread : clients)
    thread.join();

  EXPECT_EQ(failed.load(), 0) << (failures.empty() ? "" : failures.front());
  EXPECT_GT(ok.load(), 0);
  EXPECT_GE(generation, initial + 4);
  // The model migrated to the newest generation.
  EXPECT_TRUE(Eventually(
      [&] {
        return Get(*client, "/v2/models/" + model + "/placement")
                   .body["versions"][0]["layers"][0]["generation"] == generation;
      },
      10s));
  const auto metrics = client->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body, HasSubstr("backplane_backend_swaps_total{backend=\"CpuRef\"} 4\n"));
  if (batching) {
    // Requests were really joined while the swaps went on.
    const auto view = Get(*client, "/v2/models/mlp/placement").body["batching"];
    EXPECT_GT(view["requests"].get<uint64_t>(), view["executions"].get<uint64_t>()) << view.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(ServeLifecycleTest, HotReloadUnderLoadTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Batched" : "Unbatched";
                         });

// The shadow copies of CpuRef mapped into process `pid`, by path (a deleted shadow still counts).
std::set<std::string> MappedCpuRefCopies(pid_t pid) {
  return testing::MappedCode("CpuRef_backend.so", pid);
}

// The generations of CpuRef other than the active one that have not left the process yet.
std::vector<std::string> CpuRefGenerationsNotUnloaded(httplib::Client& client) {
  const auto reply = Get(client, "/v2/backends/CpuRef");
  if (reply.status != 200)
    return {"GET /v2/backends/CpuRef: " + std::to_string(reply.status)};
  std::vector<std::string> remaining;
  for (const auto& generation : reply.body["generations"]) {
    if (generation["generation"] != reply.body["active_generation"] &&
        generation["state"] != "unloaded") {
      remaining.push_back(generation.dump());
    }
  }
  return remaining;
}

// Issue 10: the models loaded at start kept the generation they were loaded on mapped through
// the network description the repository holds, long after they had migrated.
TEST(ServeLifecycleTest, EveryReplacedGenerationLeavesTheProcess) {
  BACKPLANE_REQUIRE_PATH(MnistDataDir());
  ServeHome home;
  home.Write("config.json", R"({"watch_debounce_ms": 50})");
  auto server =
      ServeProcess::Start({"--config", (home.path() / "config.json").string(), "--models",
                           home.models().string(), "--backends", home.backends().string()});
  auto client = server->Client();
  uint64_t generation = Get(*client, "/v2/backends/CpuRef").body["active_generation"];
  for (int swap = 0; swap < 3; ++swap) {
    home.PublishBackendCopy();
    ASSERT_TRUE(Eventually(
        [&] { return Get(*client, "/v2/backends/CpuRef").body["active_generation"] > generation; },
        20s))
        << "swap " << swap << " never became active\n"
        << server->Log();
    generation = Get(*client, "/v2/backends/CpuRef").body["active_generation"];
    const auto reply = Post(*client, "/v2/models/mnist/infer", MnistRequestBody(0));
    ASSERT_EQ(reply.status, 200) << reply.text;
    EXPECT_EQ(ArgMax(reply.body), MnistLabel(0));
  }

  EXPECT_TRUE(Eventually([&] { return CpuRefGenerationsNotUnloaded(*client).empty(); }, 10s))
      << ::testing::PrintToString(CpuRefGenerationsNotUnloaded(*client));
  EXPECT_TRUE(Eventually([&] { return MappedCpuRefCopies(server->pid()).size() == 1; }, 10s))
      << ::testing::PrintToString(MappedCpuRefCopies(server->pid()));
}

// Issue 18, as an operator does it: the ldconfig layout (no unversioned name), a new version
// written beside the served one, the SONAME link re-pointed forward and back, with a client
// inferring all along. The admin API's sha256 must be the content the link points at after every
// step (the two builds differ by a trailer after the ELF, so only the digest tells them apart),
// and each re-point a new generation.
TEST(ServeLifecycleTest, ServesExactlyTheFileTheSonameLinkPointsAt) {
  BACKPLANE_REQUIRE_PATH(MnistDataDir());
  ServeHome home;
  fs::remove(home.backend_file());
  const std::string name = home.backend_file().filename().string();
  const std::string code = ReadFile(CpuRefBackend());
  auto write_version = [&](const std::string& version, const std::string& trailer) {
    const fs::path temporary = home.backends() / ".incoming";
    WriteFile(temporary, code + trailer);
    fs::permissions(temporary, fs::perms(0755));
    fs::rename(temporary, home.backends() / (name + "." + version));
    const auto sum = RunCommand("sha256sum " + (home.backends() / (name + "." + version)).string());
    return sum.output.substr(0, 64);
  };
  auto point_link_at = [&](const std::string& version) {
    const fs::path temporary = home.backends() / ".incoming-link";
    fs::create_symlink(name + "." + version, temporary);
    fs::rename(temporary, home.backends() / (name + ".0"));
  };
  const std::string old_digest = write_version("0.1.0", "build A");
  point_link_at("0.1.0");
  home.Write("config.json", R"({"watch_debounce_ms": 50})");
  auto server =
      ServeProcess::Start({"--config", (home.path() / "config.json").string(), "--models",
                           home.models().string(), "--backends", home.backends().string()});
  auto client = server->Client();
  auto active = [&] {
    const auto reply = Get(*client, "/v2/backends/CpuRef");
    for (const auto& generation : reply.body["generations"]) {
      if (generation["state"] == "active")
        return generation;
    }
    return json();
  };
  ASSERT_EQ(active()["sha256"], old_digest) << server->Log();

  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::thread> clients;
  JoinAll join_all{stop, clients};
  clients.emplace_back([&] {
    auto own = server->Client();
    while (!stop.load()) {
      const auto reply = Post(*own, "/v2/models/mnist/infer", MnistRequestBody(0));
      ++(reply.status == 200 && ArgMax(reply.body) == MnistLabel(0) ? ok : failed);
    }
  });

  // Written beside the served version: nothing changes until the link points at it.
  const std::string new_digest = write_version("0.1.1", "build B");
  Post(*client, "/v2/backends/CpuRef/reload", "");
  EXPECT_EQ(active()["sha256"], old_digest);
  uint64_t generation = active()["generation"];
  for (const auto& [version, digest] : {std::pair{"0.1.1", new_digest},
                                        {"0.1.0", old_digest},
                                        {"0.1.1", new_digest},
                                        {"0.1.0", old_digest}}) {
    point_link_at(version);
    ASSERT_TRUE(Eventually([&] { return active()["sha256"] == digest; }, 20s))
        << "after pointing the link at " << version << ": " << active().dump() << "\n"
        << server->Log();
    EXPECT_GT(active()["generation"].get<uint64_t>(), generation);
    EXPECT_EQ(active()["resolved_file"],
              fs::canonical(home.backends() / (name + "." + version)).string());
    generation = active()["generation"];
  }
  stop.store(true);
  for (auto& thread : clients)
    thread.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(ok.load(), 0);
  EXPECT_TRUE(Eventually([&] { return CpuRefGenerationsNotUnloaded(*client).empty(); }, 10s))
      << ::testing::PrintToString(CpuRefGenerationsNotUnloaded(*client));
}

// Issue 13: a server that exits cleanly after deploys and a rollback leaves nothing in its shadow
// directory: not the copies, not the rollback copies, not their empty directories.
TEST(ServeLifecycleTest, ACleanExitLeavesNothingInTheShadowDirectory) {
  ServeHome home;
  TempDir shadow_root;
  home.Write("config.json", R"({"watch_debounce_ms": 50})");
  auto server =
      ServeProcess::Start({"--config", (home.path() / "config.json").string(), "--models",
                           home.models().string(), "--backends", home.backends().string()},
                          {{"BACKPLANE_SHADOW_DIR", shadow_root.path().string()}});
  auto client = server->Client();
  const uint64_t first = Get(*client, "/v2/backends/CpuRef").body["active_generation"];
  home.PublishBackendCopy();
  ASSERT_TRUE(Eventually(
      [&] { return Get(*client, "/v2/backends/CpuRef").body["active_generation"] > first; }, 20s))
      << server->Log();
  ASSERT_EQ(Post(*client, "/v2/backends/CpuRef/rollback", "").status, 200) << server->Log();
  const fs::path process_shadows = shadow_root.path() / ("backplane-" + std::to_string(getuid())) /
                                   std::to_string(server->pid());
  std::vector<std::string> during;
  for (const auto& entry : fs::recursive_directory_iterator(process_shadows))
    during.push_back(entry.path().lexically_relative(process_shadows).string());
  EXPECT_THAT(during, ::testing::Contains(::testing::StartsWith("rollback-")));

  server->Signal(SIGTERM);
  ASSERT_EQ(server->WaitForExit(30s), 0) << server->Log();
  EXPECT_FALSE(fs::exists(process_shadows));
  for (const auto& entry : fs::recursive_directory_iterator(shadow_root.path())) {
    if (entry.is_regular_file() || entry.path().parent_path() != shadow_root.path())
      ADD_FAILURE() << entry.path() << " is left in the shadow directory";
  }
}

// A client that sends the headers and half of the body of an MNIST request, the rest later:
// from the server's point of view, a request in flight.
class SlowRequest {
 public:
  SlowRequest(int port, const std::string& body) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
      throw std::runtime_error("connect failed");
    const std::string head =
        "POST /v2/models/mnist/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n";
    half_ = body.size() / 2;
    Send(head + body.substr(0, half_));
    rest_ = body.substr(half_);
  }
  ~SlowRequest() { close(fd_); }

  // Sends the rest and reads the response until the server closes the connection.
  std::string Finish() {
    Send(rest_);
    std::string response;
    char buffer[4096];
    ssize_t n;
    while ((n = read(fd_, buffer, sizeof buffer)) > 0)
      response.append(buffer, static_cast<std::size_t>(n));
    return response;
  }

 private:
  void Send(const std::string& data) {
    for (std::size_t done = 0; done < data.size();) {
      const ssize_t n = write(fd_, data.data() + done, data.size() - done);
      if (n <= 0)
        throw std::runtime_error("write failed");
      done += static_cast<std::size_t>(n);
    }
  }
  int fd_ = -1;
  std::size_t half_ = 0;
  std::string rest_;
};

int64_t HttpRequestsInFlight(httplib::Client& client) {
  const auto reply = client.Get("/metrics");
  if (!reply)
    return -1;
  std::smatch match;
  static const std::regex kGauge("\nbackplane_http_requests_in_flight ([0-9]+)\n");
  return std::regex_search(reply->body, match, kGauge) ? std::stoll(match[1].str()) : -1;
}

TEST(ServeLifecycleTest, SigtermFinishesRequestsInFlightThenExitsZero) {
  BACKPLANE_REQUIRE_PATH(MnistDataDir());
  ServeHome home;
  auto server = ServeProcess::Start(
      {"--models", home.models().string(), "--backends", home.backends().string()});
  std::vector<std::unique_ptr<SlowRequest>> requests;
  for (int i = 0; i < 3; ++i)
    requests.push_back(std::make_unique<SlowRequest>(server->port(), MnistRequestBody(i)));
  // All three are being handled (the scrape itself is the fourth).
  {
    auto client = server->Client();
    ASSERT_TRUE(Eventually([&] { return HttpRequestsInFlight(*client) == 4; }, 10s));
  }

  server->Signal(SIGTERM);
  ASSERT_TRUE(server->WaitForLog("SIGTERM received", 10s)) << server->Log();
  // New requests are no longer accepted.
  EXPECT_TRUE(Eventually([&] { return !server->Client()->Get("/v2/health/live"); }, 10s));

  for (int i = 0; i < 3; ++i) {
    const std::string response = requests[i]->Finish();
    EXPECT_THAT(response, ::testing::StartsWith("HTTP/1.1 200")) << response;
    const auto body = json::parse(response.substr(response.find("\r\n\r\n") + 4), nullptr, false);
    ASSERT_FALSE(body.is_discarded()) << response;
    EXPECT_EQ(ArgMax(body), MnistLabel(i));
  }
  EXPECT_EQ(server->WaitForExit(30s), 0) << server->Log();
  EXPECT_THAT(server->Log(), HasSubstr("every backend generation unloaded"));
}

TEST(ServeLifecycleTest, SigintExitsZero) {
  ServeHome home;
  auto server = ServeProcess::Start(
      {"--models", home.models().string(), "--backends", home.backends().string()});
  server->Signal(SIGINT);
  EXPECT_EQ(server->WaitForExit(30s), 0) << server->Log();
  EXPECT_THAT(server->Log(), HasSubstr("SIGINT received"));
}

TEST(ServeLifecycleTest, ConfigErrorsNameTheKeyAndStopTheStart) {
  ServeHome home;
  home.Write("bad.json", R"({"listen": "127.0.0.1:0", "listne": "0.0.0.0:80"})");
  const auto unknown = ServeProcess::RunToExit({"--config", (home.path() / "bad.json").string()});
  EXPECT_EQ(unknown.exit_code, 1) << unknown.output;
  EXPECT_THAT(unknown.output, HasSubstr("unknown key 'listne'"));

  home.Write("type.json", R"({"http_threads": "many"})");
  const auto type = ServeProcess::RunToExit({"--config", (home.path() / "type.json").string()});
  EXPECT_EQ(type.exit_code, 1);
  EXPECT_THAT(type.output, HasSubstr("'http_threads' must be an integer, got \"many\""));

  const auto listen = ServeProcess::RunToExit({"--listen", "nowhere"});
  EXPECT_EQ(listen.exit_code, 1);
  EXPECT_THAT(listen.output, HasSubstr("listen address 'nowhere' has no port"));
}

TEST(ServeLifecycleTest, AnAddressInUseFailsTheStart) {
  ServeHome home;
  auto first = ServeProcess::Start(
      {"--models", home.models().string(), "--backends", home.backends().string()});
  const auto second =
      ServeProcess::RunToExit({"--listen", "127.0.0.1:" + std::to_string(first->port()), "--models",
                               home.models().string(), "--backends", home.backends().string()});
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_THAT(second.output,
              HasSubstr("cannot listen on 127.0.0.1:" + std::to_string(first->port())));
}

TEST(ServeLifecycleTest, CurlClassifiesTheExampleDigit) {
  BACKPLANE_REQUIRE_COMMAND("curl", "curl");
  ServeHome home;
  auto server = ServeProcess::Start(
      {"--models", home.models().string(), "--backends", home.backends().string()});
  // The README's line, against this server.
  const auto classified =
      RunCommand("curl -s -X POST --data @" + std::string(BACKPLANE_SOURCE_DIR) +
                 "/models/mnist/example_request.json " + server->url() + "/v2/models/mnist/infer");
  ASSERT_EQ(classified.exit_code, 0);
  const auto body = json::parse(classified.output, nullptr, false);
  ASSERT_FALSE(body.is_discarded()) << classified.output;
  EXPECT_EQ(ArgMax(body), 5) << classified.output;
  // `curl -X POST` without data sends no Content-Length: no body, answered at once.
  const auto load = RunCommand("curl -s -m 3 -w ' %{http_code}' -X POST " + server->url() +
                               "/v2/repository/models/mlp/load");
  EXPECT_THAT(load.output, ::testing::EndsWith(" 200")) << load.output;
}

// Operators and profilers tell the server's threads apart by name (top -H, perf, gdb), not as
// a hundred threads called "backplane".
TEST(ServeLifecycleTest, TheServersThreadsAreNamedAfterTheirRoles) {
  ServeHome home;
  home.Write("models/mlp/config.json",
             R"({"backends": ["CpuRef"], "max_batch_size": 8, "dynamic_batching": {}})");
  auto server = ServeProcess::Start(
      {"--models", home.models().string(), "--backends", home.backends().string()});
  // A request, so that TBB's workers join the runtime's arena (they do so on demand).
  auto client = server->Client();
  ASSERT_EQ(Post(*client, "/v2/models/mlp/infer", MlpRowsBody(0, 1)).status, 200);
  std::multiset<std::string> names;
  for (const auto& task :
       fs::directory_iterator("/proc/" + std::to_string(server->pid()) + "/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    names.insert(name);
  }
  std::string all;
  for (const auto& name : names)
    all += name + " ";
  for (const char* role : {"bp-http-io", "bp-http-handler", "bp-reaper", "bp-watcher",
                           "bp-shape-queue", "bp-batch-parse", "bp-batch-disp", "bp-exec"})
    EXPECT_TRUE(names.contains(role)) << role << " among: " << all;
  // Every thread of the REST handler pool, not most of them.
  EXPECT_EQ(names.count("bp-http-handler"),
            static_cast<std::size_t>(server::ServeConfig{}.http_threads))
      << all;
}

}  // namespace
}  // namespace backplane::testing
