// Loading rule 8: a backend's dependencies, found as the dynamic linker finds them; those glibc
// can never unload made resident first, so that every copy of the backend unloads; a library
// bundled in the backend directory refused.
#include "backplane/loader/dependencies.hpp"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "backplane/loader/elf_inspector.hpp"
#include "backplane/loader/loader.hpp"
#include "loader/loader_test_util.hpp"
#include "test_util.hpp"

namespace backplane::loader {
namespace {

using testing::FindStage;
using testing::InProcess;

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace backplane::testing;

const fs::path kVendorLibrary = BACKPLANE_TEST_VENDOR_LIBRARY;

TEST(DependencyTest, TheHostsOwnLibrariesAreAlreadyLoaded) {
  auto facts = ReadElfFile(CpuRefBackend(), "CpuRef");
  ASSERT_TRUE(facts.ok()) << facts.error().ToString();
  EXPECT_THAT(facts->needed, ::testing::Contains("libstdc++.so.6"));
  auto dependencies = PrepareDependencies(facts.value(), CpuRefBackend());
  ASSERT_TRUE(dependencies.ok()) << dependencies.error().ToString();
  ASSERT_FALSE(dependencies->empty());
  for (const Dependency& library : dependencies.value()) {
    // Found where the dynamic linker found it for this process: NOLOAD recognises the path.
    EXPECT_EQ(library.state, Dependency::State::kAlreadyLoaded)
        << library.name << " -> " << library.path;
    EXPECT_TRUE(library.path.is_absolute()) << library.name;
  }
}

// Measured on glibc 2.36: without rule 8, the first copy stays mapped after dlclose while later
// copies unload. With it, every copy leaves and the library stays, loaded once.
TEST(DependencyTest, ALibraryGlibcCannotUnloadIsMadeResidentSoEveryCopyUnloads) {
  ASSERT_FALSE(InProcess(kVendorLibrary)) << "another test loaded " << kVendorLibrary;
  auto loader = MakeLoader();
  TempDir deploys;
  constexpr int kCopies = 5;
  std::vector<fs::path> shadows;
  for (int copy = 0; copy < kCopies; ++copy) {
    SCOPED_TRACE("copy " + std::to_string(copy));
    // A new file each time (its own real path), so each is a new generation.
    const fs::path file = deploys / std::to_string(copy) / "Test_VendorLibrary_backend.so";
    fs::create_directories(file.parent_path());
    CopyFile(Fixture("VendorLibrary"), file);
    LoadTrace trace;
    auto loaded = loader->Load(file, &trace);
    ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
    GenerationLease generation = std::move(loaded).value();
    const LoadStage* stage = FindStage(trace, "dependencies");
    ASSERT_NE(stage, nullptr);
    EXPECT_TRUE(stage->ok);
    EXPECT_THAT(stage->detail,
                HasSubstr(kVendorLibrary.filename().string() + " -> " + kVendorLibrary.string() +
                          " (made resident: defines 1 STB_GNU_UNIQUE symbol)"));
    EXPECT_THAT(stage->detail, HasSubstr("libstdc++.so.6 -> "));
    {
      auto instance = loader->CreateInstance(generation);  // runs the library's code
      ASSERT_TRUE(instance.ok()) << instance.error().ToString();
    }
    shadows.push_back(generation->info().mapped_as);
    generation.reset();  // the last lease
    loader->WaitForUnloads();
  }
  EXPECT_EQ(loader->stats().leaked.load(), 0u);
  EXPECT_EQ(loader->stats().unloaded.load(), static_cast<uint64_t>(kCopies));
  for (const fs::path& shadow : shadows)
    EXPECT_FALSE(IsCodeMapped(shadow.string())) << shadow << " is still mapped";
  EXPECT_TRUE(InProcess(kVendorLibrary)) << "the vendor library should stay resident";
}

TEST(DependencyTest, RefusesALibraryBundledInTheBackendDirectory) {
  TempDir directory;
  CopyFile(Fixture("BundledLibrary"), directory / "Test_BundledLibrary_backend.so");
  CopyFile(kVendorLibrary, directory / kVendorLibrary.filename().string());
  auto loader = MakeLoader();
  LoadTrace trace;
  auto loaded = loader->Load(directory / "Test_BundledLibrary_backend.so", &trace);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().reason(), LoadReason::kBundledDependency);
  EXPECT_THAT(loaded.error().message(),
              HasSubstr("needs " + kVendorLibrary.filename().string() + ", which resolves to " +
                        (directory / kVendorLibrary.filename().string()).string() +
                        " in the backend directory"));
  EXPECT_THAT(loaded.error().message(), HasSubstr("link it statically"));
  ASSERT_FALSE(trace.stages.empty());
  EXPECT_EQ(trace.stages.back().name, "dependencies");
  EXPECT_FALSE(trace.stages.back().ok);
}

TEST(DependencyTest, DescribesEveryLibraryWithItsState) {
  std::vector<Dependency> dependencies = {
      {.name = "libdnnl.so.2",
       .needed_by = "X_Y_backend.so",
       .path = "/usr/lib/libdnnl.so.2",
       .state = Dependency::State::kResident,
       .why_resident = "defines 3 STB_GNU_UNIQUE symbols"},
      {.name = "libmissing.so.1", .needed_by = "X_Y_backend.so"},
  };
  EXPECT_EQ(DescribeDependencies(dependencies),
            "libdnnl.so.2 -> /usr/lib/libdnnl.so.2 (made resident: defines 3 STB_GNU_UNIQUE "
            "symbols); libmissing.so.1 (not found)");
  EXPECT_EQ(DescribeDependencies({}), "none");
}

// Rule 5: a threading runtime is known by its name, or by its symbols when renamed (auditwheel
// ships libgomp as libgomp-<hash>.so.1): a fork entry point defined and a thread start imported.
// LLVM's libomp stands in (its soname is not libgomp's, which the OpenMP trap test looks for).
TEST(DependencyTest, ARenamedThreadingRuntimeIsKnownByItsSymbols) {
  const fs::path libomp = "/usr/lib/x86_64-linux-gnu/libomp.so.5";
  BACKPLANE_REQUIRE_PATH(libomp);  // Debian package libomp5-14
  TempDir vendor, deploy;
  CopyFile(libomp, vendor / "libomp-5f3c1a2b.so.5");
  ElfFacts backend;
  backend.needed = {"libomp-5f3c1a2b.so.5"};
  backend.search_path = vendor.path().string();
  backend.search_path_is_runpath = true;
  auto dependencies = PrepareDependencies(backend, deploy / "Test_Renamed_backend.so");
  ASSERT_TRUE(dependencies.ok()) << dependencies.error().ToString();
  ASSERT_FALSE(dependencies->empty());
  const Dependency& runtime = dependencies->front();
  EXPECT_EQ(runtime.name, "libomp-5f3c1a2b.so.5");
  EXPECT_EQ(runtime.state, Dependency::State::kResident);
  EXPECT_TRUE(runtime.starts_worker_threads);
  // Known by its symbols alone (libomp also defines GOMP_parallel, for code GCC compiled).
  EXPECT_THAT(runtime.why_resident,
              ::testing::ContainsRegex("starts worker threads that outlive a call \\(defines "
                                       "(__kmpc_fork_call|GOMP_parallel), imports "
                                       "pthread_create\\)"));
}

TEST(DependencyTest, ReadsTheEvidenceOfEachThreadingRuntime) {
  const std::vector<std::pair<fs::path, std::string>> runtimes = {
      {"/usr/lib/x86_64-linux-gnu/libgomp.so.1", "GOMP_parallel"},
      {"/usr/lib/x86_64-linux-gnu/libtbb.so.12", "_ZN3tbb6detail2r15spawnE"},
      {"/usr/lib/x86_64-linux-gnu/libomp.so.5", ""},  // __kmpc_fork_call or GOMP_parallel
  };
  for (const auto& [path, entry_point] : runtimes) {
    if (!fs::exists(path)) {
      // libgomp comes with libdnnl-dev, libtbb with libtbb-dev, libomp with libomp5-14.
      if (RunningInCi())
        ADD_FAILURE() << path << " is missing (CI=true: tests never skip for missing data)";
      continue;
    }
    auto facts = ReadElfFile(path, path.string());
    ASSERT_TRUE(facts.ok()) << facts.error().ToString();
    EXPECT_NE(facts->thread_pool_entry_point, "") << path;
    EXPECT_THAT(facts->thread_pool_entry_point, ::testing::StartsWith(entry_point)) << path;
    EXPECT_EQ(facts->thread_start_import, "pthread_create") << path;
  }
  // The host's own libraries start no thread pool.
  auto facts = ReadElfFile(CpuRefBackend(), "CpuRef");
  ASSERT_TRUE(facts.ok());
  EXPECT_EQ(facts->thread_pool_entry_point, "");
}

TEST(DependencyTest, DescribesWritesIntoRegistriesTheHostShares) {
  ElfFacts backend;
  backend.registry_writes = {
      "_ZN3tbb6detail2r16createERNS0_2d114global_controlE",
      "_ZN6google8protobuf8internal14AddDescriptorsEPKNS1_15DescriptorTableE"};
  std::vector<Dependency> dependencies = {
      {.name = "libtbb.so.12",
       .path = "/usr/lib/libtbb.so.12",
       .state = Dependency::State::kAlreadyLoaded},
      // Its own copy, loaded and unloaded with each generation: not shared.
      {.name = "libprotobuf.so.32",
       .path = "/usr/lib/libprotobuf.so.32",
       .state = Dependency::State::kLoadsWithBackend},
      // Linked, but never written into.
      {.name = "libspdlog.so.1.10",
       .path = "/usr/lib/libspdlog.so.1.10",
       .state = Dependency::State::kAlreadyLoaded},
  };
  const std::string text = DescribeSharedRegistries(backend, dependencies);
  EXPECT_THAT(text, ::testing::StartsWith(
                        "writes into TBB's global_control limits and task_scheduler_observer list "
                        "(imports tbb::detail::r1::create) of libtbb.so.12, the copy the whole "
                        "process shares (/usr/lib/libtbb.so.12): a global_control caps"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("protobuf")));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("spdlog")));

  dependencies[1].state = Dependency::State::kAlreadyLoaded;
  EXPECT_THAT(DescribeSharedRegistries(backend, dependencies),
              HasSubstr("; writes into protobuf's generated descriptor pool (imports "
                        "google::protobuf::internal::AddDescriptors) of libprotobuf.so.32"));
  EXPECT_EQ(DescribeSharedRegistries({}, dependencies), "");
}

}  // namespace
}  // namespace backplane::loader
