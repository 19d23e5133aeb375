// The thread's backend call record (backend_call_record.hpp) as the loader keeps it: set around
// every call into backend code, with the generation's id, number, sha256 and file, cleared after,
// also when the call throws; and carried to the threads that run a backend's ParallelFor body.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>

#include "backplane/core/backend_call_record.hpp"
#include "backplane/loader/host_services.hpp"
#include "loader/loader_test_util.hpp"
#include "test_util.hpp"

namespace backplane::testing {
namespace {

using loader::MakeBackendInstance;
using loader::Reaper;

// What a backend call saw of its thread's record, copied (its strings are only lent).
struct SeenCall {
  std::string backend_id;
  uint64_t generation = 0;
  std::string call;
  std::string model;
};

std::optional<SeenCall> SeeCurrentCall() {
  const BackendCallSite* site = CurrentBackendCall();
  if (site == nullptr)
    return std::nullopt;
  return SeenCall{.backend_id = site->backend_id != nullptr ? site->backend_id : "",
                  .generation = site->generation,
                  .call = site->call != nullptr ? site->call : "",
                  .model = CurrentModel() != nullptr ? CurrentModel() : ""};
}

// Records what it sees of the record in Execute; throws from Execute when told.
class RecordingWorkload final : public IWorkload {
 public:
  RecordingWorkload(std::optional<SeenCall>& seen, bool throws) : seen_(seen), throws_(throws) {}
  Status Execute(std::span<const ConstTensorView>, std::span<const TensorView>) override {
    seen_ = SeeCurrentCall();
    if (throws_)
      throw std::runtime_error("Execute threw on purpose");
    return Status::Ok();
  }

 private:
  std::optional<SeenCall>& seen_;
  const bool throws_;
};

class RecordingBackend final : public IBackend {
 public:
  explicit RecordingBackend(std::optional<SeenCall>& seen, bool throws = false)
      : seen_(seen), throws_(throws) {}
  std::string_view GetId() const override { return "Recording"; }
  Status IsSupported(const OperatorDesc&) const override {
    seen_ = SeeCurrentCall();
    return Status::Ok();
  }
  Result<std::unique_ptr<IWorkload>> CreateWorkload(const OperatorDesc&) override {
    return std::unique_ptr<IWorkload>(std::make_unique<RecordingWorkload>(seen_, throws_));
  }

 private:
  std::optional<SeenCall>& seen_;
  const bool throws_;
};

TEST(BackendCallRecordTest, IsSetInsideEveryCallAndClearedAfter) {
  std::optional<SeenCall> seen;
  auto reaper = std::make_shared<Reaper>();
  auto instance =
      MakeBackendInstance("Recording", std::make_unique<RecordingBackend>(seen), nullptr, reaper);
  ASSERT_TRUE(instance->IsSupported(IdentityOp(4)).ok());
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->backend_id, "Recording");
  EXPECT_EQ(seen->generation, 0u);  // a static backend
  EXPECT_EQ(seen->call, "IBackend::IsSupported");
  EXPECT_EQ(CurrentBackendCall(), nullptr);

  auto workload = instance->CreateWorkload(IdentityOp(4));
  ASSERT_TRUE(workload.ok()) << workload.error().ToString();
  seen.reset();
  {
    const ScopedModelRun model("the model");
    ASSERT_TRUE(workload.value()->Execute({}, {}).ok());
  }
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->call, "IWorkload::Execute");
  EXPECT_EQ(seen->model, "the model");
  EXPECT_EQ(CurrentBackendCall(), nullptr);
  EXPECT_EQ(CurrentModel(), nullptr);
}

TEST(BackendCallRecordTest, IsClearedWhenTheCallThrows) {
  std::optional<SeenCall> seen;
  auto reaper = std::make_shared<Reaper>();
  auto instance = MakeBackendInstance(
      "Recording", std::make_unique<RecordingBackend>(seen, /*throws=*/true), nullptr, reaper);
  auto workload = instance->CreateWorkload(IdentityOp(4));
  ASSERT_TRUE(workload.ok()) << workload.error().ToString();
  Status status = workload.value()->Execute({}, {});
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("Execute threw on purpose"));
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->call, "IWorkload::Execute");
  EXPECT_EQ(CurrentBackendCall(), nullptr);
}

// A generation's calls carry its number, sha256 and resolved file: the strings of its
// GenerationInfo, which the instance's lease keeps alive.
TEST(BackendCallRecordTest, NamesTheGenerationItsCodeBelongsTo) {
  auto loader = MakeLoader();
  auto loaded = loader->Load(Fixture("Valid"));
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  const loader::GenerationLease generation = loaded.share();
  auto created = loader->CreateInstance(generation);
  ASSERT_TRUE(created.ok()) << created.error().ToString();
  const std::shared_ptr<loader::BackendInstance> instance = created.share();
  const loader::GenerationInfo& info = generation->info();
  const BackendCallSite site = instance->CallSite("IWorkload::Execute");
  EXPECT_STREQ(site.backend_id, "TestValid");
  EXPECT_EQ(site.generation, info.number);
  EXPECT_STREQ(site.sha256, FileDigest(Fixture("Valid")).c_str());
  EXPECT_STREQ(site.file, info.real_path.c_str());
  EXPECT_STREQ(site.call, "IWorkload::Execute");
}

// A backend's ParallelFor body is its code too, on whichever thread runs a chunk.
TEST(BackendCallRecordTest, GoesWithAParallelForBodyToEveryThreadThatRunsIt) {
  struct Seen {
    std::mutex mutex;
    std::set<std::thread::id> threads;
    std::vector<std::optional<SeenCall>> calls;
  } seen;
  auto body = [](void* context, std::size_t, std::size_t) {
    auto& seen = *static_cast<Seen*>(context);
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // let other threads take some
    std::lock_guard lock(seen.mutex);
    seen.threads.insert(std::this_thread::get_id());
    seen.calls.push_back(SeeCurrentCall());
  };
  const ScopedModelRun model("the model");
  const ScopedBackendCall call(BackendCallSite{.backend_id = "TestHostParallel",
                                               .generation = 5,
                                               .sha256 = "ab12",
                                               .file = "/x/Test_HostParallel_backend.so",
                                               .call = "IWorkload::Execute"});
  ASSERT_TRUE(loader::HostServices().ParallelFor(64, 1, body, &seen).ok());
  ASSERT_EQ(seen.calls.size(), 64u);
  for (const auto& chunk : seen.calls) {
    ASSERT_TRUE(chunk.has_value());
    EXPECT_EQ(chunk->backend_id, "TestHostParallel");
    EXPECT_EQ(chunk->generation, 5u);
    EXPECT_EQ(chunk->call, "a body given to IHost::ParallelFor");
    EXPECT_EQ(chunk->model, "the model");
  }
  EXPECT_STREQ(CurrentBackendCall()->call, "IWorkload::Execute");  // the caller's, restored
}

}  // namespace
}  // namespace backplane::testing
