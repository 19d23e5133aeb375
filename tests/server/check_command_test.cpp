// `backplane check`, run as a user runs it: the real executable on real files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::ContainsRegex;
using testing::Fixture;
using ::testing::HasSubstr;
using testing::TempDir;

// The real executable, as a user runs it (stdout only: --json output is parsed).
testing::CommandResult RunBackplaneStdout(const std::string& arguments) {
  return testing::RunCommand(std::string(BACKPLANE_EXECUTABLE) + " " + arguments + " 2>/dev/null");
}

json CheckJson(const std::string& files, int expected_exit) {
  testing::CommandResult result = RunBackplaneStdout("check --json " + files);
  EXPECT_EQ(result.exit_code, expected_exit) << result.output;
  json parsed = json::parse(result.output, nullptr, false);
  EXPECT_TRUE(parsed.is_array()) << result.output;
  return parsed;
}

TEST(CheckCommandTest, FirstPartyBackendWouldLoad) {
  json report = CheckJson(testing::CpuRefBackend().string(), 0);
  ASSERT_EQ(report.size(), 1u);
  EXPECT_EQ(report[0]["ok"], true);
  EXPECT_EQ(report[0]["id"], "CpuRef");
  EXPECT_EQ(report[0]["api_version"], "1.4");  // rebuilt with the 1.4 SDK header
  EXPECT_EQ(report[0]["reason"], nullptr);
  for (const char* key : {"file", "ok", "id", "api_version", "stage", "reason", "message"}) {
    EXPECT_TRUE(report[0].contains(key)) << key;
  }
}

TEST(CheckCommandTest, EveryBrokenFileGetsItsReasonCode) {
  TempDir dir;
  testing::WriteFile(dir / "Test_Text_backend.so", "not an elf");
  fs::permissions(dir / "Test_Text_backend.so", fs::perms(0644));
  const std::string image = testing::ReadFile(Fixture("Valid"));
  testing::WriteFile(dir / "Test_Short_backend.so", image.substr(0, 3000));
  testing::WriteFile(dir / "Test_Open_backend.so", image);
  fs::permissions(dir / "Test_Open_backend.so", fs::perms(0666));
  testing::WriteFile(dir / "wrong_name.so", image);
  fs::create_directory(dir / "Test_Folder_backend.so");

  const std::vector<std::pair<std::string, std::string>> cases = {
      {(dir / "Test_Missing_backend.so").string(), "NOT_FOUND"},
      {(dir / "wrong_name.so").string(), "NAME_SCHEME"},
      {(dir / "Test_Folder_backend.so").string(), "NOT_REGULAR"},
      {(dir / "Test_Open_backend.so").string(), "UNSAFE_PERMISSIONS"},
      {(dir / "Test_Text_backend.so").string(), "NOT_ELF"},
      {(dir / "Test_Short_backend.so").string(), "ELF_TRUNCATED"},
      {Fixture("Unique").string(), "NOT_UNLOADABLE"},
      {Fixture("ThreadLocal").string(), "NOT_UNLOADABLE"},
      {Fixture("MissingSymbol").string(), "DLOPEN_FAILED"},
      {Fixture("NoFactory").string(), "MISSING_ENTRY_POINT"},
      {Fixture("EmptyId").string(), "INVALID_ID"},
      {Fixture("Api34").string(), "API_INCOMPATIBLE"},
      {Fixture("ThrowingFactory").string(), "FACTORY_FAILED"},
      {Fixture("CrashingFactory").string(), "FACTORY_FAILED"},
  };
  std::string files;
  for (const auto& [file, reason] : cases)
    files += " '" + file + "'";
  json report = CheckJson(files, 1);
  ASSERT_EQ(report.size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(report[i]["file"], cases[i].first);
    EXPECT_EQ(report[i]["ok"], false) << cases[i].first;
    EXPECT_EQ(report[i]["reason"], cases[i].second)
        << cases[i].first << ": " << report[i]["message"];
    EXPECT_FALSE(report[i]["message"].get<std::string>().empty());
  }
  EXPECT_THAT(report.back()["message"].get<std::string>(), HasSubstr("crashed"));
}

