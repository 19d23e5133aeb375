// The measured traps of the loading rules (docs/loading-rules.md): each would crash or leak if the
// loader fell in.
#include <dlfcn.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <thread>

#include "backplane/loader/loader.hpp"
#include "loader/loader_test_util.hpp"
#include "test_util.hpp"

namespace backplane::loader {
namespace {

using testing::FindStage;
using testing::InProcess;

using testing::CopyFile;
using testing::Fixture;
using ::testing::HasSubstr;
using testing::IsCodeMapped;
using testing::TempDir;

using testing::IdentityOp;
using testing::RunIdentity;

int64_t FactoryCalls(const BackendInstance& instance) {
  return std::get<int64_t>(instance.GetOption("factory_calls").value());
}

// Rule 1: `cp` onto a file whose library is mapped kills the process unless the mapped file is a
// private copy.
TEST(LoaderTrapTest, OverwritingTheSourceInPlaceWhileInUseDoesNotCrash) {
  TempDir dir;
  const auto file = dir / "Test_Live_backend.so";
  CopyFile(Fixture("Valid"), file);
  auto loader = Loader::Create().value();
  auto generation = loader->Load(file).value();
  auto instance = loader->CreateInstance(generation).value();
  auto workload = instance->CreateWorkload(IdentityOp(64)).value();
  EXPECT_EQ(RunIdentity(*workload, 64)[63], 63.0f);

  // What `cp Offset.so Live.so` does: truncate and rewrite the same inode.
  const std::string replacement = testing::ReadFile(Fixture("Offset"));
  const int fd = open(file.c_str(), O_WRONLY | O_TRUNC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, replacement.data(), replacement.size()),
            static_cast<ssize_t>(replacement.size()));
  close(fd);

  EXPECT_EQ(RunIdentity(*workload, 64)[63], 63.0f) << "the old generation keeps its own code";
  auto replaced = loader->Load(file);
  ASSERT_TRUE(replaced.ok()) << replaced.error().ToString();
  EXPECT_NE(replaced->info().number, generation->info().number);
  auto new_instance = loader->CreateInstance(replaced.share()).value();
  auto new_workload = new_instance->CreateWorkload(IdentityOp(64)).value();
  EXPECT_EQ(RunIdentity(*new_workload, 64)[63], 1063.0f) << "the new generation runs the new code";
}

// Rule 3's consequence: two versions of one backend loaded at once must not share objects.
TEST(LoaderTrapTest, TwoGenerationsOfOneIdKeepSeparateState) {
  TempDir dir;
  CopyFile(Fixture("Valid"), dir / "Test_First_backend.so");
  CopyFile(Fixture("Valid"), dir / "Test_Second_backend.so");
  auto loader = Loader::Create().value();
  auto first = loader->Load(dir / "Test_First_backend.so").value();
  auto second = loader->Load(dir / "Test_Second_backend.so").value();
  ASSERT_EQ(first->info().backend_id, second->info().backend_id);
  ASSERT_NE(first->info().number, second->info().number);

  std::vector<std::shared_ptr<BackendInstance>> instances;
  for (int i = 0; i < 3; ++i)
    instances.push_back(loader->CreateInstance(first).value());
  instances.push_back(loader->CreateInstance(second).value());
  // Each library counted its own factory calls: the load-time probe plus the instances above.
  EXPECT_EQ(FactoryCalls(*instances.front()), 4);
  EXPECT_EQ(FactoryCalls(*instances.back()), 2);
}

TEST(LoaderTrapTest, RefusesWhatCannotBeUnloadedAndNamesTheFix) {
  auto loader = Loader::Create().value();
  const std::pair<const char*, const char*> cases[] = {
      {"Unique", "-fno-gnu-unique"},
      {"Nodelete", "nodelete"},
      {"ThreadLocal", "__cxa_thread_atexit"},
      {"ExecStack", "-z noexecstack"},
  };
  for (const auto& [fixture, fix] : cases) {
    auto loaded = loader->Load(Fixture(fixture));
    ASSERT_FALSE(loaded.ok()) << fixture;
    EXPECT_EQ(loaded.error().reason(), LoadReason::kNotUnloadable) << fixture;
    EXPECT_THAT(loaded.error().message(), HasSubstr(fix)) << fixture;
  }
  EXPECT_EQ(loader->stats().loaded.load(), 0u) << "refused before dlopen";
  EXPECT_FALSE(IsCodeMapped("-Test_Unique_backend.so"));
}

// Rule 2: RTLD_NOW turns a missing symbol into a load error, not a process kill at first call.
TEST(LoaderTrapTest, MissingSymbolFailsAtLoadNotAtFirstCall) {
  auto loader = Loader::Create().value();
  auto loaded = loader->Load(Fixture("MissingSymbol"));
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().reason(), LoadReason::kDlopenFailed);
  EXPECT_THAT(loaded.error().message(),
              HasSubstr("backplane_fixture_function_that_does_not_exist"));
  // The message names the deployed file, not the sealed copy the operator never sees.
  EXPECT_THAT(loaded.error().message(),
              HasSubstr(std::filesystem::canonical(Fixture("MissingSymbol")).string() + ":"));
  EXPECT_THAT(loaded.error().message(), ::testing::Not(HasSubstr("/proc/self/fd/")));
}

