// The backend admin API, the bearer token, and /metrics of `backplane serve`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "serve_test_util.hpp"

namespace backplane::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kMlpRequest[] =
    R"({"inputs":[{"name":"features","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]})";

// A server whose backend directory is not watched: reloads happen only when a test asks.
std::unique_ptr<ServeProcess> StartUnwatched(const ServeHome& home,
                                             std::vector<std::string> extra = {},
                                             const std::map<std::string, std::string>& env = {}) {
  home.Write("config.json", R"({"watch_backends": false})");
  std::vector<std::string> args = {"--config",   (home.path() / "config.json").string(),
                                   "--models",   home.models().string(),
                                   "--backends", home.backends().string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return ServeProcess::Start(args, env);
}

uint64_t ActiveGeneration(httplib::Client& client) {
  const auto reply = Get(client, "/v2/backends/CpuRef");
  return reply.status == 200 ? reply.body["active_generation"].get<uint64_t>() : 0;
}

TEST(ServeAdminTest, DescribesBackendsTheirGenerationsAndRejectedFiles) {
  ServeHome home;
  // A file named like a backend that is not one: listed with its reason code.
  home.Write("backends/Acme_Broken_backend.so", "not an ELF file");
  std::filesystem::permissions(home.backends() / "Acme_Broken_backend.so",
                               std::filesystem::perms(0755));
  auto server = StartUnwatched(home);
  auto client = server->Client();

  const auto all = Get(*client, "/v2/backends");
  ASSERT_EQ(all.status, 200) << all.text;
  ASSERT_EQ(all.body["backends"].size(), 1u) << all.text;
  const json& cpu_ref = all.body["backends"][0];
  EXPECT_EQ(cpu_ref["id"], "CpuRef");
  EXPECT_EQ(cpu_ref["static"], false);
  EXPECT_GE(cpu_ref["active_generation"].get<uint64_t>(), 1u);
  ASSERT_FALSE(cpu_ref["generations"].empty());
  const json& active = cpu_ref["generations"][0];
  EXPECT_EQ(active["generation"], cpu_ref["active_generation"]);
  EXPECT_EQ(active["state"], "active");
  EXPECT_THAT(active["file"].get<std::string>(), HasSubstr("Backplane_CpuRef_backend.so"));
  EXPECT_EQ(active["release"], "0.1.0");
  EXPECT_THAT(active["api_version"].get<std::string>(), ::testing::MatchesRegex("[0-9]+\\.[0-9]+"));
  EXPECT_GE(active["refcount"].get<long>(), 1);
  EXPECT_THAT(active["loaded_at"].get<std::string>(),
              ::testing::MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T.*Z"));
  EXPECT_TRUE(active.contains("drain_ms"));
  // Which file serves, and exactly what it contains: the real file and the digest of the copy
  // mapped, as sha256sum computes it; /metrics carries the same as an info metric.
  EXPECT_EQ(active["resolved_file"], fs::canonical(home.backend_file()).string());
  const auto sha256sum = RunCommand("sha256sum " + home.backend_file().string());
  ASSERT_EQ(sha256sum.exit_code, 0);
  EXPECT_EQ(active["sha256"], sha256sum.output.substr(0, 64));
  const auto metrics = client->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(
      metrics->body,
      HasSubstr("backplane_backend_active_generation_info{backend=\"CpuRef\",generation=\"" +
                std::to_string(active["generation"].get<uint64_t>()) + "\",resolved_file=\"" +
                active["resolved_file"].get<std::string>() + "\",sha256=\"" +
                sha256sum.output.substr(0, 64) + "\",release=\"0.1.0\"} 1\n"));

  ASSERT_EQ(all.body["rejected"].size(), 1u) << all.text;
  EXPECT_THAT(all.body["rejected"][0]["file"].get<std::string>(),
              HasSubstr("Acme_Broken_backend.so"));
  EXPECT_EQ(all.body["rejected"][0]["reason"], "NOT_ELF");
  EXPECT_FALSE(all.body["rejected"][0]["message"].get<std::string>().empty());

  const auto one = Get(*client, "/v2/backends/CpuRef");
  ASSERT_EQ(one.status, 200);
  EXPECT_EQ(one.body["id"], "CpuRef");
  EXPECT_EQ(one.body["active_generation"], cpu_ref["active_generation"]);
  const auto unknown = Get(*client, "/v2/backends/GpuAcc");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_THAT(unknown.body["error"].get<std::string>(),
              HasSubstr("unknown backend 'GpuAcc' (known: CpuRef)"));
}

TEST(ServeAdminTest, OptionsAreTypedAndUpdatedAllOrNothing) {
  ServeHome home;
  auto server = StartUnwatched(home);
  auto client = server->Client();

  const auto options = Get(*client, "/v2/backends/CpuRef/options");
  ASSERT_EQ(options.status, 200) << options.text;
  const json& deterministic = options.body["options"]["deterministic"];
  EXPECT_EQ(deterministic["type"], "bool");
  EXPECT_EQ(deterministic["default"], true);
  EXPECT_EQ(deterministic["value"], true);
  EXPECT_FALSE(deterministic["help"].get<std::string>().empty());
  EXPECT_EQ(deterministic["per_call"], false);
  EXPECT_EQ(options.body["options"]["check_finite"]["per_call"], true) << "SDK 1.4";

  auto changed = Put(*client, "/v2/backends/CpuRef/options", R"({"deterministic": false})");
  ASSERT_EQ(changed.status, 200) << changed.text;
  EXPECT_EQ(changed.body["options"]["deterministic"]["value"], false);

  auto unknown =
      Put(*client, "/v2/backends/CpuRef/options", R"({"deterministic": true, "threads": 4})");
  EXPECT_EQ(unknown.status, 400);
  EXPECT_THAT(
      unknown.body["error"].get<std::string>(),
      HasSubstr("backend CpuRef has no option 'threads' (known: deterministic, check_finite); "
                "nothing applied"));
  auto wrong_type = Put(*client, "/v2/backends/CpuRef/options", R"({"deterministic": 1})");
  EXPECT_EQ(wrong_type.status, 400);
  EXPECT_THAT(wrong_type.body["error"].get<std::string>(),
              HasSubstr("option 'deterministic' is bool, got 1"));
  EXPECT_EQ(Get(*client, "/v2/backends/CpuRef/options").body["options"]["deterministic"]["value"],
            false);
  EXPECT_EQ(Put(*client, "/v2/backends/CpuRef/options", "[]").status, 400);
  EXPECT_EQ(Put(*client, "/v2/backends/GpuAcc/options", "{}").status, 404);
  EXPECT_EQ(Get(*client, "/v2/backends/GpuAcc/options").status, 404);
}

// Issue 18: a model that fell back to CpuRef when CpuAcc's file was removed went back to CpuAcc
// on `load` only after an unload, out of service in between. Now `load` re-places it, with the
// new network loaded beside the serving one, while a client keeps inferring.
TEST(ServeAdminTest, LoadMovesAModelBackOntoItsRestoredBackend) {
  BACKPLANE_REQUIRE_PATH(fs::path(BACKPLANE_CPU_ACC));
  ServeHome home;
  const fs::path cpu_acc = home.backends() / "Backplane_CpuAcc_backend.so";
  CopyFile(BACKPLANE_CPU_ACC, cpu_acc);
  auto server = StartUnwatched(home);
  auto client = server->Client();
  auto first_layer_backend = [&] {
    return Get(*client, "/v2/models/mlp/placement").body["versions"][0]["layers"][0]["backend"];
  };
  ASSERT_EQ(first_layer_backend(), "CpuAcc") << server->Log();

  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::thread> clients;
  JoinAll join_all{stop, clients};
  clients.emplace_back([&] {
    auto own = server->Client();
    while (!stop.load()) {
      const auto reply = Post(*own, "/v2/models/mlp/infer", kMlpRequest);
      ++(reply.status == 200 ? ok : failed);
    }
  });

  // Withdrawn: the model moves to its next preference.
  fs::remove(cpu_acc);
  auto withdrawn = Post(*client, "/v2/backends/CpuAcc/reload", "");
  ASSERT_EQ(withdrawn.status, 200) << withdrawn.text;
  EXPECT_EQ(withdrawn.body["action"], "withdrawn");
  EXPECT_TRUE(Eventually([&] { return first_layer_backend() == "CpuRef"; }, 10s));

  // Restored: a new generation of CpuAcc; `load` puts the model back on it.
  CopyFile(BACKPLANE_CPU_ACC, cpu_acc);
  auto restored = Post(*client, "/v2/backends/CpuAcc/reload", "");
  ASSERT_EQ(restored.status, 200) << restored.text;
  EXPECT_EQ(restored.body["action"], "activated");
  const int ok_before_load = ok.load();
  auto loaded = Post(*client, "/v2/repository/models/mlp/load", "");
  ASSERT_EQ(loaded.status, 200) << loaded.text;
  EXPECT_EQ(first_layer_backend(), "CpuAcc");
  EXPECT_TRUE(Eventually([&] { return ok.load() > ok_before_load + 3; }, 10s));

  // A second `load` with nothing changed keeps the network as it is (its layers and their
  // generations; the request counters beside them move with the clients).
  const auto placement = Get(*client, "/v2/models/mlp/placement").body["versions"];
  ASSERT_EQ(Post(*client, "/v2/repository/models/mlp/load", "").status, 200);
  EXPECT_EQ(Get(*client, "/v2/models/mlp/placement").body["versions"], placement);

  stop.store(true);
  for (auto& thread : clients)
    thread.join();
  EXPECT_EQ(failed.load(), 0) << "the model was out of service at some point";
  EXPECT_GT(ok.load(), 0);
}

TEST(ServeAdminTest, ReloadRollbackPinUnpin) {
  BACKPLANE_REQUIRE_PATH(MnistDataDir());
  ServeHome home;
  auto server = StartUnwatched(home);
  auto client = server->Client();
  const uint64_t first = ActiveGeneration(*client);
  ASSERT_GE(first, 1u);

  auto unchanged = Post(*client, "/v2/backends/CpuRef/reload", "");
  ASSERT_EQ(unchanged.status, 200) << unchanged.text;
  EXPECT_EQ(unchanged.body["action"], "unchanged");

  // A new file: reload activates a new generation, and the loaded models migrate to it.
  home.PublishBackendCopy();
  auto reloaded = Post(*client, "/v2/backends/CpuRef/reload", "");
  ASSERT_EQ(reloaded.status, 200) << reloaded.text;
  EXPECT_EQ(reloaded.body["action"], "activated");
  const uint64_t second = reloaded.body["generation"].get<uint64_t>();
  EXPECT_GT(second, first);
  EXPECT_EQ(ActiveGeneration(*client), second);
  EXPECT_TRUE(Eventually(
      [&] {
        return Get(*client, "/v2/models/mnist/placement")
                   .body["versions"][0]["layers"][0]["generation"] == second;
      },
      10s));
  const auto inferred = Post(*client, "/v2/models/mnist/infer", MnistRequestBody(1));
  ASSERT_EQ(inferred.status, 200) << inferred.text;
  EXPECT_EQ(ArgMax(inferred.body), MnistLabel(1));

  // Rollback brings the previous version back (loaded again from the copy the registry kept,
  // so as a generation of its own).
  auto rolled_back = Post(*client, "/v2/backends/CpuRef/rollback", "");
  ASSERT_EQ(rolled_back.status, 200) << rolled_back.text;
  const uint64_t restored = rolled_back.body["active_generation"].get<uint64_t>();
  EXPECT_NE(restored, second);
  EXPECT_EQ(ActiveGeneration(*client), restored);

  // Pinned: a new file is noticed but not loaded until unpin.
  auto pinned = Post(*client, "/v2/backends/CpuRef/pin", "");
  ASSERT_EQ(pinned.status, 200) << pinned.text;
  EXPECT_EQ(pinned.body["pinned"], true);
  home.PublishBackendCopy();
  auto while_pinned = Post(*client, "/v2/backends/CpuRef/reload", "");
  ASSERT_EQ(while_pinned.status, 200) << while_pinned.text;
  EXPECT_EQ(while_pinned.body["action"], "pinned");
  EXPECT_EQ(ActiveGeneration(*client), restored);
  auto unpinned = Post(*client, "/v2/backends/CpuRef/unpin", "");
  ASSERT_EQ(unpinned.status, 200) << unpinned.text;
  EXPECT_EQ(unpinned.body["action"], "activated");
  EXPECT_GT(ActiveGeneration(*client), restored);

  EXPECT_EQ(Post(*client, "/v2/backends/GpuAcc/reload", "").status, 404);
  EXPECT_EQ(Post(*client, "/v2/backends/GpuAcc/pin", "").status, 404);
}

TEST(ServeAdminTest, ARejectedDeployIs422AndTheOldVersionServesOn) {
  ServeHome home;
  auto server = StartUnwatched(home);
  auto client = server->Client();
  const uint64_t serving = ActiveGeneration(*client);

  // Not a shared object at all, published the safe way.
  home.Write("backends/.broken.tmp", "this is not an ELF file");
  std::filesystem::permissions(home.backends() / ".broken.tmp", std::filesystem::perms(0755));
  std::filesystem::rename(home.backends() / ".broken.tmp", home.backend_file());
  auto rejected = Post(*client, "/v2/backends/CpuRef/reload", "");
  EXPECT_EQ(rejected.status, 422) << rejected.text;
  EXPECT_EQ(rejected.body["action"], "rejected");
  EXPECT_THAT(rejected.body["error"].get<std::string>(), HasSubstr("NOT_ELF"));

  const auto described = Get(*client, "/v2/backends/CpuRef");
  EXPECT_EQ(described.body["active_generation"], serving);
  ASSERT_FALSE(described.body["rejected"].empty()) << described.text;
  EXPECT_EQ(described.body["rejected"][0]["reason"], "NOT_ELF");
  EXPECT_EQ(Post(*client, "/v2/models/mlp/infer", kMlpRequest).status, 200);
  const auto metrics = client->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(
      metrics->body,
      HasSubstr("backplane_backend_rejected_loads_total{backend=\"CpuRef\",reason=\"NOT_ELF\"} "
                "1\n"));

  // A good file again: the next reload takes it.
  home.PublishBackendCopy();
  auto recovered = Post(*client, "/v2/backends/CpuRef/reload", "");
  EXPECT_EQ(recovered.status, 200) << recovered.text;
  EXPECT_EQ(recovered.body["action"], "activated");
}

TEST(ServeAdminTest, MutatingCallsNeedTheTokenWhenOneIsSet) {
  ServeHome home;
  auto server = StartUnwatched(home, {}, {{"BACKPLANE_ADMIN_TOKEN", "s3cret-token"}});
  auto client = server->Client();

  auto missing = client->Post("/v2/backends/CpuRef/reload", "", "application/json");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 401);
  EXPECT_EQ(missing->get_header_value("WWW-Authenticate"), "Bearer realm=\"backplane admin\"");
  EXPECT_THAT(missing->body, HasSubstr("needs the admin token"));
  EXPECT_EQ(
      Post(*client, "/v2/backends/CpuRef/reload", "", {{"Authorization", "Bearer wrong-token!"}})
          .status,
      403);
  EXPECT_EQ(Post(*client, "/v2/repository/models/mlp/unload", "").status, 401);
  EXPECT_EQ(Put(*client, "/v2/backends/CpuRef/options", R"({"deterministic": false})").status, 401);

  const httplib::Headers token = {{"Authorization", "Bearer s3cret-token"}};
  EXPECT_EQ(Post(*client, "/v2/backends/CpuRef/reload", "", token).status, 200);
  EXPECT_EQ(Post(*client, "/v2/repository/models/mlp/unload", "", token).status, 200);
  EXPECT_EQ(Post(*client, "/v2/repository/models/mlp/load", "", token).status, 200);
  // The scheme is case-insensitive (RFC 9110 §11.1); the token is not.
  EXPECT_EQ(
      Post(*client, "/v2/backends/CpuRef/reload", "", {{"Authorization", "bearer s3cret-token"}})
          .status,
      200);
  EXPECT_EQ(
      Post(*client, "/v2/backends/CpuRef/reload", "", {{"Authorization", "BEARER s3cret-token"}})
          .status,
      200);
  EXPECT_EQ(
      Post(*client, "/v2/backends/CpuRef/reload", "", {{"Authorization", "bearer S3CRET-TOKEN"}})
          .status,
      403);
  // Reading and inferring need no token.
  EXPECT_EQ(Get(*client, "/v2/backends").status, 200);
  EXPECT_EQ(Post(*client, "/v2/repository/index", "").status, 200);
  EXPECT_EQ(Post(*client, "/v2/models/mlp/infer", kMlpRequest).status, 200);
}

TEST(ServeAdminTest, TheTokenFlagWorksToo) {
  ServeHome home;
  auto server = StartUnwatched(home, {"--admin-token", "flag-token"});
  auto client = server->Client();
  EXPECT_EQ(Post(*client, "/v2/backends/CpuRef/pin", "").status, 401);
  EXPECT_EQ(
      Post(*client, "/v2/backends/CpuRef/pin", "", {{"Authorization", "Bearer flag-token"}}).status,
      200);
}

class ServeMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartUnwatched(home_);
    client_ = server_->Client();
    ASSERT_EQ(Post(*client_, "/v2/models/mlp/infer", kMlpRequest).status, 200);
    ASSERT_EQ(Post(*client_, "/v2/models/mlp/infer", kMlpRequest).status, 200);
    ASSERT_EQ(Post(*client_, "/v2/models/mlp/infer", "{").status, 400);
    ASSERT_EQ(Post(*client_, "/v2/models/unknown/infer", "{}").status, 404);
    home_.PublishBackendCopy();
    ASSERT_EQ(Post(*client_, "/v2/backends/CpuRef/reload", "").body["action"], "activated");
  }
  ServeHome home_;
  std::unique_ptr<ServeProcess> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(ServeMetricsTest, CountRequestsFailuresLatencyAndSwaps) {
  const auto reply = client_->Get("/metrics");
  ASSERT_TRUE(reply);
  ASSERT_EQ(reply->status, 200);
  EXPECT_EQ(reply->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  const std::string& text = reply->body;
  EXPECT_THAT(text, HasSubstr("# TYPE backplane_inference_requests_total counter\n"));
  EXPECT_THAT(text, HasSubstr("backplane_inference_requests_total{model=\"mlp\"} 3\n"));
  EXPECT_THAT(
      text,
      HasSubstr("backplane_inference_failures_total{model=\"mlp\",code=\"INVALID_ARGUMENT\"} 1\n"));
  // A name that is not a model of the repository never becomes a label.
  EXPECT_THAT(text, ::testing::Not(HasSubstr("model=\"unknown\"")));
  EXPECT_THAT(text, HasSubstr("# TYPE backplane_inference_request_duration_seconds histogram\n"));
  EXPECT_THAT(text, HasSubstr("backplane_inference_request_duration_seconds_bucket{model=\"mlp\","
                              "le=\"+Inf\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("backplane_inference_request_duration_seconds_count{model=\"mlp\"} "
                              "2\n"));
  EXPECT_THAT(text, HasSubstr("backplane_http_responses_total{code=\"404\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("backplane_backend_generations{backend=\"CpuRef\",state=\"active\"} "
                              "1\n"));
  EXPECT_THAT(text, HasSubstr("backplane_backend_swaps_total{backend=\"CpuRef\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE backplane_backend_drain_seconds histogram\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE backplane_backend_rejected_loads_total counter\n"));
  EXPECT_THAT(text,
              HasSubstr("backplane_backend_leaked_generations_total{backend=\"CpuRef\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("backplane_loader_generations_live "));
}

TEST_F(ServeMetricsTest, PassPromtoolCheckMetrics) {
  BACKPLANE_REQUIRE_COMMAND("promtool", "prometheus");
  const auto checked =
      // curl's failure fails the command (a pipe's status is promtool's, which passes an empty
      // input); $(...) drops the exposition's final newline, which printf puts back.
      RunCommand("metrics=$(curl -sf " + server_->url() +
                 "/metrics) && printf '%s\\n' \"$metrics\" | promtool check metrics 2>&1");
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
}

}  // namespace
}  // namespace backplane::testing
