// DirectoryWatcher against real temporary directories and a real libuv loop. Every wait is a
// condition with a deadline; the few "nothing more happens" checks hold a condition for a while.
#include "backplane/watcher/directory_watcher.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_util.hpp"

namespace backplane::watcher {
namespace {

namespace fs = std::filesystem;
using backplane::testing::TempDir;
using backplane::testing::WriteFile;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Generous: sanitizer builds on a loaded 2-core machine are slow; a passing test returns early.
constexpr auto kDeadline = std::chrono::seconds(20);
// libuv's loop clock has millisecond resolution and truncates, so a timer may fire up to 1 ms
// before the wall-clock duration it was given.
constexpr auto kClockSlack = milliseconds(2);

// Waits until `condition` holds; false when the deadline passes first.
bool WaitFor(const std::function<bool()>& condition, Clock::duration deadline = kDeadline) {
  const auto until = Clock::now() + deadline;
  while (!condition()) {
    if (Clock::now() > until)
      return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

// True when `condition` holds during all of `period` (for "nothing more happens").
bool HoldsFor(const std::function<bool()>& condition, Clock::duration period) {
  const auto until = Clock::now() + period;
  while (Clock::now() < until) {
    if (!condition())
      return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return condition();
}

// Waits until no scan has started for `quiet` and returns the count then.
size_t WaitUntilSettled(const std::function<size_t()>& count, Clock::duration quiet) {
  size_t settled = count();
  EXPECT_TRUE(WaitFor([&] {
    settled = count();
    return HoldsFor([&] { return count() == settled; }, quiet);
  })) << "scans never stopped";
  return settled;
}

// The scan callback of the tests: records when each scan ran and what the listed directories
// held, and answers with whatever `respond` says. Thread-safe; outlives the watcher in each test.
class ScanProbe {
 public:
  struct Scan {
    Clock::time_point time;
    std::set<std::string> files;  // names in the listed directories at that time
  };

  explicit ScanProbe(std::vector<fs::path> listed = {}) : listed_(std::move(listed)) {}

  // `respond(index)` is called for scan number `index` (0-based) on the watcher thread.
  void SetResponder(std::function<ScanResult(size_t)> respond) {
    std::lock_guard lock(mutex_);
    respond_ = std::move(respond);
  }
  void SetListed(std::vector<fs::path> listed) {
    std::lock_guard lock(mutex_);
    listed_ = std::move(listed);
  }

  DirectoryWatcher::ScanCallback Callback() {
    return [this] { return OnScan(); };
  }

  size_t Count() const {
    std::lock_guard lock(mutex_);
    return scans_.size();
  }
  std::vector<Scan> Scans() const {
    std::lock_guard lock(mutex_);
    return scans_;
  }
  bool SawFile(const std::string& name) const {
    std::lock_guard lock(mutex_);
    for (const Scan& scan : scans_) {
      if (scan.files.contains(name))
        return true;
    }
    return false;
  }
  size_t MostFilesSeen() const {
    std::lock_guard lock(mutex_);
    size_t most = 0;
    for (const Scan& scan : scans_)
      most = std::max(most, scan.files.size());
    return most;
  }
  bool Overlapped() const { return overlapped_.load(); }

 private:
  ScanResult OnScan() {
    if (in_scan_.exchange(true))
      overlapped_ = true;
    Scan scan{.time = Clock::now()};
    std::function<ScanResult(size_t)> respond;
    size_t index;
    {
      std::lock_guard lock(mutex_);
      for (const fs::path& directory : listed_) {
        std::error_code error;
        for (fs::directory_iterator it(directory, error), end; !error && it != end;
             it.increment(error))
          scan.files.insert(it->path().filename().string());
      }
      index = scans_.size();
      scans_.push_back(std::move(scan));
      respond = respond_;
    }
    ScanResult result;
    try {
      if (respond)
        result = respond(index);
    } catch (...) {
      in_scan_ = false;
      throw;
    }
    in_scan_ = false;
    return result;
  }

  mutable std::mutex mutex_;
  std::vector<fs::path> listed_;
  std::function<ScanResult(size_t)> respond_;
  std::vector<Scan> scans_;
  std::atomic<bool> in_scan_{false};
  std::atomic<bool> overlapped_{false};
};

DirectoryWatcherOptions FastOptions(milliseconds debounce = milliseconds(50)) {
  return {
      .debounce = debounce, .rescan_interval = milliseconds(0), .poll_interval = milliseconds(100)};
}

std::unique_ptr<DirectoryWatcher> StartOrDie(std::vector<fs::path> directories, ScanProbe& probe,
                                             DirectoryWatcherOptions options) {
  auto started = DirectoryWatcher::Start(std::move(directories), probe.Callback(), options);
  if (!started.ok())
    throw std::runtime_error("DirectoryWatcher::Start failed: " + started.error().ToString());
  return std::move(started).value();
}

// A watched directory inside a fresh temporary directory, so that its parent is ours too.
struct WatchedDir {
  TempDir root;
  fs::path path = root / "backends";
  WatchedDir() { fs::create_directory(path); }
};

TEST(DirectoryWatcherTest, ScansOnceAtStart) {
  WatchedDir dir;
  WriteFile(dir.path / "acme_npu_backend.so", "x");
  ScanProbe probe({dir.path});
  auto watcher = StartOrDie({dir.path}, probe, FastOptions());

  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));
  EXPECT_TRUE(probe.SawFile("acme_npu_backend.so"));
  EXPECT_EQ(watcher->stats().polled.load(), 0u);
  EXPECT_TRUE(HoldsFor([&] { return probe.Count() == 1; }, milliseconds(150)));
}

TEST(DirectoryWatcherTest, CreatedFileLeadsToAScanAtOnce) {
  WatchedDir dir;
  ScanProbe probe({dir.path});
  // Long enough that a scan within half of it, the bound below, cannot be its timer even when a
  // loaded machine under a sanitizer delays the watcher's thread by a few hundred ms.
  const auto debounce = milliseconds(600);
  auto watcher = StartOrDie({dir.path}, probe, FastOptions(debounce));
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));

