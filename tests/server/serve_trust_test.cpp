// Only trusted backend content loads in `backplane serve`: the list `backplane check --digest`
// writes, a deploy of a build not on it refused (counted and logged once) while the serving
// version serves on, the same build loaded once its digest is added, and bad trust settings
// refused at start naming the key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "backplane/loader/trust.hpp"
#include "serve_test_util.hpp"

namespace backplane::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kMlpRequest[] =
    R"({"inputs":[{"name":"features","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]})";
constexpr char kUntrustedMetric[] = "backplane_backend_rejected_loads_total{";

CommandResult CheckDigest(const std::string& arguments) {
  return RunCommand(std::string(BACKPLANE_EXECUTABLE) + " check --digest " + arguments +
                    " 2>/dev/null");
}

uint64_t ActiveGeneration(httplib::Client& client) {
  const auto reply = Get(client, "/v2/backends/CpuRef");
  return reply.status == 200 ? reply.body["active_generation"].get<uint64_t>() : 0;
}

// The rejected-loads count for UNTRUSTED in /metrics, summed over backends (a file refused
// before it named one counts under backend ""); -1 when absent.
int UntrustedCount(httplib::Client& client) {
  const auto reply = client.Get("/metrics");
  if (!reply)
    return -1;
  int count = -1;
  std::istringstream lines(reply->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(kUntrustedMetric, 0) != 0 || line.find("reason=\"UNTRUSTED\"}") == line.npos)
      continue;
    count = std::max(count, 0) + std::stoi(line.substr(line.rfind(' ') + 1));
  }
  return count;
}

std::size_t Occurrences(const std::string& text, std::string_view needle) {
  std::size_t count = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++count;
  return count;
}

// Another build of CpuRef: the same code with bytes appended (still a complete ELF file, which
// the loader accepts), so another digest. Published the safe way.
void PublishUntrustedBuild(const ServeHome& home) {
  const fs::path temporary = home.backends() / ".untrusted.tmp";
  CopyFile(CpuRefBackend(), temporary);
  std::ofstream(temporary, std::ios::app | std::ios::binary) << "another build";
  fs::rename(temporary, home.backend_file());
}

TEST(CheckDigestTest, PrintsTheLineSha256sumPrintsAndTheListReadsBack) {
  ServeHome home;
  const CommandResult printed = CheckDigest(home.backend_file().string());
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  if (HasCommand("sha256sum")) {
    EXPECT_EQ(printed.output, RunCommand("sha256sum " + home.backend_file().string()).output);
  }
  auto digests = loader::ParseDigestList(printed.output, "check --digest");
  ASSERT_TRUE(digests.ok()) << digests.error().ToString();
  ASSERT_EQ(digests->size(), 1u);
  EXPECT_THAT(printed.output, HasSubstr("  " + home.backend_file().string() + "\n"));

  // A directory: one line per backend file in it, nothing else on stdout.
  const CommandResult directory = CheckDigest(home.backends().string());
  EXPECT_EQ(directory.exit_code, 0);
  EXPECT_EQ(directory.output, printed.output);

  const CommandResult missing = CheckDigest((home.path() / "Acme_Gone_backend.so").string());
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.output, "");
  // --digest prints lines, never the JSON report.
  EXPECT_EQ(CheckDigest("--json " + home.backend_file().string()).exit_code, 2);
}

// Two builds of CpuRef as versioned files, the main name a link to the newer (docs/hot-reload.md,
// "Roll back, pin"): the older build's file and the newer's.
std::pair<fs::path, fs::path> PublishTwoVersions(const ServeHome& home) {
  const fs::path older = home.backends() / "Backplane_CpuRef_backend.so.1";
  const fs::path newer = home.backends() / "Backplane_CpuRef_backend.so.2";
  fs::rename(home.backend_file(), older);
  CopyFile(CpuRefBackend(), newer);
  std::ofstream(newer, std::ios::app | std::ios::binary) << "the second build";
  fs::create_symlink(newer.filename(), home.backend_file());
  return {older, newer};
}

// Re-points the main name at `target` as `ln -sfn` does: a link beside, renamed over.
void RepointLink(const ServeHome& home, const fs::path& target) {
  const fs::path beside = home.backends() / ".relink.tmp";
  fs::create_symlink(target.filename(), beside);
  fs::rename(beside, home.backend_file());
}

