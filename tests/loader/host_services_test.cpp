// SDK 1.2's IHost: parallel work that the host runs for backends, so that a backend's library can
// be unmapped as soon as its waits return (docs/loading-rules.md rule 5).
#include "backplane/loader/host_services.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <stdexcept>
#include <vector>

#include "backplane/loader/loader.hpp"
#include "loader/loader_test_util.hpp"
#include "test_util.hpp"

namespace backplane::loader {
namespace {

using testing::Fixture;
using ::testing::HasSubstr;
using testing::IsCodeMapped;

using testing::IdentityOp;
using testing::RunIdentity;

TEST(HostServicesTest, ParallelForCallsTheBodyOnceForEveryIndex) {
  constexpr std::size_t kSize = 100000;
  std::vector<std::atomic<int>> seen(kSize);
  auto body = [](void* context, std::size_t begin, std::size_t end) {
    auto& counts = *static_cast<std::vector<std::atomic<int>>*>(context);
    for (std::size_t i = begin; i < end; ++i)
      counts[i].fetch_add(1);
  };
  ASSERT_TRUE(HostServices().ParallelFor(kSize, 1000, body, &seen).ok());
  for (std::size_t i = 0; i < kSize; ++i)
    ASSERT_EQ(seen[i].load(), 1) << i;
  // Nothing to do, and a grain of 0 (taken as 1).
  EXPECT_TRUE(HostServices().ParallelFor(0, 0, body, &seen).ok());
  EXPECT_TRUE(HostServices().ParallelFor(1, 0, body, &seen).ok());
  EXPECT_EQ(seen[0].load(), 2);
  EXPECT_GE(HostServices().MaxConcurrency(), 1);
  EXPECT_EQ(HostServices().ApiVersion(), kBackendApiVersion);
}

// A throwing body is a backend bug; the host keeps the exception on its side and says what was
// thrown, and every other chunk still runs.
TEST(HostServicesTest, ParallelForReportsWhatABodyThrew) {
  std::atomic<int> chunks{0};
  auto body = [](void* context, std::size_t begin, std::size_t) {
    static_cast<std::atomic<int>*>(context)->fetch_add(1);
    if (begin == 0)
      throw std::runtime_error("chunk 0 failed");
  };
  Status status = HostServices().ParallelFor(64, 1, body, &chunks);
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("a ParallelFor body threw: chunk 0 failed"));
  EXPECT_EQ(chunks.load(), 64);
  // The record does not leak into the next call.
  EXPECT_TRUE(HostServices()
                  .ParallelFor(
                      64, 1, [](void*, std::size_t, std::size_t) {}, nullptr)
                  .ok());
}

TEST(HostServicesTest, TaskGroupWaitsForEveryTaskAndReportsThrows) {
  std::atomic<int> ran{0};
  auto group = HostServices().CreateTaskGroup();
  for (int i = 0; i < 100; ++i)
    group->Run([](void* context) { static_cast<std::atomic<int>*>(context)->fetch_add(1); }, &ran);
  EXPECT_TRUE(group->Wait().ok());
  EXPECT_EQ(ran.load(), 100);

  group->Run([](void*) { throw std::logic_error("background task failed"); }, nullptr);
  Status status = group->Wait();
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("background task failed"));
  EXPECT_TRUE(group->Wait().ok());

  // Destroying a group waits for its tasks.
  group->Run([](void* context) { static_cast<std::atomic<int>*>(context)->fetch_add(1); }, &ran);
  group.reset();
  EXPECT_EQ(ran.load(), 101);
}

// SetHost is gated like every method added after 1.0: a backend built against 1.1 has no slot for
// it and must never be called there; it still loads and runs (serially, in this fixture).
TEST(HostServicesTest, OnlyBackendsOnApi12OrLaterAreGivenTheHost) {
  auto loader = Loader::Create().value();
  for (const auto& [name, expect_host] :
       {std::pair{"HostParallel", true}, std::pair{"HostParallelApi11", false}}) {
    auto generation = loader->Load(Fixture(name)).value();
    EXPECT_FALSE(generation->info().submits_tbb_tasks) << name;
    auto instance = loader->CreateInstance(generation).value();
    EXPECT_EQ(std::get<bool>(instance->GetOption("has_host").value()), expect_host) << name;
    auto workload = instance->CreateWorkload(IdentityOp(50000)).value();
    EXPECT_EQ(RunIdentity(*workload, 50000)[49999], 49999.0f) << name;
  }
}

// The point of IHost: a backend whose parallel work (kernels, and background work started at
// creation and finished in Shutdown) goes through the host unloads right after its waits return,
// with no grace period and no confinement. 1000 load/run/unload cycles; run under the tsan preset
// too, where a worker still in unmapped code is a crash.
TEST(HostServicesTest, BackendUsingTheHostLoadsRunsAndUnloads1000Times) {
  auto loader = Loader::Create().value();
  constexpr int kCycles = 1000;
  constexpr int64_t kElements = 65536;  // 16 chunks of 4096
  const auto start = std::chrono::steady_clock::now();
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    std::filesystem::path shadow;
    {
      auto generation = loader->Load(Fixture("HostParallel")).value();
      ASSERT_FALSE(generation->info().submits_tbb_tasks);
      shadow = generation->info().mapped_as;
      auto instance = loader->CreateInstance(generation).value();
      auto workload = instance->CreateWorkload(IdentityOp(kElements)).value();
      const auto out = RunIdentity(*workload, kElements);
      ASSERT_EQ(out[kElements - 1], static_cast<float>(kElements - 1)) << cycle;
    }
    loader->WaitForUnloads();
    ASSERT_FALSE(IsCodeMapped(shadow.string())) << cycle;
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(loader->stats().leaked.load(), 0u);
  EXPECT_EQ(loader->stats().unloaded.load(), static_cast<uint64_t>(kCycles));
  std::cout << kCycles << " load/run/unload cycles in "
            << std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count() << " ms\n";
}

}  // namespace
}  // namespace backplane::loader