  const auto before_write = Clock::now();
  WriteFile(dir.path / "acme_npu_backend.so", "new version");

  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() >= 2; }));
  const auto scans = probe.Scans();
  EXPECT_LT(scans[1].time - before_write, debounce / 2) << "the scan waited for the debounce";
  EXPECT_TRUE(scans[1].files.contains("acme_npu_backend.so"));
  EXPECT_GE(watcher->stats().events.load(), 1u);
  // The write may land after the scan at the creation started: then one trailing scan follows.
  const size_t settled = WaitUntilSettled([&] { return probe.Count(); }, 2 * debounce);
  EXPECT_LE(settled, 3u) << "more than a leading and a trailing scan";
}

// The burst tests below: a writer copying a big file into a watched directory. The first event
// on the name scans at once (the scan defers a file still being written); the later ones wait
// until the writer has been quiet for the debounce. Those tests are timing tests by nature: when
// the machine stalls the writer or the watcher's thread for a debounce period, the name goes
// quiet mid-burst and a correct watcher scans. Each run therefore measures how long the watcher
// went without an event; a run where it went too long (or where the leading scan was late) is
// void and repeated, and only a run where the machine kept pace is judged.
constexpr auto kBurstDebounce = milliseconds(400);
// A leading scan within this of the event that opened the window cannot be the debounce timer,
// which fires a whole debounce period after the window's last event.
constexpr auto kLeadingBound = kBurstDebounce * 3 / 8;
// A run counts when the watcher never went this long without an event (measured from before one
// write to when the test saw the watcher count the next one's event: an upper bound of the real
// gap), nor the writer this long between its last write and the close.
constexpr auto kKeptPace = kBurstDebounce * 3 / 4;
constexpr int kBurstChunks = 60;
constexpr int kBurstAttempts = 5;