TEST(CheckCommandTest, TwoFilesWithOneIdAreADuplicate) {
  json report = CheckJson(Fixture("Valid").string() + " " + Fixture("Duplicate").string(), 1);
  ASSERT_EQ(report.size(), 2u);
  EXPECT_EQ(report[0]["ok"], true);
  EXPECT_EQ(report[1]["reason"], "DUPLICATE_ID");
  EXPECT_EQ(report[1]["stage"], "register");
}

TEST(CheckCommandTest, ADirectoryIsCheckedOncePerFile) {
  // The fixture directory holds Test_Valid_backend.so and its versioned names: one file.
  TempDir dir;
  const fs::path real = fs::canonical(Fixture("Valid"));
  fs::create_symlink(real, dir / real.filename().string());
  fs::create_symlink(real.filename(), dir / "Test_Valid_backend.so");
  fs::create_symlink(real.filename(), dir / "Test_Valid_backend.so.1");
  json report = CheckJson(dir.path().string(), 0);
  ASSERT_EQ(report.size(), 3u) << report.dump(2);
  EXPECT_EQ(report[0]["file"], (dir / "Test_Valid_backend.so").string());  // the speaking name
  EXPECT_EQ(report[0]["id"], "TestValid");
  // The other names are leftovers, said so rather than checked again.
  EXPECT_EQ(report[1]["skipped"], true);
  EXPECT_EQ(report[1]["reason"], "SUPERSEDED");
  EXPECT_EQ(report[2]["reason"], "SUPERSEDED");
}

TEST(CheckCommandTest, TextOutputHasAStageLineAndAVerdictPerFile) {
  testing::CommandResult result =
      RunBackplaneStdout("check " + Fixture("Valid").string() + " " + Fixture("Api25").string());
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.output, HasSubstr("  elf           ok"));
  EXPECT_THAT(result.output, HasSubstr("  instance      ok    with a backend context; options: "
                                       "verbose (bool), limit (int64), scale (double), label "
                                       "(string)"));
  EXPECT_THAT(result.output, HasSubstr("  unload        ok    unmapped after dlclose"));
  EXPECT_THAT(result.output, HasSubstr("verdict: OK, backend TestValid (API 1.4, release 1.2.3)"));
  EXPECT_THAT(result.output, HasSubstr("verdict: REJECTED API_INCOMPATIBLE"));
}

// A backend author's commonest first mistake: the file is not named by the scheme. `check DIR`
// names every file it skipped and why, in text and in JSON.
TEST(CheckCommandTest, NamesEveryFileItSkippedAndWhy) {
  TempDir dir;
  testing::CopyFile(Fixture("Valid"), dir / "acme-leaky.so");
  testing::WriteFile(dir / ".Acme_Leaky_backend.so.tmp", "a deploy in progress");  // hidden: quiet
  testing::CommandResult text = testing::RunCommand(std::string(BACKPLANE_EXECUTABLE) + " check " +
                                                    dir.path().string() + " 2>&1");
  EXPECT_EQ(text.exit_code, 1);
  EXPECT_THAT(text.output, HasSubstr("skipped " + (dir / "acme-leaky.so").string() +
                                     ": not named <vendor>_<name>_backend.so[.N...]"));
  EXPECT_THAT(text.output, HasSubstr("no backend files found (1 file(s) skipped"));
  EXPECT_THAT(text.output, ::testing::Not(HasSubstr(".tmp")));

  testing::CopyFile(Fixture("Valid"), dir / "Acme_Leaky_backend.so");
  testing::CopyFile(Fixture("Valid"), dir / "Acme_Leaky_backend.so.0.9");
  json report = CheckJson(dir.path().string(), 0);
  ASSERT_EQ(report.size(), 3u) << report.dump(2);
  EXPECT_EQ(report[0]["ok"], true);
  EXPECT_EQ(report[0]["skipped"], false);
  std::map<std::string, std::string> skipped;
  for (const auto& entry : report) {
    if (entry["skipped"] == true) {
      EXPECT_EQ(entry["ok"], nullptr);
      skipped[fs::path(entry["file"].get<std::string>()).filename()] = entry["reason"];
    }
  }
  EXPECT_EQ(skipped,
            (std::map<std::string, std::string>{{"acme-leaky.so", "NAME_SCHEME"},
                                                {"Acme_Leaky_backend.so.0.9", "SUPERSEDED"}}));
}

