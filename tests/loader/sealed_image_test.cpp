// The bytes checked are the bytes that run: a backend file is read once into a sealed memory
// copy, and the digest, the trust decision, the ELF checks and dlopen all read that copy
// (docs/operators.md, "Securing the backend directory"). Attacked here: writes to the copy, files
// swapped at every stage of a load, special files and sizes at the limit.
#include "backplane/loader/sealed_image.hpp"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <iostream>
#include <map>
#include <thread>

#include "backplane/loader/digest.hpp"
#include "backplane/loader/loader.hpp"
#include "backplane/loader/trust.hpp"
#include "loader/loader_test_util.hpp"
#include "loader/signing_key.hpp"
#include "loader/stalled_fuse.hpp"
#include "test_util.hpp"

namespace backplane::loader {
namespace {

namespace fs = std::filesystem;
using testing::CopyFile;
using testing::Fixture;
using ::testing::HasSubstr;
using testing::MakeLoader;
using testing::SigningKey;
using testing::TempDir;
using testing::WriteFile;

// The digest of what `image` holds now.
std::string DigestOfImage(const SealedImage& image) {
  auto bytes = image.Map();
  EXPECT_TRUE(bytes.ok()) << bytes.error().ToString();
  return bytes.ok() ? Sha256Of(bytes->span()) : "";
}

// Runs `call` on another thread and waits at most 10 s for it: a call that blocks fails the test
// instead of hanging it. `unblock` is run when it timed out, so that the thread can finish.
template <typename Call>
auto WithinDeadline(Call call, const std::function<void()>& unblock) {
  auto result = std::async(std::launch::async, std::move(call));
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked for 10 s";
    unblock();
  }
  return result.get();
}

// Opens the write end of the FIFO `path` without blocking, which releases a reader blocked in
// open(); closes it at once.
void ReleaseFifoReader(const fs::path& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_NONBLOCK);
  if (fd >= 0)
    close(fd);
}

TEST(SealedImageTest, HoldsTheFileAndNothingCanChangeIt) {
  TempDir dir;
  const fs::path file = dir / "Test_Valid_backend.so";
  CopyFile(Fixture("Valid"), file);
  auto image = SealedImage::Read(file, "backplane:test:Test_Valid_backend.so");
  ASSERT_TRUE(image.ok()) << image.error().ToString();
  const std::string digest = testing::FileDigest(file);
  EXPECT_EQ(DigestOfImage(image.value()), digest);
  EXPECT_EQ(image->size(), fs::file_size(file));
  EXPECT_EQ(image->maps_name(), "/memfd:backplane:test:Test_Valid_backend.so");

  // The published file changes: the copy does not.
  CopyFile(Fixture("ValidNext"), file);
  EXPECT_EQ(DigestOfImage(image.value()), digest);

  // Neither through its descriptor, nor by the path anyone can name it by, nor by a mapping.
  const char byte = 'x';
  EXPECT_EQ(pwrite(image->fd(), &byte, 1, 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(ftruncate(image->fd(), 0), -1);
  EXPECT_EQ(ftruncate(image->fd(), static_cast<off_t>(image->size()) + 1), -1);
  EXPECT_EQ(fcntl(image->fd(), F_ADD_SEALS, F_SEAL_SEAL), -1) << "the seals are sealed";
  const int reopened = open(image->ProcPath().c_str(), O_RDWR);
  if (reopened >= 0) {
    EXPECT_EQ(pwrite(reopened, &byte, 1, 0), -1);
    EXPECT_EQ(errno, EPERM);
    close(reopened);
  }
  void* writable = mmap(nullptr, image->size(), PROT_READ | PROT_WRITE, MAP_SHARED, image->fd(), 0);
  EXPECT_EQ(writable, MAP_FAILED);
  if (writable != MAP_FAILED)
    munmap(writable, image->size());
  EXPECT_EQ(DigestOfImage(image.value()), digest);
}

// A FIFO, a socket, a directory and a device where a backend file was, and a symlink put in
// place of a resolved path: refused at once, naming what it is. The FIFO would block open() for
// ever without O_NONBLOCK.
TEST(SealedImageTest, RefusesSpecialFilesWithoutBlocking) {
  TempDir dir;
  const fs::path fifo = dir / "Test_Fifo_backend.so";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const fs::path socket_path = dir / "Test_Socket_backend.so";
  const int listener = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof address.sun_path, "%s", socket_path.c_str());
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  const fs::path directory = dir / "Test_Directory_backend.so";
  fs::create_directory(directory);
  const fs::path link = dir / "Test_Link_backend.so";
  fs::create_symlink(Fixture("Valid"), link);

  const std::map<fs::path, std::string> expected = {
      {fifo, "is a FIFO"},
      {socket_path, ""},  // open() of a socket fails (ENXIO): refused as unreadable
      {directory, "is a directory"},
      {"/dev/null", "is a character device"},
      {link, "is a symlink"}};
  for (const auto& [path, why] : expected) {
    auto image = WithinDeadline([&] { return SealedImage::Read(path, "test"); },
                                [&] { ReleaseFifoReader(path); });
    ASSERT_FALSE(image.ok()) << path;
    EXPECT_THAT(image.error().message(), HasSubstr(path.string())) << path;
    if (why.empty()) {
      EXPECT_EQ(image.error().reason(), LoadReason::kIoError) << path;
    } else {
      EXPECT_EQ(image.error().reason(), LoadReason::kNotRegular) << path;
      EXPECT_THAT(image.error().message(), HasSubstr(why)) << path;
    }
  }
  close(listener);
}

// The size limit at its edge: exactly the limit is read, one byte more is refused before any
// byte is read, and so is a sparse file far larger than memory would like.
TEST(SealedImageTest, SizeLimitAtItsEdge) {
  TempDir dir;
  const fs::path file = dir / "Test_Valid_backend.so";
  CopyFile(Fixture("Valid"), file);
  const uint64_t size = fs::file_size(file);
  EXPECT_TRUE(SealedImage::Read(file, "test", size).ok());
  auto refused = SealedImage::Read(file, "test", size - 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().reason(), LoadReason::kTooLarge);
  EXPECT_EQ(refused.error().message(), file.string() + " is " + std::to_string(size) +
                                           " bytes, more than the largest backend file loaded (" +
                                           std::to_string(size - 1) + " bytes)");

  const fs::path sparse = dir / "Test_Sparse_backend.so";
  const int fd = open(sparse.c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(SealedImage::kDefaultMaxBytes) + 1), 0);
  close(fd);
  auto huge = SealedImage::Read(sparse, "test");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().reason(), LoadReason::kTooLarge);

  // Through the loader, by its option: the stage and the reason.
  auto loader = MakeLoader({.max_file_bytes = size - 1});
  LoadTrace trace;
  auto loaded = loader->Load(file, &trace);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().reason(), LoadReason::kTooLarge);
  EXPECT_EQ(trace.stages.back().name, "copy");
  EXPECT_TRUE(MakeLoader({.max_file_bytes = size})->Load(file).ok());
}

