// The trust stage: content checked by the digest of the sealed copy, before anything of it is
// inspected or mapped (docs/operators.md, "Securing the backend directory").
#include "backplane/loader/trust.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <stdlib.h>

#include <functional>

#include "backplane/loader/digest.hpp"
#include "backplane/loader/loader.hpp"
#include "loader/loader_test_util.hpp"
#include "loader/signing_key.hpp"
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
  const std::string digest = testing::FileDigest(file);
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

  auto others = Allow({testing::FileDigest(Fixture("Valid"))});
  LoadTrace trace;
  auto refused = loader->Load(file, &trace, Loader::Reuse::kLiveUnchanged, others.get());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().reason(), LoadReason::kUntrusted);
  EXPECT_EQ(refused.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.error().message(),
            file.string() + ": its content (sha256 " + testing::FileDigest(file) +
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
  auto trusted = Allow({testing::FileDigest(file)});
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
  const std::string trusted_digest = testing::FileDigest(file);
  const fs::path swap = dir / ".swap";
  CopyFile(Fixture("ValidNext"), swap);
  const std::string swapped_digest = testing::FileDigest(swap);
  ASSERT_NE(trusted_digest, swapped_digest);

  auto loader = MakeLoader();
  PolicyWithSideEffect racing(Allow({trusted_digest}), [&] {
    std::error_code error;
    fs::rename(swap, file, error);  // the first check only
  });
  auto loaded = loader->Load(file, nullptr, Loader::Reuse::kNever, &racing);
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  EXPECT_FALSE(fs::exists(swap)) << "the swap did not happen during the check";
  EXPECT_EQ(loaded->info().sha256, trusted_digest);
  EXPECT_EQ(loaded->info().release, "1.2.3");  // Valid's, not ValidNext's 1.2.4
  auto mapped = loaded->image().Map();
  ASSERT_TRUE(mapped.ok());
  EXPECT_EQ(Sha256Of(mapped->span()), trusted_digest);

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

  auto trusted = Allow({testing::FileDigest(Fixture("Valid"))});
  auto shared =
      loader->Load(Fixture("Valid"), nullptr, Loader::Reuse::kLiveUnchanged, trusted.get());
  ASSERT_TRUE(shared.ok()) << shared.error().ToString();
  EXPECT_EQ(shared->info().number, open->info().number);
}

TEST(TrustTest, ListFileIsReReadWhenItChanges) {
  TempDir dir;
  const fs::path list_file = dir / "trusted.sha256";
  WriteFile(list_file, "# none yet\n");
  auto created = DigestAllowlist::FromFile(list_file);
  ASSERT_TRUE(created.ok()) << created.error().ToString();
  const auto list = created.share();
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
  const TrustSubject subject{"Test_Valid_backend.so",
                             {},
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

// ---- Signatures ---------------------------------------------------------------------------------

class SignatureTest : public ::testing::Test {
 protected:
  std::shared_ptr<SignaturePolicy> Keys(const std::vector<fs::path>& files) {
    auto policy = SignaturePolicy::FromKeyFiles(files);
    EXPECT_TRUE(policy.ok()) << policy.error().ToString();
    return policy.ok() ? std::move(policy).value() : nullptr;
  }
  // Deploys `fixture` as dir/Test_Valid_backend.so and loads it under `policy` in a new loader
  // (so that no verified digest is remembered from another test step).
  Result<GenerationLease> Deploy(std::string_view fixture, const TrustPolicy& policy) {
    CopyFile(Fixture(fixture), File());
    return MakeLoader()->Load(File(), nullptr, Loader::Reuse::kNever, &policy);
  }
  fs::path File() const { return dir_ / "Test_Valid_backend.so"; }
  fs::path Signature() const { return dir_ / "Test_Valid_backend.so.sig"; }

  TempDir dir_;
  TempDir keys_dir_;
  const fs::path ci_pem_ = keys_dir_ / "ci.pub";
  const fs::path next_pem_ = keys_dir_ / "ci-2027.pub";
  SigningKey ci_{ci_pem_};
  SigningKey next_{next_pem_};
};

TEST_F(SignatureTest, AGoodSignatureLoads) {
  ci_.Sign(Fixture("Valid"), Signature());
  auto loaded = Deploy("Valid", *Keys({ci_pem_}));
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  EXPECT_EQ(loaded->info().release, "1.2.3");
}

TEST_F(SignatureTest, AMissingSignatureIsUntrusted) {
  auto refused = Deploy("Valid", *Keys({ci_pem_}));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().reason(), LoadReason::kUntrusted);
  EXPECT_EQ(refused.error().message(),
            File().string() + ": its content (sha256 " + testing::FileDigest(Fixture("Valid")) +
                ") has no signature: cannot open signature " + Signature().string() +
                ": No such file or directory; publish the signature, a regular file, before the "
                "library (openssl pkeyutl -sign -rawin -inkey KEY -in FILE -out FILE.sig)");
}

TEST_F(SignatureTest, ABadSignatureIsUntrusted) {
  ci_.Sign(Fixture("Valid"), Signature());
  std::string damaged = testing::ReadFile(Signature());
  damaged[10] = static_cast<char>(damaged[10] ^ 0x01);
  WriteFile(Signature(), damaged);
  auto refused = Deploy("Valid", *Keys({ci_pem_}));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().reason(), LoadReason::kUntrusted);
  EXPECT_THAT(
      refused.error().message(),
      HasSubstr("has a signature, " + Signature().string() +
                ", that no trusted signing key verifies (1 signing key(s): " + ci_pem_.string() +
                "): signed by another key, for other content, or "
                "damaged"));

  WriteFile(Signature(), "short");
  refused = Deploy("Valid", *Keys({ci_pem_}));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message(),
              HasSubstr(Signature().string() + " is not an Ed25519 signature (64 bytes)"));
}

