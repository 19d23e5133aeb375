// The trust stage: content checked by the digest of the shadow copy, before anything of it is
// inspected or mapped (docs/operators.md, "Securing the backend directory").
#include "backplane/loader/trust.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <functional>

#include "backplane/loader/digest.hpp"
#include "backplane/loader/loader.hpp"
#include "loader/loader_test_util.hpp"
#include "test_util.hpp"

namespace backplane::loader {
namespace {

namespace fs = std::filesystem;
using testing::CopyFile;
using testing::Fixture;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WriteFile;

std::shared_ptr<Loader> MakeLoader() {
  auto loader = Loader::Create();
  EXPECT_TRUE(loader.ok()) << loader.error().ToString();
  return std::move(loader).value();
}

std::string DigestOf(const fs::path& file) {
  auto digest = Sha256OfFile(file);
  EXPECT_TRUE(digest.ok()) << digest.error().ToString();
  return digest.ok() ? digest.value() : "";
}

std::shared_ptr<DigestAllowlist> Allow(const std::vector<std::string>& digests) {
  auto list = DigestAllowlist::FromDigests(digests);
  EXPECT_TRUE(list.ok()) << list.error().ToString();
  return std::move(list).value();
}

// A policy that delegates, then runs `after` (the test's move against the file).
class PolicyWithSideEffect final : public TrustPolicy {
 public:
  PolicyWithSideEffect(std::shared_ptr<TrustPolicy> inner, std::function<void()> after)
      : inner_(std::move(inner)), after_(std::move(after)) {}
  Status Check(const TrustSubject& subject) const override {
    Status verdict = inner_->Check(subject);
    after_();
    return verdict;
  }
  uint64_t Revision() const override { return inner_->Revision(); }
  std::string Describe() const override { return inner_->Describe(); }

