// The registry's memory of rejected names (registry/src/backend_scan.hpp, private): a rejection is
// reported once per version of a file, and must never silence a version it was not about. The
// races are staged by hand: the listing taken, the directory changed, then what the scan does
// with the stale listing. Nothing is loaded.
#include <gtest/gtest.h>

#include "backend_scan.hpp"
#include "test_util.hpp"

namespace backplane::registry_detail {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

class BackendScannerTest : public ::testing::Test {
 protected:
  // `ln -sfn target name`: a new symlink renamed over the old one, atomically.
  void Retarget(std::string_view name, std::string_view target) {
    const fs::path temporary = dir_ / ".incoming-link";
    fs::create_symlink(target, temporary);
    fs::rename(temporary, dir_ / name);
  }

  // The one family's candidate in a listing taken now.
  Candidate Listed() {
    Scan scan = scanner_.ScanAll();
    EXPECT_EQ(scan.candidates.size(), 1u);
    return scan.candidates.empty() ? Candidate{} : scan.candidates.front();
  }

  TempDir dir_;
  const fs::path speaking_ = dir_ / "Test_Valid_backend.so";
  BackendScanner scanner_{{dir_.path()}, loader::FilePolicy{}};
};

// The flake of DeployModelTest (seed 3814792992 on a loaded machine): `ln -sfn` moved the speaking
// name from a loop to a good file between the listing's verdict (unusable) and the fingerprint
// read after it. Remembered as a rejection of the good file's fingerprint, the next scan found the
// good file "rejected and unchanged" and never loaded it.
TEST_F(BackendScannerTest, ARejectedLoopNeverSilencesTheFileItsLinkWasMovedTo) {
  testing::WriteFile(dir_ / "Test_Valid_backend.so.1.0.0", "a good file, as far as names go");
  Retarget("Test_Valid_backend.so", "Test_Valid_backend.so");  // a loop: fails before opening
  const Candidate listed = Listed();
  ASSERT_FALSE(listed.unusable.ok());

  Retarget("Test_Valid_backend.so", "Test_Valid_backend.so.1.0.0");
  // What the scan held: the verdict of the listing, the fingerprint read just after the move.
  const Candidate raced{listed.family, listed.path, listed.unusable, FileFingerprint(speaking_)};
  scanner_.RememberRejected(raced);

  const Candidate next = Listed();
  ASSERT_TRUE(next.unusable.ok()) << next.unusable.ToString();
  EXPECT_FALSE(scanner_.RejectedAndUnchanged(next));
}

// A file rejected when it loaded, whose name was moved to another file before the rejection was
// remembered: the fingerprint of the listing describes a file that was never tried, and must not
// silence it when the name is moved back to it.
TEST_F(BackendScannerTest, ARejectionIsNotRememberedForAFileTheNameLeftMeanwhile) {
  testing::WriteFile(dir_ / "Test_Valid_backend.so.1.0.0", "the file listed");
  testing::WriteFile(dir_ / "Test_Valid_backend.so.1.0.1", "the file that failed to load");
  Retarget("Test_Valid_backend.so", "Test_Valid_backend.so.1.0.0");
  const Candidate listed = Listed();
  ASSERT_TRUE(listed.unusable.ok()) << listed.unusable.ToString();

  Retarget("Test_Valid_backend.so", "Test_Valid_backend.so.1.0.1");  // before the load
  scanner_.RememberRejected(listed);

  Retarget("Test_Valid_backend.so", "Test_Valid_backend.so.1.0.0");
  EXPECT_FALSE(scanner_.RejectedAndUnchanged(Listed()));
}

// What the memory is for: an unchanged rejected name is reported once, not at every scan.
TEST_F(BackendScannerTest, AnUnchangedRejectedNameStaysRejected) {
  Retarget("Test_Valid_backend.so", "Test_Valid_backend.so");
  scanner_.RememberRejected(Listed());
  EXPECT_TRUE(scanner_.RejectedAndUnchanged(Listed()));

  testing::WriteFile(dir_ / "Test_Valid_backend.so.1.0.0", "a file loaded and rejected");
  Retarget("Test_Valid_backend.so", "Test_Valid_backend.so.1.0.0");
  const Candidate loaded = Listed();
  ASSERT_TRUE(loaded.unusable.ok()) << loaded.unusable.ToString();
  EXPECT_FALSE(scanner_.RejectedAndUnchanged(loaded));
  scanner_.RememberRejected(loaded);
  EXPECT_TRUE(scanner_.RejectedAndUnchanged(Listed()));
}

}  // namespace
}  // namespace backplane::registry_detail