// A library linked for lazy binding would bind the missing symbol at its first call: the host's
// RTLD_NOW alone makes it a load error (the fixture above binds at load whatever the host asks).
TEST(LoaderTrapTest, MissingSymbolOfALazilyLinkedLibraryFailsAtLoadToo) {
  auto loader = Loader::Create().value();
  auto loaded = loader->Load(Fixture("MissingSymbolLazy"));
  ASSERT_FALSE(loaded.ok()) << "loaded: its first call would kill the process";
  EXPECT_EQ(loaded.error().reason(), LoadReason::kDlopenFailed);
  EXPECT_THAT(loaded.error().message(),
              HasSubstr("backplane_fixture_function_that_does_not_exist"));
}

// Rule 5: the host owns TBB, so a backend that used it unloads cleanly and TBB stays.
TEST(LoaderTrapTest, BackendUsingTbbUnloadsCleanly) {
  auto loader = Loader::Create().value();
  std::filesystem::path shadow;
  {
    auto generation = loader->Load(Fixture("Tbb")).value();
    shadow = generation->info().mapped_as;
    auto instance = loader->CreateInstance(generation).value();
    auto workload = instance->CreateWorkload(IdentityOp(100000)).value();
    const auto out = RunIdentity(*workload, 100000);
    EXPECT_EQ(out[99999], 99999.0f);
  }
  loader->WaitForUnloads();
  EXPECT_FALSE(IsCodeMapped(shadow.string()));
  EXPECT_TRUE(IsCodeMapped("libtbb"));
  EXPECT_EQ(loader->stats().leaked.load(), 0u);
}

// Threads of this process, from /proc/self/task.
std::size_t ThreadCount() {
  std::size_t count = 0;
  for ([[maybe_unused]] const auto& task : std::filesystem::directory_iterator("/proc/self/task"))
    ++count;
  return count;
}

// Rule 5: libgomp comes in with a backend built with -fopenmp, and its worker threads stay
// parked in libgomp after every parallel region. Unloaded with the backend, libgomp would be
// unmapped under them; made resident first, it stays, every copy of the backend still unloads,
// and the next copy's parallel regions run on the same workers.
TEST(LoaderTrapTest, OpenMpRuntimeStaysResidentAfterItsBackendLeaves) {
  ASSERT_FALSE(InProcess("libgomp.so.1")) << "another test loaded libgomp";
  auto loader = Loader::Create().value();
  TempDir deploys;
  for (int copy = 0; copy < 2; ++copy) {
    SCOPED_TRACE("copy " + std::to_string(copy));
    // A new file each time (its own real path), so each is a new generation.
    const std::filesystem::path file = deploys / std::to_string(copy) / "Test_OpenMp_backend.so";
    std::filesystem::create_directories(file.parent_path());
    CopyFile(Fixture("OpenMp"), file);
    std::filesystem::path shadow;
    const std::size_t threads_before = ThreadCount();
    {
      LoadTrace trace;
      auto loaded = loader->Load(file, &trace);
      ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
      GenerationLease generation = std::move(loaded).value();
      shadow = generation->info().mapped_as;
      const LoadStage* stage = FindStage(trace, "dependencies");
      ASSERT_NE(stage, nullptr);
      EXPECT_THAT(stage->detail,
                  ::testing::ContainsRegex(
                      "libgomp\\.so\\.1 -> [^;]*/libgomp\\.so\\.1 \\(made resident: starts worker "
                      "threads that outlive a call \\(GNU libgomp, the OpenMP runtime: defines "
                      "GOMP_parallel, imports pthread_create\\)\\)"));
      EXPECT_TRUE(InProcess("libgomp.so.1")) << "resident before the backend is dlopened";
      auto instance = loader->CreateInstance(generation).value();
      auto workload = instance->CreateWorkload(IdentityOp(100000)).value();
      const auto out = RunIdentity(*workload, 100000);  // a parallel for on 4 threads
      EXPECT_EQ(out[99999], 99999.0f);
    }
    loader->WaitForUnloads();
    EXPECT_FALSE(IsCodeMapped(shadow.string())) << "the backend itself must still unload";
    EXPECT_TRUE(InProcess("libgomp.so.1")) << "libgomp unmapped under its worker threads";
    EXPECT_TRUE(IsCodeMapped("libgomp"));
    if (copy == 0) {
      EXPECT_GT(ThreadCount(), threads_before) << "libgomp's workers outlive the request";
    } else {
      EXPECT_EQ(ThreadCount(), threads_before) << "the second copy reuses the parked workers";
    }
  }
  EXPECT_EQ(loader->stats().leaked.load(), 0u);
  EXPECT_EQ(loader->stats().unloaded.load(), 2u);
}