// The signature of one build does not vouch for another: it is checked over the bytes loaded.
TEST_F(SignatureTest, TheSignatureOfAnotherFileIsUntrusted) {
  ci_.Sign(Fixture("Valid"), Signature());
  auto refused = Deploy("ValidNext", *Keys({ci_pem_}));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().reason(), LoadReason::kUntrusted);
  EXPECT_THAT(refused.error().message(),
              HasSubstr("sha256 " + testing::FileDigest(Fixture("ValidNext"))));
  EXPECT_THAT(refused.error().message(), HasSubstr("that no trusted signing key verifies"));
}

// A versioned file published behind a link: the signature vouches for the file that is read, so
// it is the one beside the link's target, never one beside the link.
TEST_F(SignatureTest, ALinkIsTrustedByTheSignatureBesideTheFileItNames) {
  const fs::path real = dir_ / "Test_Valid_backend.so.1.2.3";
  const fs::path real_signature = real.string() + ".sig";
  CopyFile(Fixture("Valid"), real);
  fs::create_symlink(real.filename(), File());
  const auto keys = Keys({ci_pem_});
  ci_.Sign(Fixture("Valid"), Signature());
  auto refused = MakeLoader()->Load(File(), nullptr, Loader::Reuse::kNever, keys.get());
  ASSERT_FALSE(refused.ok()) << "trusted by a signature beside the link";
  EXPECT_EQ(refused.error().reason(), LoadReason::kUntrusted);
  EXPECT_THAT(refused.error().message(),
              HasSubstr("cannot open signature " + real_signature.string()));
  fs::remove(Signature());
  ci_.Sign(Fixture("Valid"), real_signature);
  auto loaded = MakeLoader()->Load(File(), nullptr, Loader::Reuse::kNever, keys.get());
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  EXPECT_EQ(loaded->info().real_path.filename(), real.filename());
}

TEST_F(SignatureTest, KeyRotationOldAndNewThenNewOnly) {
  const auto both = Keys({ci_pem_, next_pem_});
  ci_.Sign(Fixture("Valid"), Signature());
  EXPECT_TRUE(Deploy("Valid", *both).ok()) << "signed by the old key, both configured";
  next_.Sign(Fixture("Valid"), Signature());
  EXPECT_TRUE(Deploy("Valid", *both).ok()) << "signed by the new key, both configured";

  // The old key removed (a restart: keys are read once, with nothing verified yet).
  EXPECT_TRUE(Deploy("Valid", *Keys({next_pem_})).ok());
  ci_.Sign(Fixture("Valid"), Signature());
  auto retired = Deploy("Valid", *Keys({next_pem_}));
  ASSERT_FALSE(retired.ok()) << "signed by the retired key";
  EXPECT_EQ(retired.error().reason(), LoadReason::kUntrusted);
  EXPECT_THAT(retired.error().message(), HasSubstr("(1 signing key(s): " + next_pem_.string()));
}

// A rollback loads a private copy with no signature beside it: content verified once stays
// trusted for the policy's life.
TEST_F(SignatureTest, ContentVerifiedOnceStaysTrusted) {
  const auto policy = Keys({ci_pem_});
  ci_.Sign(Fixture("Valid"), Signature());
  ASSERT_TRUE(Deploy("Valid", *policy).ok());
  fs::remove(Signature());
  EXPECT_TRUE(Deploy("Valid", *policy).ok());
  EXPECT_FALSE(Deploy("ValidNext", *policy).ok());
}

TEST_F(SignatureTest, EitherTheListOrASignature) {
  const AnyOfTrust either({Allow({testing::FileDigest(Fixture("ValidNext"))}), Keys({ci_pem_})});
  EXPECT_TRUE(Deploy("ValidNext", either).ok()) << "on the list, unsigned";
  ci_.Sign(Fixture("Valid"), Signature());
  EXPECT_TRUE(Deploy("Valid", either).ok()) << "signed, not on the list";
  fs::remove(Signature());
  auto refused = Deploy("Offset", either);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().reason(), LoadReason::kUntrusted);
  EXPECT_THAT(refused.error().message(), HasSubstr("is not on the trusted backend list"));
  EXPECT_THAT(refused.error().message(), HasSubstr("; nor: "));
  EXPECT_THAT(refused.error().message(), HasSubstr("has no signature"));
}

TEST_F(SignatureTest, KeysMustBeEd25519PublicKeys) {
  WriteFile(keys_dir_ / "junk.pub", "not a key");
  auto junk = SignaturePolicy::FromKeyFiles({keys_dir_ / "junk.pub"});
  ASSERT_FALSE(junk.ok());
  EXPECT_THAT(junk.error().message(), HasSubstr("signing key " + (keys_dir_ / "junk.pub").string() +
                                                " is not a PEM public key"));
  auto missing = SignaturePolicy::FromKeyFiles({keys_dir_ / "absent.pub"});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.error().message(),
              HasSubstr("cannot open signing key " + (keys_dir_ / "absent.pub").string()));
}

}  // namespace
}  // namespace backplane::loader