// One run of the burst, as the writer saw it.
struct Burst {
  Clock::time_point opened_taken;   // when the watcher had counted the open's event
  bool leading_in_time = false;     // a scan came within kLeadingBound of opened_taken
  Clock::time_point last_write;     // just before the last write's system call
  Clock::time_point closed;         // just after the file was closed
  Clock::duration longest_quiet{};  // the longest gap the watcher may have seen
  bool kept_pace = false;           // longest_quiet stayed below kKeptPace
};

// Opens `path` (created or truncated: an event either way) and writes kBurstChunks chunks of
// 4 KiB, one every 10 ms or once the watcher has counted the previous write's event, whichever
// is later: so no two write events merge in inotify's queue, and the gap between the events the
// watcher takes is known. After the open's event it waits (at most kLeadingBound) for the
// leading scan, so that the writes come after it. Stops early once a gap reaches kKeptPace.
Burst WriteBurst(const DirectoryWatcher& watcher, const ScanProbe& probe, const fs::path& path) {
  Burst burst;
  const auto events = [&] { return watcher.stats().events.load(); };
  // Waits until the watcher has counted an event beyond `before`. The watcher took the event
  // before it after `since` (the moment before that event's write), so the time from `since`
  // until the test sees the count bounds the gap between the two. False once that reaches
  // kKeptPace.
  const auto taken = [&](uint64_t before, Clock::time_point since) {
    const bool in_time =
        WaitFor([&] { return events() > before || Clock::now() - since >= kKeptPace; }) &&
        events() > before;
    burst.longest_quiet = std::max(burst.longest_quiet, Clock::now() - since);
    return in_time && burst.longest_quiet < kKeptPace;
  };

  const size_t scans_before = probe.Count();
  uint64_t before = events();
  Clock::time_point issued = Clock::now();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!taken(before, issued))  // the first event: no gap before it, only the watcher's delay
    return burst;
  burst.opened_taken = Clock::now();
  burst.leading_in_time = WaitFor([&] { return probe.Count() > scans_before; }, kLeadingBound);
  const std::string chunk(4096, 'x');
  for (int i = 0; i < kBurstChunks; ++i) {
    before = events();
    const Clock::time_point previous = issued;
    issued = Clock::now();
    out.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    out.flush();
    if (!taken(before, previous))
      return burst;
    std::this_thread::sleep_until(issued + milliseconds(10));
  }
  burst.last_write = issued;
  out.close();  // no event, but nothing after it either
  burst.closed = Clock::now();
  burst.longest_quiet = std::max(burst.longest_quiet, burst.closed - issued);
  burst.kept_pace = burst.longest_quiet < kKeptPace;
  return burst;
}

std::string Describe(const Burst& burst) {
  std::ostringstream text;
  text << "the watcher went up to "
       << std::chrono::duration_cast<milliseconds>(burst.longest_quiet).count()
       << " ms without an event (a run counts below " << kKeptPace.count() << " ms), "
       << (burst.leading_in_time ? "the leading scan came in time"
                                 : "no scan within " + std::to_string(kLeadingBound.count()) +
                                       " ms of the first event");
  return text.str();
}