// `check DIR` reads a directory as the server does (docs/hot-reload.md, "Which file serves"): it
// says which name speaks, the real file it resolves to and the digest of what would run, and
// names every leftover.
TEST(CheckCommandTest, SaysWhichNameSpeaksWhatItResolvesToAndItsDigest) {
  TempDir dir;
  testing::CopyFile(Fixture("Valid"), dir / "Test_Valid_backend.so.1.0.0");
  testing::CopyFile(Fixture("ValidNext"), dir / "Test_Valid_backend.so.1.0.1");
  fs::create_symlink("Test_Valid_backend.so.1.0.1", dir / "Test_Valid_backend.so.1");
  const fs::path served = fs::canonical(dir / "Test_Valid_backend.so.1.0.1");
  const auto sha256sum = testing::RunCommand("sha256sum " + served.string());
  ASSERT_EQ(sha256sum.exit_code, 0);
  const std::string digest = sha256sum.output.substr(0, 64);

  testing::CommandResult text = RunBackplaneStdout("check " + dir.path().string());
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output,
              HasSubstr((dir / "Test_Valid_backend.so.1").string() + " -> " + served.string()));
  EXPECT_THAT(text.output, HasSubstr("serves:  " + served.string() + " sha256 " + digest));
  EXPECT_THAT(text.output, HasSubstr("skipped " + (dir / "Test_Valid_backend.so.1.0.0").string() +
                                     ": a leftover: Test_Valid_backend.so.1 speaks"));

  json report = CheckJson(dir.path().string(), 0);
  ASSERT_EQ(report.size(), 3u) << report.dump(2);
  EXPECT_EQ(report[0]["file"], (dir / "Test_Valid_backend.so.1").string());
  EXPECT_EQ(report[0]["release"], "1.2.4");
  EXPECT_EQ(report[0]["resolved_file"], served.string());
  EXPECT_EQ(report[0]["sha256"], digest);
}

// Loadable, but not built with backplane_add_backend(): passes, with a warning and the fix.
TEST(CheckCommandTest, WarnsAboutExtraExportsAndLazyBinding) {
  testing::CommandResult result = RunBackplaneStdout("check " + Fixture("Plain").string());
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("  build         WARN  exports "));
  EXPECT_THAT(result.output, HasSubstr(" symbols besides the entry points ("));
  EXPECT_THAT(result.output, HasSubstr("build with backplane_add_backend()"));
  EXPECT_THAT(result.output, HasSubstr("binds lazily (no -z now)"));
  EXPECT_THAT(result.output, HasSubstr("verdict: OK with 1 warning, backend TestPlain"));

  json report = CheckJson(Fixture("Plain").string(), 0);
  ASSERT_EQ(report.size(), 1u);
  bool warned = false;
  for (const auto& stage : report[0]["stages"])
    warned = warned || (stage["stage"] == "build" && stage["warning"] == true);
  EXPECT_TRUE(warned) << report.dump(2);

  // What backplane_add_backend() builds gets no such stage.
  testing::CommandResult clean = RunBackplaneStdout("check " + Fixture("Valid").string());
  EXPECT_THAT(clean.output, ::testing::Not(HasSubstr("WARN")));
}

// Rule 5: a backend with TBB's task templates compiled in (the ELF imports libtbb's task
// submission) loads and unloads, with a warning that names the evidence and the fix (IHost); the
// same work through IHost gets none.
TEST(CheckCommandTest, WarnsAboutABackendThatSubmitsTbbTasksItself) {
  testing::CommandResult result = RunBackplaneStdout("check " + Fixture("Tbb").string());
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output,
              HasSubstr("  threads       WARN  instantiates TBB's task templates itself (imports "
                        "tbb::detail::r1::spawn, tbb::detail::r1::execute_and_wait): "));
  EXPECT_THAT(result.output, HasSubstr("run parallel work through the host's IHost instead"));
  EXPECT_THAT(result.output, HasSubstr("  unload        ok"));
  EXPECT_THAT(result.output, HasSubstr("verdict: OK with 1 warning, backend TestTbb"));

  testing::CommandResult host = RunBackplaneStdout("check " + Fixture("HostParallel").string());
  EXPECT_EQ(host.exit_code, 0) << host.output;
  EXPECT_THAT(host.output, ::testing::Not(HasSubstr("WARN")));
  EXPECT_THAT(host.output, HasSubstr("version       ok    backend API 1.4 on host 1.4"));
}

