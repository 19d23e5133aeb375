// A crash in-process says what died (issue 39): `backplane serve` with a model on the TestCrash
// fixture, whose Execute dies the way its input's first element says (fixture_backend.hpp,
// CrashMark), given one request so marked. The server dies as it would without the reporter
// (same signal), and its last line names the signal, the backend, its generation, sha256 and
// file, the call and the model. exit() is no signal: nothing of its own to report.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>

#include "onnx/model_builder.hpp"
#include "sanitizer_build.hpp"
#include "serve_test_util.hpp"

namespace backplane::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

// fixture_backend.hpp's CrashMark, as the request's first element.
constexpr int kNullWrite = 9110;
constexpr int kAbort = 9060;
constexpr int kExitThree = 9030;
constexpr int kExitZero = 9000;
constexpr int kStackOverflow = 9130;

// The last non-empty line of `log`.
std::string LastLine(const std::string& log) {
  std::size_t end = log.find_last_not_of('\n');
  if (end == std::string::npos)
    return "";
  const std::size_t begin = log.rfind('\n', end);
  return log.substr(begin == std::string::npos ? 0 : begin + 1,
                    end - (begin == std::string::npos ? 0 : begin + 1) + 1);
}

// What GET /v2/backends/TestCrash says of its active generation.
struct ServedGeneration {
  uint64_t number = 0;
  std::string sha256;
  std::string resolved_file;
};

class CrashReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelBuilder builder;
    builder.Input("x", {-1, 4}).Output("y", {-1, 4});
    builder.Node("Identity", {"x"}, {"y"});
    home_.Write("models/crashy/1/model.onnx", builder.Serialize());
    home_.Write("models/crashy/config.json", R"({"backends": ["TestCrash"]})");
    CopyFile(Fixture("Crash"), home_.backends() / "Test_Crash_backend.so");
    std::map<std::string, std::string> env;
#ifdef BACKPLANE_ASAN_BUILD
    // AddressSanitizer's own SEGV handler would report the fault and abort (the preset's
    // abort_on_error): the server under test is the reporter with the default disposition, as
    // in a release build (its chaining to a previous handler is FatalSignalReporterTest's). And
    // exit() from inside a request would check for leaks with everything still in use.
    const char* options = std::getenv("ASAN_OPTIONS");
    env["ASAN_OPTIONS"] =
        std::string(options != nullptr ? options : "") +
        ":handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0:detect_leaks=0";
#endif
    server_ = ServeProcess::Start({"--models", home_.models().string(), "--backends",
                                   home_.backends().string(), "--grpc-listen", "off"},
                                  env);
    auto client = server_->Client();
    const JsonReply status = Get(*client, "/v2/backends/TestCrash");
    ASSERT_EQ(status.status, 200) << status.text;
    active_.number = status.body["active_generation"].get<uint64_t>();
    for (const auto& generation : status.body["generations"]) {
      if (generation["generation"].get<uint64_t>() == active_.number) {
        active_.sha256 = generation["sha256"].get<std::string>();
        active_.resolved_file = generation["resolved_file"].get<std::string>();
      }
    }
    ASSERT_FALSE(active_.sha256.empty()) << status.text;
  }

  // Sends one request whose first element is `mark`; the server is expected to die of it.
  void Infer(int mark) {
    auto client = server_->Client();
    const json body = {
        {"inputs",
         {{{"name", "x"}, {"shape", {1, 4}}, {"datatype", "FP32"}, {"data", {mark, 0, 0, 0}}}}}};
    const JsonReply reply = Post(*client, "/v2/models/crashy/infer", body.dump());
    EXPECT_EQ(reply.status, 0) << "the server answered: " << reply.text;
  }

  // The line a crash in TestCrash's Execute leaves, after the signal's name and number.
  std::string InExecute() const {
    return "while backend TestCrash generation " + std::to_string(active_.number) + " (sha256 " +
           active_.sha256 + ", file " + active_.resolved_file +
           ") ran IWorkload::Execute for model " +
           (home_.models() / "crashy" / "1" / "model.onnx").string() + "; the process ends";
  }

  ServeHome home_;
  std::unique_ptr<ServeProcess> server_;
  ServedGeneration active_;
};

