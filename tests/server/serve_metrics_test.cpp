// What alert rules need from /metrics (deploy/prometheus/alerts.yaml): readiness per model
// version, rejections per backend with rollbacks counted apart, every such series from 0, the
// trust list's health, build info and the standard process_* metrics; and the /proc parsing
// behind the last on its own.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <regex>
#include <sstream>

#include "metrics/backend_metrics.hpp"
#include "metrics/process_metrics.hpp"
#include "serve_test_util.hpp"
#include "test_util.hpp"

namespace backplane::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kMlpRequest[] =
    R"({"inputs":[{"name":"features","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]})";

// The CPU time /proc/<pid>/stat holds (utime + stime), in seconds.
double ProcCpuSeconds(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  // Fields after the command name, which may hold spaces: state is field 3, utime 14, stime 15.
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int index = 3; index <= 15 && fields >> field; ++index) {
    if (index >= 14)
      ticks += std::stod(field);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::string Metrics(httplib::Client& client) {
  const auto reply = client.Get("/metrics");
  return reply && reply->status == 200 ? reply->body : std::string();
}

// The value of the sample line that starts with `series` ("name{labels}"); nullopt when absent.
std::optional<double> Value(const std::string& text, const std::string& series) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ')
      return std::stod(line.substr(series.size() + 1));
  }
  return std::nullopt;
}

std::unique_ptr<ServeProcess> Start(const ServeHome& home, std::string_view config) {
  home.Write("config.json", config);
  return ServeProcess::Start({"--config", (home.path() / "config.json").string(), "--models",
                              home.models().string(), "--backends", home.backends().string()});
}

TEST(ServeMetricsExtraTest, ExposeReadinessBuildInfoAndProcessMetrics) {
  ServeHome home;
  auto server = Start(home, R"({"watch_backends": false})");
  auto client = server->Client();
  ASSERT_EQ(Post(*client, "/v2/models/mlp/infer", kMlpRequest).status, 200);
  const std::string text = Metrics(*client);

  EXPECT_THAT(text, HasSubstr("# TYPE backplane_model_ready gauge\n"));
  EXPECT_EQ(Value(text, "backplane_model_ready{model=\"mlp\",version=\"1\"}"), 1) << text;
  EXPECT_THAT(text, HasSubstr("backplane_build_info{version=\"0.1.0\",backend_api=\"" +
                              std::to_string(kBackendApiMajor) + "." +
                              std::to_string(kBackendApiMinor) + "\",compiler=\""));

  const auto open_fds = Value(text, "process_open_fds");
  const auto max_fds = Value(text, "process_max_fds");
  ASSERT_TRUE(open_fds && max_fds) << text;
  EXPECT_GT(*open_fds, 3);  // the listening sockets at least
  EXPECT_GE(*max_fds, *open_fds);
  const auto rss = Value(text, "process_resident_memory_bytes");
  ASSERT_TRUE(rss);
  const auto measured = ProcStatusBytes(server->pid(), "VmRSS");
  ASSERT_TRUE(measured);
  EXPECT_GT(*rss, 0.5 * static_cast<double>(*measured));
  EXPECT_LT(*rss, 2.0 * static_cast<double>(*measured));
  const auto started = Value(text, "process_start_time_seconds");
  ASSERT_TRUE(started);
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(*started, now + 1);
  EXPECT_GT(*started, now - 120);  // started by this test
  // A server that started a moment ago may have used less than one clock tick: the value is
  // checked against the kernel's count read around a scrape, not against 0.
  const double cpu_before = ProcCpuSeconds(server->pid());
  const auto cpu = Value(Metrics(*client), "process_cpu_seconds_total");
  const double cpu_after = ProcCpuSeconds(server->pid());
  ASSERT_TRUE(cpu);
  EXPECT_GE(*cpu, cpu_before);
  EXPECT_LE(*cpu, cpu_after);

  // Unloaded, the model stays in the gauge at 0 (its directory is still in the repository).
  ASSERT_EQ(Post(*client, "/v2/repository/models/mlp/unload", "").status, 200);
  const std::string unloaded = Metrics(*client);
  EXPECT_EQ(Value(unloaded, "backplane_model_ready{model=\"mlp\",version=\"\"}"), 0) << unloaded;
  EXPECT_FALSE(Value(unloaded, "backplane_model_ready{model=\"mlp\",version=\"1\"}"));
}