 private:
  std::shared_ptr<TrustPolicy> inner_;
  std::function<void()> after_;
};

const std::string kDigestA(64, 'a');
const std::string kDigestB = "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef";

TEST(TrustTest, ParsesSha256sumOutput) {
  const std::string text = "# CI builds, 2026-12-01\n\n" + kDigestA + "  Acme_Fast_backend.so\n" +
                           "\\" + kDigestB + "  odd\\\\name\n" + "  " + kDigestA +
                           " *binary-mode-name\r\n" + kDigestB + "\n";
  auto digests = ParseDigestList(text, "trusted.sha256");
  ASSERT_TRUE(digests.ok()) << digests.error().ToString();
  EXPECT_EQ(digests.value(), (std::set<std::string>{kDigestA,
                                                    "0123456789abcdef0123456789abcdef"
                                                    "0123456789abcdef0123456789abcdef"}));
}

TEST(TrustTest, MalformedListNamesTheLine) {
  auto digests = ParseDigestList(kDigestA + "  a\n# fine\nabc123  Acme_Fast_backend.so\n", "list");
  ASSERT_FALSE(digests.ok());
  EXPECT_EQ(digests.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(digests.error().message(),
              HasSubstr("list line 3: 'abc123' is not a SHA-256 digest: it has 6 characters"));

  auto not_hex = ParseDigestList(std::string(63, 'a') + "g  x\n", "list");
  ASSERT_FALSE(not_hex.ok());
  EXPECT_THAT(not_hex.error().message(), HasSubstr("line 1:"));
  EXPECT_THAT(not_hex.error().message(), HasSubstr("no hex digit ('g')"));

  auto listed = DigestAllowlist::FromDigests({kDigestA, "sha256:" + kDigestB});
  ASSERT_FALSE(listed.ok());
  EXPECT_THAT(listed.error().message(), HasSubstr("entry 1: 'sha256:0123"));
}

TEST(TrustTest, DigestLineReadsBackAndMatchesSha256sum) {
  const fs::path file = Fixture("Valid");
  const std::string digest = DigestOf(file);
  const std::string line = DigestLine(digest, file);
  EXPECT_EQ(line, digest + "  " + file.string());
  auto parsed = ParseDigestList(line + "\n", "line");
  ASSERT_TRUE(parsed.ok()) << parsed.error().ToString();
  EXPECT_EQ(parsed.value(), std::set<std::string>{digest});
  if (testing::HasCommand("sha256sum")) {
    const auto sha256sum = testing::RunCommand("sha256sum " + file.string());
    EXPECT_EQ(sha256sum.output, line + "\n");
  }
}

TEST(TrustTest, UntrustedContentNeverRunsNotEvenItsConstructors) {
  TempDir dir;
  const fs::path marker = dir / "constructor-ran";
  ASSERT_EQ(setenv("BACKPLANE_TEST_CONSTRUCTOR_MARKER", marker.c_str(), 1), 0);
  const fs::path file = Fixture("ConstructorMarker");
  auto loader = MakeLoader();

  auto others = Allow({DigestOf(Fixture("Valid"))});
  LoadTrace trace;
  auto refused = loader->Load(file, &trace, Loader::Reuse::kLiveUnchanged, others.get());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().reason(), LoadReason::kUntrusted);
  EXPECT_EQ(refused.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.error().message(),
            file.string() + ": its content (sha256 " + DigestOf(file) +
                ") is not on the trusted backend list (1 digest(s) given at start); if this "
                "build is trusted, add the line `backplane check --digest FILE` prints for it "
                "to the trusted list");
  // The stage right after the digest, and nothing after it: not even the ELF was read.
  ASSERT_GE(trace.stages.size(), 2u);
  EXPECT_EQ(trace.stages[trace.stages.size() - 2].name, "digest");
  EXPECT_EQ(trace.stages.back().name, "trust");
  EXPECT_FALSE(trace.stages.back().ok);
  EXPECT_EQ(testing::FindStage(trace, "dlopen"), nullptr);
  EXPECT_FALSE(fs::exists(marker)) << "the untrusted library's constructor ran";
  EXPECT_FALSE(testing::IsCodeMapped("ConstructorMarker"));

  // The same file trusted: its constructor runs (so the check above can fail).
  auto trusted = Allow({DigestOf(file)});
  LoadTrace loaded_trace;
  auto loaded = loader->Load(file, &loaded_trace, Loader::Reuse::kLiveUnchanged, trusted.get());
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  const LoadStage* stage = testing::FindStage(loaded_trace, "trust");
  ASSERT_NE(stage, nullptr);
  EXPECT_TRUE(stage->ok);
  EXPECT_EQ(stage->detail, "sha256 on 1 digest(s) given at start");
  EXPECT_TRUE(fs::exists(marker));
  unsetenv("BACKPLANE_TEST_CONSTRUCTOR_MARKER");
}

TEST(TrustTest, WithoutPolicyThereIsNoTrustStage) {
  auto loader = MakeLoader();
  LoadTrace trace;
  auto loaded = loader->Load(Fixture("Valid"), &trace);
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  EXPECT_EQ(testing::FindStage(trace, "trust"), nullptr);
}

// The check and the load see one content: the private copy. A file swapped after the copy was
// digested (here, while the policy decides) changes nothing that is mapped.
TEST(TrustTest, FileSwappedAfterTheDigestCannotPass) {
  TempDir dir;
  const fs::path file = dir / "Test_Valid_backend.so";
  CopyFile(Fixture("Valid"), file);
  const std::string trusted_digest = DigestOf(file);
  const fs::path swap = dir / ".swap";
  CopyFile(Fixture("ValidNext"), swap);
  const std::string swapped_digest = DigestOf(swap);
  ASSERT_NE(trusted_digest, swapped_digest);

  auto loader = MakeLoader();
  PolicyWithSideEffect racing(Allow({trusted_digest}), [&] {
    std::error_code error;
    fs::rename(swap, file, error);  // the first check only
  });
  auto loaded = loader->Load(file, nullptr, Loader::Reuse::kNever, &racing);
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  EXPECT_FALSE(fs::exists(swap)) << "the swap did not happen during the check";
  EXPECT_EQ(loaded.value()->info().sha256, trusted_digest);
  EXPECT_EQ(loaded.value()->info().release, "1.2.3");  // Valid's, not ValidNext's 1.2.4
  EXPECT_EQ(DigestOf(loaded.value()->info().shadow_path), trusted_digest);

  // The file now at the path is what the next load sees, and it is not trusted.
  auto again = loader->Load(file, nullptr, Loader::Reuse::kLiveUnchanged, &racing);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().reason(), LoadReason::kUntrusted);
  EXPECT_THAT(again.error().message(), HasSubstr("sha256 " + swapped_digest));
}

// A generation mapped for a caller without a policy is not handed to one whose policy refuses it.
TEST(TrustTest, SharedLiveGenerationIsCheckedToo) {
  auto loader = MakeLoader();
  auto open = loader->Load(Fixture("Valid"));
  ASSERT_TRUE(open.ok()) << open.error().ToString();
  auto strict = Allow({kDigestA});
  LoadTrace trace;
  auto refused =
      loader->Load(Fixture("Valid"), &trace, Loader::Reuse::kLiveUnchanged, strict.get());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().reason(), LoadReason::kUntrusted);
  EXPECT_EQ(testing::FindStage(trace, "cache"), nullptr);