// Rule 5: spdlog's logger registry is one per process, shared with the host. A backend that
// registers a named logger is warned about at load; its probe instance registers the name, and
// the next instance fails with spdlog's own message (the factory no longer swallows it).
TEST(LoaderTrapTest, BackendRegisteringAHostLoggerIsWarnedAboutAndItsFailureNamed) {
  auto loader = Loader::Create().value();
  LoadTrace trace;
  auto loaded = loader->Load(Fixture("SharedLogger"), &trace);
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  GenerationLease generation = std::move(loaded).value();
  const LoadStage* stage = FindStage(trace, "registries");
  ASSERT_NE(stage, nullptr) << "no warning about spdlog's registry";
  EXPECT_TRUE(stage->ok);
  EXPECT_TRUE(stage->warning);
  EXPECT_THAT(stage->detail,
              HasSubstr("writes into spdlog's logger registry and global settings (imports "
                        "spdlog::details::registry::initialize_logger) of libspdlog.so"));
  EXPECT_THAT(stage->detail, HasSubstr("already exists"));
  EXPECT_THAT(stage->detail, HasSubstr("std::make_shared<spdlog::logger>"));

  auto second = loader->CreateInstance(generation);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().reason(), LoadReason::kFactoryFailed);
  EXPECT_THAT(second.error().message(),
              HasSubstr("BackendFactory failed: logger with name 'TestSharedLogger' already "
                        "exists"));
  // The registered logger's sink is backend code: out of the registry before the code leaves.
  spdlog::drop("TestSharedLogger");
  generation.reset();
  loader->WaitForUnloads();
  EXPECT_EQ(loader->stats().leaked.load(), 0u);
}

// The sink factories the compiled libspdlog instantiates itself register the logger inside
// libspdlog: the backend imports only the factory (stdout_color_mt, the call spdlog's README
// shows first), so the evidence lists each factory family, not only the registry's functions.
TEST(LoaderTrapTest, EverySpdlogFactoryFamilyIsWarnedAbout) {
  auto loader = Loader::Create().value();
  for (const auto& [fixture, import] :
       {std::pair{"SharedColorLogger", "spdlog::stdout_color_mt<spdlog::synchronous_factory>"},
        std::pair{"SharedStdoutLogger", "spdlog::stdout_logger_mt<spdlog::synchronous_factory>"}}) {
    SCOPED_TRACE(fixture);
    LoadTrace trace;
    auto loaded = loader->Load(Fixture(fixture), &trace);
    ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
    const GenerationLease generation = std::move(loaded).value();
    const LoadStage* stage = FindStage(trace, "registries");
    ASSERT_NE(stage, nullptr) << "no warning about spdlog's registry";
    EXPECT_TRUE(stage->warning);
    EXPECT_THAT(stage->detail, HasSubstr("writes into spdlog's logger registry and global "
                                         "settings (imports "));
    EXPECT_THAT(stage->detail, HasSubstr(std::string(import) + ") of libspdlog.so"));
    auto second = loader->CreateInstance(generation);
    ASSERT_FALSE(second.ok());
    EXPECT_THAT(second.error().message(), HasSubstr("already exists"));
    spdlog::drop(std::string("Test") + fixture);
  }
  loader->WaitForUnloads();
  EXPECT_EQ(loader->stats().leaked.load(), 0u);
}