// A file whose reads never return (a stalled FUSE or network mount): the load fails at its
// deadline, and the read is abandoned on a thread of its own, so nothing the caller holds (the
// registry's change sequence) waits for the file system.
TEST(SealedImageTest, AReadThatNeverReturnsIsGivenUpAtItsDeadline) {
  testing::StalledFuse fuse("Test_Stalled_backend.so", 4096);
  if (!fuse.why_not().empty()) {
    if (testing::RunningInCi())
      FAIL() << fuse.why_not() << " (CI runs as root, with /dev/fuse)";
    GTEST_SKIP() << fuse.why_not();
  }
  const auto timeout = std::chrono::milliseconds(300);
  auto image = WithinDeadline(
      [&] {
        return SealedImage::Read(fuse.file(), "test", SealedImage::kDefaultMaxBytes, timeout);
      },
      [] {});
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.error().reason(), LoadReason::kIoError);
  EXPECT_EQ(image.error().message(),
            fuse.file().string() +
                " was not read within 0.3 s (a stalled network or FUSE file system?): the read "
                "is abandoned and the load refused");
  EXPECT_GE(fuse.stalled_reads(), 1) << "the file system was asked, and stalled";

  // Through the loader: the stage, and the reason.
  auto loader = MakeLoader({.read_timeout = timeout});
  LoadTrace trace;
  auto loaded = WithinDeadline([&] { return loader->Load(fuse.file(), &trace); }, [] {});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().reason(), LoadReason::kIoError);
  EXPECT_EQ(trace.stages.back().name, "copy");
}

TEST(SealedImageTest, TheGenerationMapsItsSealedCopyAndClosesItWhenUnloaded) {
  auto loader = MakeLoader();
  std::string mapped_as;
  std::string descriptor;
  {
    auto loaded = loader->Load(Fixture("Valid"));
    ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
    mapped_as = loaded->info().mapped_as;
    EXPECT_THAT(mapped_as, ::testing::MatchesRegex(
                               "/memfd:backplane:[0-9]+:Test_Valid_backend\\.so(\\.[0-9]+)*"));
    EXPECT_TRUE(testing::IsCodeMapped(mapped_as));
    EXPECT_EQ(DigestOfImage(loaded->image()), loaded->info().sha256);
    descriptor = loaded->image().ProcPath();
    EXPECT_EQ(fs::read_symlink(descriptor).string(), mapped_as + " (deleted)");
  }
  loader->WaitForUnloads();
  EXPECT_FALSE(testing::IsCodeMapped(mapped_as));
  // The descriptor is closed (or, reused since, names something else).
  std::error_code error;
  const fs::path now = fs::read_symlink(descriptor, error);
  EXPECT_TRUE(error || now.string() != mapped_as + " (deleted)") << now;
  EXPECT_EQ(loader->stats().unloaded.load(), 1u);
}