// `existing`: the file is there before the watcher starts (overwritten in place, so that every
// event is a CHANGE), else it is created by the writer.
void ExpectOneScanAtOnceAndOneAfterTheBurst(bool existing) {
  std::vector<std::string> void_runs;
  for (int attempt = 1; attempt <= kBurstAttempts; ++attempt) {
    WatchedDir dir;
    const fs::path file = dir.path / "acme_npu_backend.so";
    if (existing)
      WriteFile(file, "old version");
    ScanProbe probe({dir.path});
    auto watcher = StartOrDie({dir.path}, probe, FastOptions(kBurstDebounce));
    ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));

    const Burst burst = WriteBurst(*watcher, probe, file);
    if (!burst.kept_pace || !burst.leading_in_time) {
      // A watcher that is never in time fails below, after the last attempt.
      void_runs.push_back("attempt " + std::to_string(attempt) + ": " + Describe(burst));
      std::cout << void_runs.back() << "; repeated\n";
      continue;
    }
    SCOPED_TRACE("attempt " + std::to_string(attempt) + ": " + Describe(burst));
    ASSERT_TRUE(WaitFor([&] { return probe.Count() >= 3; })) << "no scan after the burst";
    EXPECT_TRUE(HoldsFor([&] { return probe.Count() == 3; }, kBurstDebounce));
    const auto scans = probe.Scans();
    std::string times;
    for (const ScanProbe::Scan& scan : scans) {
      // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on " " + string.
      times += ' ';
      times += std::to_string(
          std::chrono::duration_cast<milliseconds>(scan.time - burst.opened_taken).count());
    }
    ASSERT_EQ(scans.size(), 3u)
        << "expected the initial, a leading and a trailing scan; scans at (ms after the first "
           "event, the last write at "
        << std::chrono::duration_cast<milliseconds>(burst.last_write - burst.opened_taken).count()
        << "):" << times;
    EXPECT_LT(scans[1].time, burst.last_write) << "the leading scan came after the burst";
    // With the watcher kept busy by events, any scan between these two was one too many: the
    // count above says there was none. The trailing scan waits a debounce period after the last
    // write, less a little: libuv stamps the events it reads after a poll with the poll's time,
    // and when the watcher ran behind, the writer's next write lands in that same read loop a few
    // ms after the stamp. A watcher that did not wait for the end of the burst scans hundreds of
    // ms earlier.
    EXPECT_GE(scans[2].time - burst.last_write, kBurstDebounce - kBurstDebounce / 8)
        << "the trailing scan did not wait for the writer to be quiet";
    EXPECT_GE(scans[2].time, burst.closed);
    EXPECT_EQ(watcher->stats().scans.load(), 3u);
    return;
  }
  std::string runs;
  for (const std::string& run : void_runs)
    runs.append("\n  ").append(run);
  FAIL() << "the machine stalled the writer or the watcher in every attempt, or the watcher never "
            "scanned at once:"
         << runs;
}

TEST(DirectoryWatcherTest, BurstOfWritesLeadsToOneScanAtOnceAndOneAfterItEnds) {
  ExpectOneScanAtOnceAndOneAfterTheBurst(/*existing=*/false);
}

TEST(DirectoryWatcherTest, OverwriteInPlaceLeadsToOneScanAtOnceAndOneAfterItEnds) {
  // `cp` over an existing file: truncated and rewritten in place, only CHANGE events.
  ExpectOneScanAtOnceAndOneAfterTheBurst(/*existing=*/true);
}

TEST(DirectoryWatcherTest, ThousandFilesCreatedAtOnceLeadToAFewScans) {
  WatchedDir dir;
  ScanProbe probe({dir.path});
  // Names still arriving postpone a scan by at most one debounce period, so that one endless
  // writer cannot starve the others; a burst lasting several periods thus gets a scan per period.
  // On a loaded machine or under a sanitizer 1000 creations take a second or two, hence the long
  // debounce here.
  const auto debounce = milliseconds(400);
  auto watcher = StartOrDie({dir.path}, probe, FastOptions(debounce));
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));

  constexpr size_t kFiles = 1000;
  const auto first_created = Clock::now();
  for (size_t i = 0; i < kFiles; ++i)
    WriteFile(dir.path / ("file" + std::to_string(i)), "x");
  // A loaded machine may stretch the creations over many debounce periods: each may have its
  // scan, and a few more come at the start and the end. A scan per name would be 1000.
  const auto periods = (Clock::now() - first_created) / debounce;

  ASSERT_TRUE(WaitFor([&] { return probe.MostFilesSeen() == kFiles; }));
  // Let the last quiet timers fire, then count.
  ASSERT_TRUE(WaitFor([&] {
    const size_t settled = probe.Count();
    return HoldsFor([&] { return probe.Count() == settled; }, 2 * debounce);
  }));
  const size_t scans_for_the_files = probe.Count() - 1;
  EXPECT_GE(scans_for_the_files, 1u);
  EXPECT_LT(scans_for_the_files, 10u + static_cast<size_t>(periods))
      << "the creations took " << periods << " debounce periods";
  EXPECT_GE(watcher->stats().events.load(), kFiles);
}