// Rule 5's fallback for a backend that submits TBB tasks itself (the Tbb fixture's parallel_for
// and background task_group): the ELF says so, every call into it runs in an arena of its own,
// and the reaper closes it once TBB reports that no thread is inside that arena, not after a
// sleep. Repeated, because the trap is a worker still returning through the backend's copy of
// TBB's templates, a race that one cycle rarely loses.
TEST(LoaderTrapTest, BackendSubmittingTbbTasksIsConfinedAndUnloadsOnceItsArenaIsEmpty) {
  auto loader = Loader::Create().value();
  for (int cycle = 0; cycle < 100; ++cycle) {
    std::filesystem::path shadow;
    {
      auto generation = loader->Load(Fixture("Tbb")).value();
      ASSERT_TRUE(generation->info().submits_tbb_tasks);
      shadow = generation->info().mapped_as;
      auto instance = loader->CreateInstance(generation).value();
      auto workload = instance->CreateWorkload(IdentityOp(10000)).value();
      ASSERT_EQ(RunIdentity(*workload, 10000)[9999], 9999.0f);
      EXPECT_GT(generation->confined_entries(), 0u);  // its calls ran inside its arena
    }
    loader->WaitForUnloads();
    ASSERT_FALSE(IsCodeMapped(shadow.string())) << cycle;
  }
  EXPECT_EQ(loader->stats().leaked.load(), 0u);
}

// Records where and in which order its teardown runs.
class TeardownRecorder final : public IBackend {
 public:
  struct Log {
    std::mutex mutex;
    std::vector<std::pair<std::string, std::thread::id>> events;
    void Add(std::string event) {
      std::lock_guard lock(mutex);
      events.emplace_back(std::move(event), std::this_thread::get_id());
    }
  };
  explicit TeardownRecorder(Log& log) : log_(log) {}
  ~TeardownRecorder() override { log_.Add("destroyed"); }
  std::string_view GetId() const override { return "Recorder"; }
  Status IsSupported(const OperatorDesc&) const override { return Status::Ok(); }
  Result<std::unique_ptr<IWorkload>> CreateWorkload(const OperatorDesc&) override {
    return Unimplemented("none");
  }
  void Shutdown() override { log_.Add("shutdown"); }

 private:
  Log& log_;
};

// Rule 6: the last release of an instance, wherever it happens, runs its teardown on the reaper:
// Shutdown first, then the destructor, never on the releasing (request) thread.
TEST(LoaderTrapTest, LastReleaseOnARequestThreadIsReapedElsewhere) {
  TeardownRecorder::Log log;
  auto reaper = std::make_shared<Reaper>();
  auto instance =
      MakeBackendInstance("Recorder", std::make_unique<TeardownRecorder>(log), nullptr, reaper);
  std::thread::id request_thread;
  std::thread request([&, moved = std::move(instance)]() mutable {
    request_thread = std::this_thread::get_id();
    moved.reset();
  });
  request.join();
  reaper->WaitIdle();
  std::lock_guard lock(log.mutex);
  ASSERT_EQ(log.events.size(), 2u);
  EXPECT_EQ(log.events[0].first, "shutdown");
  EXPECT_EQ(log.events[1].first, "destroyed");
  for (const auto& [event, thread] : log.events) {
    EXPECT_NE(thread, request_thread) << event;
    EXPECT_NE(thread, std::this_thread::get_id()) << event;
  }
}

// A reaper that is gone (process shutdown) must not lose a disposal: it runs inline.
TEST(LoaderTrapTest, ReleaseAfterTheReaperIsGoneDisposesInline) {
  TeardownRecorder::Log log;
  auto reaper = std::make_shared<Reaper>();
  auto instance =
      MakeBackendInstance("Recorder", std::make_unique<TeardownRecorder>(log), nullptr, reaper);
  reaper.reset();
  instance.reset();
  std::lock_guard lock(log.mutex);
  ASSERT_EQ(log.events.size(), 2u);
  EXPECT_EQ(log.events[1].second, std::this_thread::get_id());
}

}  // namespace
}  // namespace backplane::loader