// ---- The race: files swapped at every stage of a load -------------------------------------------

// An attacker with the server's own user: can write the backend directory and the server's
// private directory, not the trusted list or the keys. At a chosen stage of each load (through
// the trace, which reports each stage before the next begins) it renames the untrusted build
// over the published file and over every file in the private directory, and a thread of its own
// keeps flipping the published file between the two builds all along.
class Attacker {
 public:
  Attacker(fs::path published, fs::path private_directory, fs::path staging)
      : published_(std::move(published)),
        private_directory_(std::move(private_directory)),
        staging_(std::move(staging)) {
    flipper_ = std::thread([this] { Flip(); });
  }
  ~Attacker() {
    stop_ = true;
    flipper_.join();
  }

  void Strike() {
    Swap(Fixture("ValidNext"), published_, "strike");
    std::error_code error;
    for (fs::recursive_directory_iterator it(private_directory_, error), end; !error && it != end;
         it.increment(error)) {
      if (it->is_regular_file())
        Swap(Fixture("ValidNext"), it->path(), "strike-private");
    }
  }

 private:
  void Flip() {
    for (uint64_t i = 0; !stop_; ++i)
      Swap(Fixture(i % 2 == 0 ? "ValidNext" : "Valid"), published_, "flip");
  }
  // Publishes `build` at `target` the atomic way (a new inode renamed into place).
  void Swap(const fs::path& build, const fs::path& target, std::string_view who) {
    const fs::path temporary = staging_ / (std::string(who) + ".tmp");
    std::error_code error;
    fs::copy_file(build, temporary, fs::copy_options::overwrite_existing, error);
    if (!error)
      fs::rename(temporary, target, error);
  }

  const fs::path published_;
  const fs::path private_directory_;
  const fs::path staging_;
  std::atomic<bool> stop_{false};
  std::thread flipper_;
};

// 1,000 loads under attack, with the trusted list and with signatures: no load ever runs the
// untrusted build, and every generation's digest on record is the digest of the bytes mapped.
// Before the sealed copy, the private copy was opened again by path after its digest: a swap after
// the digest, the ELF checks or the dependencies ran the untrusted build under the trusted digest
// (87 and 116 of 1,000 in two runs of this test ported to that code).
TEST(SealedImageRaceTest, NoUntrustedCodeLoadsWhateverIsSwappedAtAnyStage) {
  TempDir backends, staging, keys;
  const fs::path published = backends / "Test_Valid_backend.so";
  CopyFile(Fixture("Valid"), published);
  const std::string trusted = testing::FileDigest(Fixture("Valid"));
  const std::string untrusted = testing::FileDigest(Fixture("ValidNext"));
  ASSERT_NE(trusted, untrusted);

  auto list = DigestAllowlist::FromDigests({trusted});
  ASSERT_TRUE(list.ok());
  // The stages of an undisturbed load under a policy, each the moment of one attack.
  auto loader = MakeLoader();
  std::vector<std::string> stages;
  {
    LoadTrace trace;
    ASSERT_TRUE(loader->Load(published, &trace, Loader::Reuse::kNever, list.share().get()).ok());
    for (const LoadStage& stage : trace.stages)
      stages.push_back(stage.name);
  }
  ASSERT_THAT(stages, ::testing::IsSupersetOf({"copy", "digest", "trust", "elf", "dlopen"}));
  const fs::path key_file = keys / "ci.pub";
  const SigningKey key(key_file);
  key.Sign(Fixture("Valid"), published.string() + ".sig");
  auto signatures = SignaturePolicy::FromKeyFiles({key_file});
  ASSERT_TRUE(signatures.ok());
  const std::vector<std::pair<std::string, std::shared_ptr<const TrustPolicy>>> policies = {
      {"list", list.share()}, {"signature", signatures.share()}};

  constexpr int kAttempts = 1000;
  int loaded = 0;
  std::map<LoadReason, int> refused;
  {
    Attacker attacker(published, loader->shadow_directory().path(), staging.path());
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      const auto& [policy_name, policy] = policies[attempt % policies.size()];
      const std::string& target = stages[(attempt / policies.size()) % stages.size()];
      LoadTrace trace;
      trace.on_stage = [&](const LoadStage& stage) {
        if (stage.name == target)
          attacker.Strike();
      };
      auto result = loader->Load(published, &trace, Loader::Reuse::kNever, policy.get());
      const std::string where =
          "attempt " + std::to_string(attempt) + ", " + policy_name + ", swap after " + target;
      if (!result.ok()) {
        ++refused[result.error().reason().value_or(LoadReason::kIoError)];
        EXPECT_TRUE(result.error().reason() == LoadReason::kUntrusted ||
                    result.error().reason() == LoadReason::kFileChanged)
            << where << ": " << result.error().ToString();
        continue;
      }
      ++loaded;
      const GenerationLease generation = std::move(result).value();
      // The release comes from the code mapped: Valid says 1.2.3, ValidNext 1.2.4.
      ASSERT_EQ(generation->info().release, "1.2.3") << where << ": untrusted code runs";
      ASSERT_EQ(generation->info().sha256, trusted) << where;
      ASSERT_EQ(DigestOfImage(generation->image()), generation->info().sha256) << where;
    }
  }
  loader->WaitForUnloads();
  // Both outcomes happened: the attack really raced the loads.
  EXPECT_GT(loaded, 0);
  EXPECT_GT(refused[LoadReason::kUntrusted], 0);
  std::cout << "[ race ] " << kAttempts << " loads under attack: " << loaded
            << " loaded the trusted build, " << refused[LoadReason::kUntrusted]
            << " refused as untrusted, " << refused[LoadReason::kFileChanged]
            << " as changed while read, 0 ran untrusted code\n";
}