TEST_F(CrashReportTest, NullWriteInExecuteNamesTheBackendCallThenDiesOfSigsegv) {
#ifdef BACKPLANE_ASAN_BUILD
  // The preset builds the fixture with UndefinedBehaviorSanitizer, unrecoverable: it stops the
  // null write before it faults (no suppression applies). The reporter's answer to a null write
  // under AddressSanitizer is FatalSignalReporterDeathTest's.
  GTEST_SKIP() << "UBSan stops the fixture's null write before it faults";
#endif
  Infer(kNullWrite);
  ASSERT_TRUE(server_->WaitForExit(30s).has_value());
  EXPECT_EQ(server_->terminating_signal(), SIGSEGV);
  const std::string last = LastLine(server_->Log());
  EXPECT_THAT(last, HasSubstr("backplane: fatal signal SIGSEGV (11, address 0x0) on thread "));
  EXPECT_THAT(last, HasSubstr(InExecute()));
}

TEST_F(CrashReportTest, AbortInExecuteNamesTheBackendCallThenDiesOfSigabrt) {
  Infer(kAbort);
  ASSERT_TRUE(server_->WaitForExit(30s).has_value());
  EXPECT_EQ(server_->terminating_signal(), SIGABRT);
  const std::string last = LastLine(server_->Log());
  EXPECT_THAT(last, HasSubstr("backplane: fatal signal SIGABRT (6) on thread "));
  EXPECT_THAT(last, HasSubstr(InExecute()));
}

// The handler runs on the thread's alternate stack: the overflowed one has no room left.
TEST_F(CrashReportTest, StackOverflowInExecuteIsReportedToo) {
  Infer(kStackOverflow);
  ASSERT_TRUE(server_->WaitForExit(30s).has_value());
  EXPECT_EQ(server_->terminating_signal(), SIGSEGV);
  const std::string last = LastLine(server_->Log());
  EXPECT_THAT(last, HasSubstr("backplane: fatal signal SIGSEGV (11, address 0x"));
  EXPECT_THAT(last, HasSubstr(InExecute()));
}

// exit() is no signal, and the reporter has nothing to say about one. But exit() from a request
// thread does not end a server cleanly: it runs the process's static destructors while every
// other thread still works, and the server dies of a SIGSEGV in that teardown, on the thread that
// called exit(), still inside the backend call. Whichever way it ends, the line (if any) must
// name that call, and an exit status without a signal must come without a line.
void ExpectExitIsReportedTruthfully(ServeProcess& server, int status, const std::string& call) {
  const std::optional<int> code = server.WaitForExit(30s);
  ASSERT_TRUE(code.has_value());
  const std::string log = server.Log();
  if (server.terminating_signal() == 0) {
    EXPECT_EQ(*code, status);
    EXPECT_THAT(log, Not(HasSubstr("fatal signal")));
  } else {
    EXPECT_EQ(server.terminating_signal(), SIGSEGV);
    EXPECT_THAT(LastLine(log), HasSubstr("backplane: fatal signal SIGSEGV (11, address "));
    EXPECT_THAT(LastLine(log), HasSubstr(call));
  }
}

TEST_F(CrashReportTest, ExitInExecuteIsNoSignalOfItsOwn) {
  Infer(kExitThree);
  ExpectExitIsReportedTruthfully(*server_, 3, InExecute());
}

TEST_F(CrashReportTest, ExitZeroInExecuteIsNoSignalOfItsOwn) {
  Infer(kExitZero);
  ExpectExitIsReportedTruthfully(*server_, 0, InExecute());
}

// A fatal signal sent from outside is no fault of the server's: the line says who sent it, and
// no backend call runs on an idle server.
TEST_F(CrashReportTest, SignalSentFromOutsideSaysBySomeoneAndOutsideBackendCode) {
  server_->Signal(SIGSEGV);
  ASSERT_TRUE(server_->WaitForExit(30s).has_value());
  EXPECT_EQ(server_->terminating_signal(), SIGSEGV);
  const std::string last = LastLine(server_->Log());
  EXPECT_THAT(last, HasSubstr("backplane: fatal signal SIGSEGV (11, sent by pid " +
                              std::to_string(getpid()) + ") on thread "));
  EXPECT_THAT(last, HasSubstr(" outside backend code; the process ends"));
}

}  // namespace
}  // namespace backplane::testing