  auto trusted = Allow({DigestOf(Fixture("Valid"))});
  auto shared =
      loader->Load(Fixture("Valid"), nullptr, Loader::Reuse::kLiveUnchanged, trusted.get());
  ASSERT_TRUE(shared.ok()) << shared.error().ToString();
  EXPECT_EQ(shared.value()->info().number, open.value()->info().number);
}

TEST(TrustTest, ListFileIsReReadWhenItChanges) {
  TempDir dir;
  const fs::path list_file = dir / "trusted.sha256";
  WriteFile(list_file, "# none yet\n");
  auto created = DigestAllowlist::FromFile(list_file);
  ASSERT_TRUE(created.ok()) << created.error().ToString();
  const auto& list = created.value();
  const uint64_t first = list->Revision();
  EXPECT_EQ(list->Revision(), first) << "unchanged file, new revision";
  EXPECT_FALSE(list->Contains(kDigestA));

  // Rewritten in place (same inode).
  WriteFile(list_file, kDigestA + "  Test_Valid_backend.so\n");
  const uint64_t second = list->Revision();
  EXPECT_NE(second, first);
  EXPECT_TRUE(list->Contains(kDigestA));
  EXPECT_EQ(list->Describe(), "1 digest(s) from " + list_file.string());

  // Replaced by rename, as editors and config management do.
  WriteFile(dir / ".new", kDigestB + "  x\n");
  fs::rename(dir / ".new", list_file);
  EXPECT_NE(list->Revision(), second);
  EXPECT_FALSE(list->Contains(kDigestA));
  EXPECT_TRUE(list->Contains(kDigestB));

  // Broken after a change: nothing is trusted (fails closed), and the check says why.
  WriteFile(list_file, kDigestB + "  x\nnot-a-digest\n");
  const TrustSubject subject{"Test_Valid_backend.so", "shadow",
                             "0123456789abcdef0123456789abcdef"
                             "0123456789abcdef0123456789abcdef"};
  Status verdict = list->Check(subject);
  EXPECT_EQ(verdict.reason(), LoadReason::kUntrusted);
  EXPECT_THAT(verdict.message(), HasSubstr("cannot be checked: " + list_file.string() +
                                           " line 2: 'not-a-digest' is not a SHA-256 digest"));
  EXPECT_THAT(verdict.message(), HasSubstr("so nothing is trusted"));

  // Removed: the same.
  fs::remove(list_file);
  verdict = list->Check(subject);
  EXPECT_EQ(verdict.reason(), LoadReason::kUntrusted);
  EXPECT_THAT(verdict.message(), HasSubstr("cannot open trusted backend list"));

  // Back and fixed.
  WriteFile(list_file, kDigestB + "  x\n");
  EXPECT_TRUE(list->Check(subject).ok());
}

TEST(TrustTest, ListFileMustBeReadableAtStart) {
  TempDir dir;
  auto missing = DigestAllowlist::FromFile(dir / "absent");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.error().message(),
              HasSubstr("cannot open trusted backend list " + (dir / "absent").string() +
                        ": No such file or directory"));
  // Writable by others: whoever can write it could trust their own build.
  WriteFile(dir / "open", kDigestA + "  x\n");
  fs::permissions(dir / "open", fs::perms(0666));
  auto open = DigestAllowlist::FromFile(dir / "open");
  ASSERT_FALSE(open.ok());
  EXPECT_THAT(open.error().message(), HasSubstr("trusted backend list: " + (dir / "open").string() +
                                                " is writable by others (mode "));
  WriteFile(dir / "bad", "zz  x\n");
  auto bad = DigestAllowlist::FromFile(dir / "bad");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.error().message(), HasSubstr((dir / "bad").string() + " line 1: 'zz'"));
}

}  // namespace
}  // namespace backplane::loader