TEST(CheckCommandTest, ListsEveryDependencyAndWhetherItStaysResident) {
  testing::CommandResult result = RunBackplaneStdout("check " + Fixture("VendorLibrary").string());
  EXPECT_EQ(result.exit_code, 0) << result.output;
  // Sanitizer builds list their runtimes first, so the vendor library is found anywhere on the
  // line.
  EXPECT_THAT(result.output, HasSubstr("  dependencies  ok    "));
  EXPECT_THAT(
      result.output,
      ContainsRegex("libbackplane_test_pinning\\.so -> [^;]*/libbackplane_test_pinning\\.so "
                    "\\(made resident: defines 1 STB_GNU_UNIQUE symbol\\)"));
  EXPECT_THAT(result.output, HasSubstr("libc.so.6 -> "));
  EXPECT_THAT(result.output, HasSubstr("  unload        ok"));
}

// Rule 5: OpenMP's workers outlive every call, so libgomp stays; the backend still unloads.
TEST(CheckCommandTest, SaysThatAThreadingRuntimeIsMadeResidentAndWhy) {
  testing::CommandResult result = RunBackplaneStdout("check " + Fixture("OpenMp").string());
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output,
              ContainsRegex("libgomp\\.so\\.1 -> [^;]*/libgomp\\.so\\.1 \\(made resident: "
                            "starts worker threads that outlive a call \\(GNU libgomp, the OpenMP "
                            "runtime: defines GOMP_parallel, imports pthread_create\\)\\)"));
  EXPECT_THAT(result.output, HasSubstr("  unload        ok"));
}

// Rule 5: a warning with its reason, then the failure it predicts, with spdlog's own message.
TEST(CheckCommandTest, WarnsAboutWritesIntoTheHostsLoggerRegistry) {
  testing::CommandResult result = RunBackplaneStdout("check " + Fixture("SharedLogger").string());
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output,
              HasSubstr("  registries    WARN  writes into spdlog's logger registry and global "
                        "settings (imports spdlog::details::registry::initialize_logger) of "
                        "libspdlog.so.1.10, the copy the whole process shares"));
  EXPECT_THAT(result.output, HasSubstr("  factory       ok"));
  EXPECT_THAT(result.output,
              HasSubstr("  instance      FAIL  " + Fixture("SharedLogger").string() +
                        " (backend TestSharedLogger): BackendFactory failed: logger with name "
                        "'TestSharedLogger' already exists"));
}

TEST(CheckCommandTest, UsageErrorsExitWithTwo) {
  EXPECT_EQ(RunBackplaneStdout("check --no-such-flag x").exit_code, 2);
  EXPECT_EQ(RunBackplaneStdout("no-such-command").exit_code, 2);
  EXPECT_EQ(RunBackplaneStdout("").exit_code, 2);
}

// The issue's own acceptance check: first-party backends export the entry points and no
// STB_GNU_UNIQUE ('u') symbols.
TEST(CheckCommandTest, FirstPartyBackendsExportEntryPointsAndNoUniqueSymbols) {
  const std::string command = "nm -D --defined-only '" + testing::CpuRefBackend().string() + "'";
  const testing::CommandResult nm = testing::RunCommand(command);
  ASSERT_EQ(nm.exit_code, 0) << "nm failed";
  const std::string& symbols = nm.output;
  for (const char* entry : {" T GetBackendId\n", " T GetVersion\n", " T BackendFactory\n"}) {
    EXPECT_THAT(symbols, HasSubstr(entry));
  }
  EXPECT_THAT(symbols, ::testing::Not(HasSubstr(" u "))) << symbols;
}

}  // namespace
}  // namespace backplane