// A trust list made from a directory holds every version in it, not only the one its main name
// designates: re-pointing the link back to an older version is a rollback, not an untrusted load.
TEST(CheckDigestTest, ADirectoryGivesALinePerVersionSoALinkRollbackStaysTrusted) {
  ServeHome home;
  const auto [older, newer] = PublishTwoVersions(home);
  const CommandResult printed = CheckDigest(home.backends().string());
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  std::set<std::string> lines;
  std::istringstream stream(printed.output);
  for (std::string line; std::getline(stream, line);)
    lines.insert(line + "\n");
  std::set<std::string> expected;
  for (const fs::path& file : {home.backend_file(), older, newer})
    expected.insert(CheckDigest(file.string()).output);
  EXPECT_EQ(lines, expected) << printed.output;
  if (HasCommand("sha256sum")) {
    EXPECT_TRUE(lines.contains(RunCommand("sha256sum " + older.string()).output));
  }

  home.Write("trusted.sha256", printed.output);
  home.Write("config.json",
             R"({"trusted_backends_file": "trusted.sha256", "watch_debounce_ms": 20})");
  auto server =
      ServeProcess::Start({"--config", (home.path() / "config.json").string(), "--models",
                           home.models().string(), "--backends", home.backends().string()});
  auto client = server->Client();
  const uint64_t serving = ActiveGeneration(*client);
  ASSERT_NE(serving, 0u) << server->Log();
  RepointLink(home, older);
  ASSERT_TRUE(Eventually([&] { return ActiveGeneration(*client) > serving; }, 10s))
      << server->Log();
  EXPECT_LE(UntrustedCount(*client), 0) << server->Log();
  EXPECT_EQ(Post(*client, "/v2/models/mlp/infer", kMlpRequest).status, 200);
}

TEST(CheckTrustTest, CheckWithAServerConfigJudgesTrustAsThatServerWould) {
  ServeHome home;
  const CommandResult trusted_line = CheckDigest(home.backend_file().string());
  ASSERT_EQ(trusted_line.exit_code, 0);
  home.Write("trusted.sha256", trusted_line.output);
  home.Write("config.json",
             R"({"trusted_backends_file": "trusted.sha256", "backends": ["backends"]})");
  const std::string check = std::string(BACKPLANE_EXECUTABLE) + " check --json --config " +
                            (home.path() / "config.json").string();

  // The listed build, named and found through the config's backend directories alike.
  for (const std::string& files : {home.backend_file().string(), std::string()}) {
    const CommandResult passed = RunCommand(check + " " + files + " 2>/dev/null");
    EXPECT_EQ(passed.exit_code, 0) << passed.output;
    const json report = json::parse(passed.output, nullptr, false);
    ASSERT_TRUE(report.is_array() && report.size() == 1u) << passed.output;
    EXPECT_EQ(report[0]["ok"], true);
    bool trust_stage = false;
    for (const auto& stage : report[0]["stages"])
      trust_stage = trust_stage || (stage["stage"] == "trust" && stage["ok"] == true);
    EXPECT_TRUE(trust_stage) << report.dump(2);
  }

  // Another build: UNTRUSTED, refused before it is inspected or mapped, with the server's words.
  PublishUntrustedBuild(home);
  const CommandResult refused =
      RunCommand(check + " " + home.backend_file().string() + " 2>/dev/null");
  EXPECT_EQ(refused.exit_code, 1);
  const json report = json::parse(refused.output, nullptr, false);
  ASSERT_TRUE(report.is_array() && report.size() == 1u) << refused.output;
  EXPECT_EQ(report[0]["reason"], "UNTRUSTED");
  EXPECT_EQ(report[0]["stage"], "trust");
  EXPECT_THAT(report[0]["message"].get<std::string>(),
              HasSubstr("is not on the trusted backend list (1 digest(s) from " +
                        (home.path() / "trusted.sha256").string()));
  // Without the config: no policy, the same file would load.
  EXPECT_EQ(RunCommand(std::string(BACKPLANE_EXECUTABLE) + " check " +
                       home.backend_file().string() + " >/dev/null 2>&1")
                .exit_code,
            0);

  // A config whose trust settings are broken: exit 1 naming the key, nothing checked.
  home.Write("broken.json", R"({"trusted_backends": ["not a digest"]})");
  const CommandResult broken = RunCommand(std::string(BACKPLANE_EXECUTABLE) + " check --config " +
                                          (home.path() / "broken.json").string() + " " +
                                          home.backend_file().string() + " 2>&1");
  EXPECT_EQ(broken.exit_code, 1);
  EXPECT_THAT(broken.output, HasSubstr("trusted_backends"));
}