TEST(DirectoryWatcherTest, RenameIntoPlaceLeadsToAScan) {
  WatchedDir dir;
  ScanProbe probe({dir.path});
  auto watcher = StartOrDie({dir.path}, probe, FastOptions());
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));

  // The safe publish: write a temporary file elsewhere on the same file system (here: in the
  // watched directory's parent, whose other entries the watcher ignores), then rename it in.
  const fs::path staged = dir.root / "acme_npu_backend.so.tmp";
  WriteFile(staged, "new version");
  ASSERT_TRUE(HoldsFor([&] { return probe.Count() == 1; }, milliseconds(150)))
      << "a file next to the watched directory caused a scan";
  fs::rename(staged, dir.path / "acme_npu_backend.so");

  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 2; }));
  EXPECT_TRUE(probe.Scans()[1].files.contains("acme_npu_backend.so"));
}

TEST(DirectoryWatcherTest, FirstEventScansWithoutWaitingForTheDebounce) {
  WatchedDir dir;
  ScanProbe probe({dir.path});
  // A debounce far longer than the bound below: a scan within the bound cannot be its timer.
  auto watcher = StartOrDie({dir.path}, probe, FastOptions(std::chrono::seconds(2)));
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));

  // A rename publishes a complete file at once: the first event on it is worth a scan now.
  const fs::path staged = dir.root / "acme_npu_backend.so.tmp";
  WriteFile(staged, "new version");
  const auto renamed = Clock::now();
  fs::rename(staged, dir.path / "acme_npu_backend.so");

  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() >= 2; }));
  const auto scans = probe.Scans();
  // Half the debounce: no timer of it, and room for a loaded machine's delays.
  EXPECT_LT(scans[1].time - renamed, milliseconds(1000)) << "the scan waited for the debounce";
  EXPECT_TRUE(scans[1].files.contains("acme_npu_backend.so"));
}

TEST(DirectoryWatcherTest, EachRenameOntoANameScansAtOnce) {
  WatchedDir dir;
  ScanProbe probe({dir.path});
  auto watcher = StartOrDie({dir.path}, probe, FastOptions(std::chrono::seconds(2)));
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));

  // A deploy script publishing versions back to back, staged in the watched directory itself:
  // every rename falls into the windows the previous ones opened, and must not wait for them.
  const fs::path staged = dir.path / ".incoming";
  for (int version = 0; version < 5; ++version) {
    WriteFile(staged, "version " + std::to_string(version));
    const auto renamed = Clock::now();
    fs::rename(staged, dir.path / "acme_npu_backend.so");
    ASSERT_TRUE(WaitFor([&] {
      const auto scans = probe.Scans();
      return scans.back().time > renamed && !scans.back().files.contains(".incoming");
    })) << "version "
        << version;
    const auto scans = probe.Scans();
    EXPECT_LT(scans.back().time - renamed, milliseconds(1000))  // half the debounce
        << "version " << version << " waited for the debounce";
  }
}