TEST(ServeMetricsExtraTest, RejectionsCarryTheBackendAndStartAtZero) {
  ServeHome home;
  auto server = Start(home, R"({"watch_backends": false})");
  auto client = server->Client();
  const std::string before = Metrics(*client);
  // Every reason of every backend from the start: increase() sees the first rejection.
  EXPECT_EQ(Value(before,
                  "backplane_backend_rejected_loads_total{backend=\"CpuRef\",reason=\"NOT_ELF\"}"),
            0)
      << before;
  EXPECT_EQ(
      Value(before, "backplane_backend_rejected_loads_total{backend=\"\",reason=\"NOT_ELF\"}"), 0);
  EXPECT_EQ(Value(before, "backplane_backend_rollbacks_total{backend=\"CpuRef\",by=\"policy\"}"),
            0);
  // A rollback is not a broken file: no ROLLED_BACK reason among the rejections.
  EXPECT_THAT(before, Not(HasSubstr("reason=\"ROLLED_BACK\"")));

  home.Write("backends/.broken.tmp", "this is not an ELF file");
  std::filesystem::permissions(home.backends() / ".broken.tmp", std::filesystem::perms(0755));
  std::filesystem::rename(home.backends() / ".broken.tmp", home.backend_file());
  ASSERT_EQ(Post(*client, "/v2/backends/CpuRef/reload", "").status, 422);
  const std::string after = Metrics(*client);
  EXPECT_EQ(
      Value(after, "backplane_backend_rejected_loads_total{backend=\"CpuRef\",reason=\"NOT_ELF\"}"),
      1)
      << after;
}

TEST(ServeMetricsExtraTest, TrustListHealthSaysWhenTheListTrustsNothing) {
  ServeHome home;
  const CommandResult line = RunCommand(std::string(BACKPLANE_EXECUTABLE) + " check --digest " +
                                        home.backend_file().string() + " 2>/dev/null");
  ASSERT_EQ(line.exit_code, 0);
  home.Write("trusted.sha256", line.output);
  auto server = Start(home, R"({"trusted_backends_file": "trusted.sha256", "watch_debounce_ms": 20,
                                "rescan_interval_ms": 100})");
  auto client = server->Client();
  const std::string text = Metrics(*client);
  EXPECT_EQ(Value(text, "backplane_trust_digests"), 1) << text;
  EXPECT_EQ(Value(text, "backplane_trust_list_unreadable"), 0);
  EXPECT_EQ(Value(text, "backplane_trust_signing_keys"), 0);

  // A list that cannot be parsed trusts nothing: the rescan reads it, the gauge says so.
  home.Write("trusted.sha256", "not a digest\n");
  ASSERT_TRUE(Eventually(
      [&] { return Value(Metrics(*client), "backplane_trust_list_unreadable") == 1; }, 10s))
      << Metrics(*client) << server->Log();
  EXPECT_EQ(Value(Metrics(*client), "backplane_trust_digests"), 0);
  home.Write("trusted.sha256", line.output);
  ASSERT_TRUE(Eventually(
      [&] { return Value(Metrics(*client), "backplane_trust_list_unreadable") == 0; }, 10s))
      << server->Log();

  // Without a trust policy the family is absent, not 0 (nothing to be unhealthy).
  ServeHome open;
  auto unchecked = Start(open, R"({"watch_backends": false})");
  auto unchecked_client = unchecked->Client();
  EXPECT_THAT(Metrics(*unchecked_client), Not(HasSubstr("backplane_trust_")));
}

TEST(ProcessMetricsTest, ParseProcStatReadsTimesMemoryAndStart) {
  // A command name with a space and a parenthesis: fields count from the last ')'.
  const std::string stat =
      "4242 (bp (serve) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 150 0 0 20 0 9 0 12345 "
      "104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
  const std::string system = "cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 7\n";
  const server::ProcessSample sample = server::ParseProcStat(stat, system, 100, 4096);
  ASSERT_TRUE(sample.cpu_seconds);
  EXPECT_DOUBLE_EQ(*sample.cpu_seconds, 4.0);  // (250 + 150) ticks at 100 Hz
  EXPECT_EQ(sample.virtual_memory_bytes, 104857600);
  EXPECT_EQ(sample.resident_memory_bytes, 2560 * 4096);
  ASSERT_TRUE(sample.start_time_seconds);
  EXPECT_DOUBLE_EQ(*sample.start_time_seconds, 1700000000 + 123.45);

  const server::ProcessSample broken = server::ParseProcStat("garbage", "", 100, 4096);
  EXPECT_FALSE(broken.cpu_seconds);
  EXPECT_FALSE(broken.start_time_seconds);
  server::PrometheusWriter out;
  server::RenderProcessMetrics(out, broken);
  EXPECT_EQ(out.Take(), "");  // nothing rather than a 0 that reads as a fact
}

TEST(ProcessMetricsTest, RollbackDecidedByReadsTheControllersPrefix) {
  EXPECT_EQ(server::RollbackDecidedBy("policy: canary at 10 %: errors"), "policy");
  EXPECT_EQ(server::RollbackDecidedBy("operator: aborted through the admin API"), "operator");
  EXPECT_EQ(server::RollbackDecidedBy("superseded: the directory designates x now"), "deploy");
  EXPECT_EQ(server::RollbackDecidedBy("policy"), "deploy");
  EXPECT_EQ(server::RollbackDecidedBy("policyholder: x"), "deploy");
}

}  // namespace
}  // namespace backplane::testing