TEST(ServeTrustTest, UntrustedDeployIsRefusedOnceAndTheListFileLetsItIn) {
  ServeHome home;
  const fs::path list = home.path() / "trusted.sha256";
  const CommandResult serving_line = CheckDigest(home.backend_file().string());
  ASSERT_EQ(serving_line.exit_code, 0);
  WriteFile(list, "# builds CI signed off\n" + serving_line.output);
  // Rescans every 100 ms, so that "once" is tested against many of them.
  home.Write("config.json",
             R"({"trusted_backends_file": "trusted.sha256", "watch_debounce_ms": 20,
                 "rescan_interval_ms": 100})");
  auto server =
      ServeProcess::Start({"--config", (home.path() / "config.json").string(), "--models",
                           home.models().string(), "--backends", home.backends().string()});
  EXPECT_THAT(server->Log(),
              HasSubstr("only trusted backend content loads: 1 digest(s) from " + list.string()));
  auto client = server->Client();
  const uint64_t serving = ActiveGeneration(*client);
  ASSERT_NE(serving, 0u) << server->Log();

  PublishUntrustedBuild(home);
  ASSERT_TRUE(Eventually([&] { return UntrustedCount(*client) == 1; }, 10s)) << server->Log();
  const std::string new_line = CheckDigest(home.backend_file().string()).output;
  const std::string new_digest = new_line.substr(0, 64);
  const auto described = Get(*client, "/v2/backends/CpuRef");
  EXPECT_EQ(described.body["active_generation"], serving);
  ASSERT_FALSE(described.body["rejected"].empty()) << described.text;
  EXPECT_EQ(described.body["rejected"][0]["reason"], "UNTRUSTED");
  EXPECT_EQ(described.body["rejected"][0]["message"],
            home.backend_file().string() + ": its content (sha256 " + new_digest +
                ") is not on the trusted backend list (1 digest(s) from " + list.string() +
                "); if this build is trusted, add the line `backplane check --digest FILE` "
                "prints for it to the trusted list");
  EXPECT_EQ(Post(*client, "/v2/models/mlp/infer", kMlpRequest).status, 200);

  // Several rescans later: still one rejection, logged once, counted once. (Absence can only be
  // tested by waiting: 6 rescans' worth.)
  std::this_thread::sleep_for(600ms);
  EXPECT_EQ(UntrustedCount(*client), 1);
  EXPECT_EQ(Occurrences(server->Log(), "rejected: UNTRUSTED"), 1u) << server->Log();
  EXPECT_EQ(ActiveGeneration(*client), serving);

  // Trusted now: the list file is re-read at the next rescan and the waiting build loads.
  std::ofstream(list, std::ios::app) << new_line;
  ASSERT_TRUE(Eventually([&] { return ActiveGeneration(*client) > serving; }, 10s))
      << server->Log();
  EXPECT_THAT(server->Log(), HasSubstr("sha256 " + new_digest));
  EXPECT_EQ(Post(*client, "/v2/models/mlp/infer", kMlpRequest).status, 200);
  EXPECT_EQ(UntrustedCount(*client), 1);
}

// An Ed25519 key pair in home/keys (ci.pem, ci.pub), made with openssl as docs/operators.md
// says, and a function that signs the backend file with it (the shell's exit code); empty when
// the key cannot be made.
std::function<int()> MakeSigningKey(const ServeHome& home) {
  const fs::path keys = home.path() / "keys";
  fs::create_directory(keys);
  const std::string key = (keys / "ci.pem").string();
  if (RunCommand("openssl genpkey -algorithm ed25519 -out " + key).exit_code != 0 ||
      RunCommand("openssl pkey -in " + key + " -pubout -out " + (keys / "ci.pub").string())
              .exit_code != 0) {
    return {};
  }
  // Written beside and renamed over, as a signature should be published: a server rescanning
  // meanwhile never reads half of one.
  return [key, file = home.backend_file().string()] {
    return RunCommand("openssl pkeyutl -sign -rawin -inkey " + key + " -in " + file + " -out " +
                      file + ".sig.tmp && mv " + file + ".sig.tmp " + file + ".sig")
        .exit_code;
  };
}

// Signed builds, with the openssl command line as an operator uses it (docs/operators.md).
TEST(ServeTrustTest, SignedBuildsLoadAndOthersAreRefused) {
  BACKPLANE_REQUIRE_COMMAND("openssl", "openssl");
  ServeHome home;
  const fs::path keys = home.path() / "keys";
  const auto sign = MakeSigningKey(home);
  ASSERT_TRUE(sign);
  ASSERT_EQ(sign(), 0);
  home.Write("config.json",
             R"({"trusted_signing_keys": ["keys/ci.pub"], "watch_backends": false})");
  auto server =
      ServeProcess::Start({"--config", (home.path() / "config.json").string(), "--models",
                           home.models().string(), "--backends", home.backends().string()});
  auto client = server->Client();
  const uint64_t serving = ActiveGeneration(*client);
  ASSERT_NE(serving, 0u) << server->Log();

  // A new build beside the old build's signature: refused, the old one serves on.
  PublishUntrustedBuild(home);
  auto refused = Post(*client, "/v2/backends/CpuRef/reload", "");
  EXPECT_EQ(refused.status, 422) << refused.text;
  EXPECT_THAT(refused.body["error"].get<std::string>(),
              HasSubstr("UNTRUSTED: " + home.backend_file().string()));
  EXPECT_THAT(refused.body["error"].get<std::string>(),
              HasSubstr("that no trusted signing key verifies (1 signing key(s): " +
                        (keys / "ci.pub").string() + ")"));
  EXPECT_EQ(ActiveGeneration(*client), serving);
  EXPECT_EQ(Post(*client, "/v2/models/mlp/infer", kMlpRequest).status, 200);
  EXPECT_EQ(UntrustedCount(*client), 1);

  // Signed: the next reload takes it.
  ASSERT_EQ(sign(), 0);
  auto signed_reload = Post(*client, "/v2/backends/CpuRef/reload", "");
  EXPECT_EQ(signed_reload.status, 200) << signed_reload.text;
  EXPECT_EQ(signed_reload.body["action"], "activated");
  EXPECT_GT(ActiveGeneration(*client), serving);
}