TEST(DirectoryWatcherTest, RearmsADirectoryDeletedAndRecreated) {
  WatchedDir dir;
  WriteFile(dir.path / "old_backend.so", "x");
  ScanProbe probe({dir.path});
  auto watcher = StartOrDie({dir.path}, probe, FastOptions());
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));

  // Back to back, so the watcher sees both before it looks (on ext4 the new directory often
  // gets the old inode number).
  fs::remove_all(dir.path);
  fs::create_directory(dir.path);
  const auto recreated = Clock::now();

  ASSERT_TRUE(WaitFor([&] { return watcher->stats().rearms.load() >= 1; }));
  ASSERT_TRUE(WaitFor([&] {
    const auto scans = probe.Scans();
    return scans.back().time > recreated && watcher->stats().scans.load() == scans.size();
  }));
  EXPECT_EQ(watcher->stats().polled.load(), 0u);

  const uint64_t events_before = watcher->stats().events.load();
  WriteFile(dir.path / "new_backend.so", "x");
  ASSERT_TRUE(WaitFor([&] { return probe.SawFile("new_backend.so"); }));
  // The scan that saw it may be the one the re-arm asked for: wait for the event itself.
  EXPECT_TRUE(WaitFor([&] { return watcher->stats().events.load() > events_before; }))
      << "the new directory is not watched";
}

TEST(DirectoryWatcherTest, RearmsADirectoryRecreatedAfterItWasSeenMissing) {
  WatchedDir dir;
  ScanProbe probe({dir.path});
  DirectoryWatcherOptions options = FastOptions();
  options.poll_interval = std::chrono::seconds(60);  // the parent watch must find it, not a poll
  auto watcher = StartOrDie({dir.path}, probe, options);
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));

  fs::remove(dir.path);
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().polled.load() == 1; }));
  fs::create_directory(dir.path);
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().rearms.load() == 1; }));
  EXPECT_EQ(watcher->stats().polled.load(), 0u);

  const uint64_t events_before = watcher->stats().events.load();
  WriteFile(dir.path / "new_backend.so", "x");
  ASSERT_TRUE(WaitFor([&] { return probe.SawFile("new_backend.so"); }));
  // The scan that saw it may be the one the re-arm asked for: wait for the event itself.
  EXPECT_TRUE(WaitFor([&] { return watcher->stats().events.load() > events_before; }))
      << "the new directory is not watched";
}

TEST(DirectoryWatcherTest, DirectoryMissingAtStartIsWatchedOnceItAppears) {
  TempDir root;
  const fs::path missing = root / "backends";
  ScanProbe probe({missing});
  DirectoryWatcherOptions options = FastOptions();
  options.poll_interval = std::chrono::seconds(60);  // the parent watch must find it, not a poll
  auto watcher = StartOrDie({missing}, probe, options);
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));
  EXPECT_EQ(watcher->stats().polled.load(), 1u);

  fs::create_directory(missing);
  WriteFile(missing / "acme_npu_backend.so", "x");
  ASSERT_TRUE(WaitFor([&] { return probe.SawFile("acme_npu_backend.so"); }));
  EXPECT_EQ(watcher->stats().polled.load(), 0u);
  EXPECT_EQ(watcher->stats().rearms.load(), 0u) << "a first arm is not a re-arm";

  // Watched now, not merely found: a later file is seen through an event.
  const uint64_t events_before = watcher->stats().events.load();
  WriteFile(missing / "second_backend.so", "x");
  ASSERT_TRUE(WaitFor([&] { return probe.SawFile("second_backend.so"); }));
  EXPECT_GT(watcher->stats().events.load(), events_before);
}

TEST(DirectoryWatcherTest, DirectoryWhoseParentIsMissingTooIsFoundByPolling) {
  TempDir root;
  const fs::path missing = root / "not" / "yet" / "backends";
  ScanProbe probe({missing});
  auto watcher = StartOrDie({missing}, probe, FastOptions());  // polls every 100 ms
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));
  EXPECT_EQ(watcher->stats().polled.load(), 1u);

  fs::create_directories(missing);
  WriteFile(missing / "acme_npu_backend.so", "x");
  ASSERT_TRUE(WaitFor([&] { return probe.SawFile("acme_npu_backend.so"); }));
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().polled.load() == 0; }));
}