// ---- Special files beside a backend: signatures and the trusted list ----------------------------

TEST(SpecialFileTest, AFifoSignatureIsRefusedWithoutBlocking) {
  TempDir backends, key_dir;
  const fs::path published = backends / "Test_Valid_backend.so";
  CopyFile(Fixture("Valid"), published);
  const fs::path signature = published.string() + ".sig";
  ASSERT_EQ(mkfifo(signature.c_str(), 0600), 0);
  const fs::path key_file = key_dir / "ci.pub";
  const SigningKey key(key_file);
  auto keys = SignaturePolicy::FromKeyFiles({key_file});
  ASSERT_TRUE(keys.ok());
  const std::shared_ptr<SignaturePolicy> policy = std::move(keys).value();
  auto loader = MakeLoader();
  auto result = WithinDeadline(
      [&] { return loader->Load(published, nullptr, Loader::Reuse::kNever, policy.get()); },
      [&] { ReleaseFifoReader(signature); });
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kUntrusted);
  EXPECT_THAT(result.error().message(),
              HasSubstr("has no signature: signature " + signature.string() +
                        " is a FIFO, not a regular file"));

  // A symlink in its place is not followed (it could name a device).
  fs::remove(signature);
  key.Sign(Fixture("Valid"), backends / "elsewhere.sig");
  fs::create_symlink(backends / "elsewhere.sig", signature);
  auto linked = loader->Load(published, nullptr, Loader::Reuse::kNever, policy.get());
  ASSERT_FALSE(linked.ok());
  EXPECT_THAT(linked.error().message(),
              HasSubstr("signature " + signature.string() + " is a symlink"));
  // The same signature as a regular file: trusted.
  fs::remove(signature);
  fs::rename(backends / "elsewhere.sig", signature);
  EXPECT_TRUE(loader->Load(published, nullptr, Loader::Reuse::kNever, policy.get()).ok());
}

TEST(SpecialFileTest, AFifoTrustedListIsRefusedWithoutBlocking) {
  TempDir dir;
  const fs::path list_file = dir / "trusted.sha256";
  ASSERT_EQ(mkfifo(list_file.c_str(), 0600), 0);
  auto at_start = WithinDeadline([&] { return DigestAllowlist::FromFile(list_file); },
                                 [&] { ReleaseFifoReader(list_file); });
  ASSERT_FALSE(at_start.ok());
  EXPECT_THAT(at_start.error().message(), HasSubstr("trusted backend list " + list_file.string() +
                                                    " is a FIFO, not a regular file"));

  // A good list replaced by a FIFO later: fails closed, never blocks.
  fs::remove(list_file);
  const std::string digest = testing::FileDigest(Fixture("Valid"));
  WriteFile(list_file, digest + "  Test_Valid_backend.so\n");
  auto read = DigestAllowlist::FromFile(list_file);
  ASSERT_TRUE(read.ok()) << read.error().ToString();
  const std::shared_ptr<DigestAllowlist> list = std::move(read).value();
  EXPECT_TRUE(list->Contains(digest));
  fs::remove(list_file);
  ASSERT_EQ(mkfifo(list_file.c_str(), 0600), 0);
  const bool contains =
      WithinDeadline([&] { return list->Contains(digest); }, [&] { ReleaseFifoReader(list_file); });
  EXPECT_FALSE(contains);
}

}  // namespace
}  // namespace backplane::loader