TEST(ServeTrustTest, ASignaturePublishedAfterItsLibraryIsSeenAtTheNextRescan) {
  BACKPLANE_REQUIRE_COMMAND("openssl", "openssl");
  ServeHome home;
  const auto sign = MakeSigningKey(home);
  ASSERT_TRUE(sign);
  ASSERT_EQ(sign(), 0);
  home.Write("config.json", R"({"trusted_signing_keys": ["keys/ci.pub"], "watch_debounce_ms": 20,
                                "rescan_interval_ms": 100})");
  auto server =
      ServeProcess::Start({"--config", (home.path() / "config.json").string(), "--models",
                           home.models().string(), "--backends", home.backends().string()});
  auto client = server->Client();
  const uint64_t serving = ActiveGeneration(*client);
  ASSERT_NE(serving, 0u) << server->Log();

  // The library first, its signature later (the wrong order, and a common one): refused once...
  fs::remove(home.backend_file().string() + ".sig");
  PublishUntrustedBuild(home);
  ASSERT_TRUE(Eventually([&] { return UntrustedCount(*client) == 1; }, 10s)) << server->Log();
  EXPECT_EQ(ActiveGeneration(*client), serving);
  // ...then loaded once the signature lands, with no change to the library and no reload call.
  ASSERT_EQ(sign(), 0);
  ASSERT_TRUE(Eventually([&] { return ActiveGeneration(*client) > serving; }, 10s))
      << server->Log();
  EXPECT_EQ(Post(*client, "/v2/models/mlp/infer", kMlpRequest).status, 200);
  EXPECT_EQ(UntrustedCount(*client), 1);
}

TEST(ServeTrustTest, BadTrustSettingsStopTheStartNamingTheKey) {
  ServeHome home;
  const std::vector<std::string> args = {"--config",   (home.path() / "config.json").string(),
                                         "--models",   home.models().string(),
                                         "--backends", home.backends().string()};
  home.Write("config.json",
             R"({"trusted_backends": [], "trusted_backends_file": "trusted.sha256"})");
  CommandResult both = ServeProcess::RunToExit(args);
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_THAT(both.output,
              HasSubstr("'trusted_backends' and 'trusted_backends_file' are both set"));

  home.Write("config.json", R"({"trusted_backends": ["not-a-digest"]})");
  CommandResult malformed = ServeProcess::RunToExit(args);
  EXPECT_EQ(malformed.exit_code, 1);
  EXPECT_THAT(malformed.output, HasSubstr("'trusted_backends' entry 0: 'not-a-digest' is not a "
                                          "SHA-256 digest"));

  home.Write("config.json", R"({"trusted_backends_file": "trusted.sha256"})");
  home.Write("trusted.sha256", "e3b0c442  Backplane_CpuRef_backend.so\n");
  CommandResult bad_line = ServeProcess::RunToExit(args);
  EXPECT_EQ(bad_line.exit_code, 1);
  EXPECT_THAT(bad_line.output,
              HasSubstr("'trusted_backends_file': " + (home.path() / "trusted.sha256").string() +
                        " line 1: 'e3b0c442' is not a SHA-256 digest"));
  std::vector<std::string> check = args;
  check.push_back("--check-config");
  EXPECT_EQ(ServeProcess::RunToExit(check).exit_code, 1);

  // An empty list is a list: it trusts nothing, so nothing loads and the start fails.
  home.Write("config.json", R"({"trusted_backends": []})");
  CommandResult nothing = ServeProcess::RunToExit(args);
  EXPECT_EQ(nothing.exit_code, 1);
  EXPECT_THAT(nothing.output, HasSubstr("rejected: UNTRUSTED"));
}

}  // namespace
}  // namespace backplane::testing