TEST(DirectoryWatcherTest, ScanNowFromOtherThreads) {
  WatchedDir dir;
  ScanProbe probe({dir.path});
  auto watcher = StartOrDie({dir.path}, probe, FastOptions(std::chrono::seconds(10)));
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));

  std::thread other([&] { watcher->ScanNow(); });
  other.join();
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 2; }));

  // Many at once: they coalesce, and scans never overlap.
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < 50; ++i)
        watcher->ScanNow();
    });
  }
  for (auto& caller : callers)
    caller.join();
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() >= 3; }));
  // The last request is always honoured.
  const size_t before = probe.Count();
  watcher->ScanNow();
  ASSERT_TRUE(WaitFor([&] { return probe.Count() > before; }));
  EXPECT_FALSE(probe.Overlapped());
}

TEST(DirectoryWatcherTest, RetrySoonScansAgainWithoutEvents) {
  WatchedDir dir;
  ScanProbe probe({dir.path});
  probe.SetResponder([](size_t index) { return ScanResult{.retry_soon = index == 0}; });
  const auto debounce = milliseconds(100);
  auto watcher = StartOrDie({dir.path}, probe, FastOptions(debounce));

  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 2; }));
  const auto scans = probe.Scans();
  EXPECT_GE(scans[1].time - scans[0].time, debounce - kClockSlack);
  EXPECT_EQ(watcher->stats().events.load(), 0u);
  EXPECT_TRUE(HoldsFor([&] { return probe.Count() == 2; }, 3 * debounce));
}

TEST(DirectoryWatcherTest, ScanResultReplacesTheWatchedDirectories) {
  TempDir root;
  const fs::path old_dir = root / "old";
  const fs::path new_dir = root / "new";
  fs::create_directory(old_dir);
  fs::create_directory(new_dir);
  ScanProbe probe({old_dir, new_dir});
  probe.SetResponder([&](size_t index) {
    return index == 0 ? ScanResult{.directories = {new_dir}} : ScanResult{};
  });
  const auto debounce = milliseconds(50);
  auto watcher = StartOrDie({old_dir}, probe, FastOptions(debounce));
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));

  WriteFile(new_dir / "in_new_backend.so", "x");
  ASSERT_TRUE(WaitFor([&] { return probe.SawFile("in_new_backend.so"); }));
  const size_t settled = WaitUntilSettled([&] { return probe.Count(); }, 3 * debounce);

  const uint64_t events_before = watcher->stats().events.load();
  WriteFile(old_dir / "in_old_backend.so", "x");
  EXPECT_TRUE(HoldsFor([&] { return probe.Count() == settled; }, 4 * debounce))
      << "an event in the directory no longer watched led to a scan";
  EXPECT_EQ(watcher->stats().events.load(), events_before);
}

TEST(DirectoryWatcherTest, ThrowingScanCallbackDoesNotStopTheWatcher) {
  WatchedDir dir;
  ScanProbe probe({dir.path});
  probe.SetResponder([](size_t index) -> ScanResult {
    if (index == 0)
      throw std::runtime_error("scan exploded");
    if (index == 1)
      throw 42;  // not even a std::exception
    return {};
  });
  auto watcher = StartOrDie({dir.path}, probe, FastOptions());
  ASSERT_TRUE(WaitFor([&] { return probe.Count() == 1; }));
  EXPECT_EQ(watcher->stats().scans.load(), 0u) << "a throwing scan counted as returned";

  watcher->ScanNow();
  ASSERT_TRUE(WaitFor([&] { return probe.Count() == 2; }));
  EXPECT_EQ(watcher->stats().scans.load(), 0u);

  WriteFile(dir.path / "acme_npu_backend.so", "x");
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));
  EXPECT_TRUE(probe.SawFile("acme_npu_backend.so"));
}

