// The main of every GoogleTest binary. ctest runs one test per process (gtest_discover_tests) and
// learns that it skipped from the exit status this main gives, never from GoogleTest's
// "[  SKIPPED ]" line: with the line, ctest counts a test skipped whatever the process did after
// printing it, so a skipped test whose process then failed at exit (LeakSanitizer's report, a
// crash in a static destructor) passed. LeakSanitizer replaces the status when it reports, and a
// crash is a signal, so both now fail the test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  testing::InitGoogleMock(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  // Every selected test skipped, none failed: a run by hand of a whole binary that ran nothing.
  if (failed == 0 && unit.test_to_run_count() > 0 &&
      unit.skipped_test_count() == unit.test_to_run_count()) {
    return BACKPLANE_SKIPPED_EXIT_CODE;
  }
  return failed;
}