TEST(DirectoryWatcherTest, PeriodicRescanRunsWithoutEvents) {
  WatchedDir dir;
  ScanProbe probe({dir.path});
  DirectoryWatcherOptions options = FastOptions();
  options.rescan_interval = milliseconds(100);
  auto watcher = StartOrDie({dir.path}, probe, options);

  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() >= 3; }));
  const auto scans = probe.Scans();
  EXPECT_GE(scans[2].time - scans[1].time, options.rescan_interval - kClockSlack);
  EXPECT_EQ(watcher->stats().events.load(), 0u);
}

TEST(DirectoryWatcherTest, DestructorWithEventsPendingIsClean) {
  WatchedDir dir;
  ScanProbe probe({dir.path});
  auto watcher = StartOrDie({dir.path}, probe, FastOptions(std::chrono::seconds(30)));
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));

  for (int i = 0; i < 50; ++i)
    WriteFile(dir.path / ("file" + std::to_string(i)), "x");
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().events.load() >= 50; }));
  // The first names scan at once; the trailing scan is 30 s away.
  const size_t settled = WaitUntilSettled([&] { return probe.Count(); }, milliseconds(200));

  const auto before = Clock::now();
  watcher.reset();  // 50 quiet timers pending: each one closed and freed (ASan/valgrind check)
  EXPECT_LT(Clock::now() - before, std::chrono::seconds(5));
  EXPECT_EQ(probe.Count(), settled) << "a pending name led to a scan at shutdown";
}

TEST(DirectoryWatcherTest, DestructorWaitsForAScanInProgress) {
  WatchedDir dir;
  ScanProbe probe({dir.path});
  std::atomic<bool> scan_entered{false};
  std::atomic<bool> scan_finished{false};
  probe.SetResponder([&](size_t) {
    scan_entered = true;
    std::this_thread::sleep_for(milliseconds(200));
    scan_finished = true;
    return ScanResult{};
  });
  auto watcher = StartOrDie({dir.path}, probe, FastOptions());
  ASSERT_TRUE(WaitFor([&] { return scan_entered.load(); }));
  watcher.reset();
  EXPECT_TRUE(scan_finished.load());
}

TEST(DirectoryWatcherTest, StartsWithNoDirectoriesAndScansOnRequest) {
  ScanProbe probe;
  auto watcher = StartOrDie({}, probe, FastOptions());
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 1; }));
  watcher->ScanNow();
  ASSERT_TRUE(WaitFor([&] { return watcher->stats().scans.load() == 2; }));
  EXPECT_EQ(watcher->stats().polled.load(), 0u);
}

TEST(DirectoryWatcherTest, RejectsInvalidArguments) {
  auto no_callback = DirectoryWatcher::Start({}, nullptr);
  ASSERT_FALSE(no_callback.ok());
  EXPECT_EQ(no_callback.error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(no_callback.error().message(), "DirectoryWatcher::Start: the scan callback is empty");

  auto zero_poll =
      DirectoryWatcher::Start({}, [] { return ScanResult{}; }, {.poll_interval = milliseconds(0)});
  ASSERT_FALSE(zero_poll.ok());
  EXPECT_EQ(zero_poll.error().code(), StatusCode::kInvalidArgument);
}

TEST(DirectoryWatcherTest, ReportsAnErrorWhenTheLoopCannotBeCreated) {
  // A first watcher does libuv's process-wide one-time setup (which aborts rather than fail when
  // it finds no file descriptor), so that only the loop's own creation meets the limit below.
  ScanProbe probe;
  StartOrDie({}, probe, FastOptions()).reset();

  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit no_files = saved;
  no_files.rlim_cur = 0;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &no_files), 0);
  auto started = DirectoryWatcher::Start({}, [] { return ScanResult{}; });
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);

  ASSERT_FALSE(started.ok());
  EXPECT_EQ(started.error().code(), StatusCode::kInternal);
  EXPECT_EQ(started.error().message(),
            "DirectoryWatcher::Start: cannot create the libuv event loop: too many open files");
}

}  // namespace
}  // namespace backplane::watcher
