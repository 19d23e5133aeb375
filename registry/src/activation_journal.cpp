#include "backplane/registry/activation_journal.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "backplane/core/thread_name.hpp"
#include "durable_file.hpp"
#include "registry_log.hpp"

namespace backplane {
namespace fs = std::filesystem;
using registry_detail::Log;

namespace {

// One line per record, tab-separated, between a header and a trailer that counts them, so that a
// file cut short or edited by hand reads as corrupt rather than as fewer suspects:
//   backplane-activations 1
//   <state> <backend id> <sha256> <generation> <activated_at, ms since the epoch> <file>
//   end <number of records>
constexpr std::string_view kHeader = "backplane-activations 1";
constexpr char kJournalName[] = "activations";
constexpr char kCorruptName[] = "activations.corrupt";
constexpr char kLockName[] = "lock";

int64_t ToMillis(std::chrono::system_clock::time_point time) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count();
}

// A path or id as one field: tabs and newlines would break the line format (a backend id cannot
// hold them; a path could), and the file name is only there for people.
std::string Field(std::string text) {
  std::replace_if(
      text.begin(), text.end(), [](char c) { return c == '\t' || c == '\n'; }, '?');
  return text;
}

std::string Render(const std::vector<ActivationRecord>& records) {
  std::string text = std::string(kHeader) + "\n";
  for (const auto& record : records) {
    text += std::string(ToString(record.state)) + "\t" + Field(record.backend_id) + "\t" +
            record.sha256 + "\t" + std::to_string(record.generation) + "\t" +
            std::to_string(ToMillis(record.activated_at)) + "\t" + Field(record.file.string()) +
            "\n";
  }
  return text + "end\t" + std::to_string(records.size()) + "\n";
}

std::vector<std::string> SplitTabs(const std::string& line) {
  std::vector<std::string> fields;
  std::size_t start = 0;
  for (std::size_t tab; (tab = line.find('\t', start)) != std::string::npos; start = tab + 1)
    fields.push_back(line.substr(start, tab - start));
  fields.push_back(line.substr(start));
  return fields;
}

template <typename Number>
bool ParseNumber(const std::string& text, Number& number) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  return error == std::errc() && end == text.data() + text.size() && !text.empty();
}

bool IsSha256(const std::string& text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

Result<std::vector<ActivationRecord>> Parse(const std::string& text, const fs::path& file) {
  const auto corrupt = [&](int line, const std::string& why) {
    return Status{StatusCode::kInvalidArgument,
                  file.string() + " line " + std::to_string(line) + ": " + why};
  };
  std::istringstream in(text);
  std::string line;
  int number = 1;
  if (!std::getline(in, line) || line != kHeader)
    return corrupt(number, "expected the header '" + std::string(kHeader) + "'");
  std::vector<ActivationRecord> records;
  while (std::getline(in, line)) {
    ++number;
    const auto fields = SplitTabs(line);
    if (fields.size() == 2 && fields[0] == "end") {
      std::size_t count = 0;
      if (!ParseNumber(fields[1], count) || count != records.size())
        return corrupt(number, "the trailer counts " + fields[1] + " records, the file holds " +
                                   std::to_string(records.size()));
      if (std::getline(in, line))
        return corrupt(number + 1, "text after the trailer");
      return records;
    }
    if (fields.size() != 6)
      return corrupt(number,
                     "expected 6 tab-separated fields, got " + std::to_string(fields.size()));
    ActivationRecord record;
    if (fields[0] == ToString(ActivationRecord::State::kProbation))
      record.state = ActivationRecord::State::kProbation;
    else if (fields[0] == ToString(ActivationRecord::State::kSuspected))
      record.state = ActivationRecord::State::kSuspected;
    else
      return corrupt(number, "unknown state '" + fields[0] + "'");
    record.backend_id = fields[1];
    record.sha256 = fields[2];
    int64_t millis = 0;
    if (record.backend_id.empty() || !IsSha256(record.sha256) ||
        !ParseNumber(fields[3], record.generation) || !ParseNumber(fields[4], millis)) {
      return corrupt(number, "a malformed id, sha256, generation or time");
    }
    record.activated_at = std::chrono::system_clock::time_point(std::chrono::milliseconds(millis));
    record.file = fields[5];
    records.push_back(std::move(record));
  }
  return corrupt(number, "the file ends before its trailer (cut short)");
}

// The journal at `file`: none when it does not exist, an error when it cannot be read or parsed.
Result<std::vector<ActivationRecord>> ReadJournal(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::error_code error;
    if (!fs::exists(file, error))
      return std::vector<ActivationRecord>{};
    return Status{StatusCode::kInvalidArgument, file.string() + " cannot be read"};
  }
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), file);
}

std::string Ago(std::chrono::system_clock::time_point then) {
  const auto seconds =
      std::chrono::duration<double>(std::chrono::system_clock::now() - then).count();
  return fmt::format("{:.1f} s ago", seconds);
}

}  // namespace

std::string_view ToString(ActivationRecord::State state) {
  return state == ActivationRecord::State::kProbation ? "probation" : "suspected";
}

ActivationJournalContents ReadActivationJournal(const fs::path& state_dir) {
  ActivationJournalContents contents;
  auto records = ReadJournal(state_dir / kJournalName);
  if (records.ok())
    contents.records = std::move(records).value();
  else
    contents.problem = std::move(records).error();
  // A shared lock is refused while a process holds the exclusive one.
  const int fd = open((state_dir / kLockName).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    contents.in_use = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);
  }
  return contents;
}

Result<std::unique_ptr<ActivationJournal>> ActivationJournal::Open(
    fs::path state_dir, std::chrono::milliseconds grace) {
  const auto refused = [&](const std::string& why) {
    return Status{StatusCode::kInvalidArgument, "state_dir " + state_dir.string() + ": " + why};
  };
  std::error_code error;
  fs::create_directories(state_dir, error);
  if (error)
    return refused("cannot create it: " + error.message());
  if (!fs::is_directory(state_dir, error))
    return refused("is not a directory");
  const fs::path lock = state_dir / kLockName;
  const int lock_fd = open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0)
    return refused("cannot create " + lock.string() + ": " + std::strerror(errno));
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int why = errno;
    close(lock_fd);
    if (why == EWOULDBLOCK) {
      return refused("in use by another process (it holds " + lock.string() +
                     "): give every server a state directory of its own");
    }
    return refused("cannot lock " + lock.string() + ": " + std::strerror(why));
  }

  const fs::path journal = state_dir / kJournalName;
  auto read = ReadJournal(journal);
  std::vector<ActivationRecord> records;
  if (read.ok()) {
    records = std::move(read).value();
  } else {
    // Never fatal: a journal nobody can read suspects nothing, and the server starts as it would
    // without one. Kept aside for whoever wants to know what it said.
    fs::rename(journal, state_dir / kCorruptName, error);
    Log().warn("crash journal ignored (nothing is suspected from it; kept as {}): {}",
               (state_dir / kCorruptName).string(), read.error().message());
  }
  for (auto& record : records) {
    if (record.state != ActivationRecord::State::kProbation)
      continue;
    record.state = ActivationRecord::State::kSuspected;
    // The grace of the process that died is not known here (the config may have changed since):
    // what is known is that the record was still on probation.
    Log().warn(
        "backend {}: SUSPECTED_CRASH: the previous process ended without a clean shutdown before "
        "generation {} from {} (sha256 {}, activated {}) had survived its crash grace: that "
        "content is not loaded again until another file is published or an operator reloads "
        "the backend",
        record.backend_id, record.generation, record.file.string(), record.sha256,
        Ago(record.activated_at));
  }
  // Written now, so that an unwritable directory stops the start rather than the first deploy,
  // and so that the suspects stay suspects if this process dies too.
  if (Status written = registry_detail::WriteFileDurably(journal, Render(records)); !written.ok()) {
    close(lock_fd);
    return refused(written.message());
  }
  return std::unique_ptr<ActivationJournal>(
      new ActivationJournal(std::move(state_dir), grace, lock_fd, std::move(records)));
}

ActivationJournal::ActivationJournal(fs::path directory, std::chrono::milliseconds grace,
                                     int lock_fd, std::vector<ActivationRecord> records)
    : directory_(std::move(directory)), grace_(grace), lock_fd_(lock_fd) {
  {
    MutexLock lock(mutex_);
    for (auto& record : records)
      entries_.push_back({std::move(record), {}});
  }
  timer_ = std::thread([this] {
    NameThisThread("bp-journal");
    RunTimer();
  });
}

ActivationJournal::~ActivationJournal() {
  EndCleanly();
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  timer_.join();
  close(lock_fd_);  // last: the next process may take the directory now
}

void ActivationJournal::RunTimer() {
  MutexLock lock(mutex_);
  while (!stopping_) {
    // The earliest end of a grace; none: wait for an activation.
    std::optional<std::chrono::steady_clock::time_point> next;
    for (const auto& entry : entries_) {
      if (entry.record.state == ActivationRecord::State::kProbation)
        next = next ? std::min(*next, entry.survives_at) : entry.survives_at;
    }
    if (!next) {
      wake_.wait(mutex_);
      continue;
    }
    if (std::chrono::steady_clock::now() < *next) {
      wake_.wait_until(mutex_, *next);
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(entries_, [&](const Entry& entry) {
      const bool survived =
          entry.record.state == ActivationRecord::State::kProbation && entry.survives_at <= now;
      if (survived) {
        Log().info("backend {} generation {} (sha256 {}) survived its crash grace of {} s",
                   entry.record.backend_id, entry.record.generation, entry.record.sha256,
                   grace_.count() / 1000.0);
      }
      return survived;
    });
    WriteLocked();
  }
}

void ActivationJournal::WriteLocked() {
  std::vector<ActivationRecord> records;
  for (const auto& entry : entries_)
    records.push_back(entry.record);
  if (Status written =
          registry_detail::WriteFileDurably(directory_ / kJournalName, Render(records));
      !written.ok()) {
    Log().error("crash journal not updated (a crash now is judged by its previous state): {}",
                written.message());
  }
}

std::optional<ActivationRecord> ActivationJournal::Suspected(std::string_view backend_id,
                                                             std::string_view sha256) const {
  MutexLock lock(mutex_);
  for (const auto& entry : entries_) {
    if (entry.record.state == ActivationRecord::State::kSuspected &&
        entry.record.backend_id == backend_id && entry.record.sha256 == sha256) {
      return entry.record;
    }
  }
  return std::nullopt;
}

void ActivationJournal::Activated(const std::string& backend_id, const std::string& sha256,
                                  const fs::path& file, uint64_t generation) {
  {
    MutexLock lock(mutex_);
    // A content activated again (a candidate promoted) starts its grace again: it takes more
    // requests than it did.
    std::erase_if(entries_, [&](const Entry& entry) {
      return entry.record.state == ActivationRecord::State::kProbation &&
             entry.record.backend_id == backend_id && entry.record.sha256 == sha256;
    });
    entries_.push_back({{ActivationRecord::State::kProbation, backend_id, sha256, file, generation,
                         std::chrono::system_clock::now()},
                        std::chrono::steady_clock::now() + grace_});
    // Durable before the generation takes its first request: the caller activates it after this.
    WriteLocked();
  }
  wake_.notify_all();
}

void ActivationJournal::Abandoned(std::string_view backend_id, std::string_view sha256) {
  MutexLock lock(mutex_);
  const auto dropped = std::erase_if(entries_, [&](const Entry& entry) {
    return entry.record.state == ActivationRecord::State::kProbation &&
           entry.record.backend_id == backend_id && entry.record.sha256 == sha256;
  });
  if (dropped != 0)
    WriteLocked();
}

std::vector<ActivationRecord> ActivationJournal::Forget(std::string_view backend_id) {
  MutexLock lock(mutex_);
  std::vector<ActivationRecord> dropped;
  std::erase_if(entries_, [&](const Entry& entry) {
    const bool drop = entry.record.state == ActivationRecord::State::kSuspected &&
                      entry.record.backend_id == backend_id;
    if (drop)
      dropped.push_back(entry.record);
    return drop;
  });
  if (!dropped.empty())
    WriteLocked();
  return dropped;
}

void ActivationJournal::EndCleanly() {
  MutexLock lock(mutex_);
  const auto before = entries_.size();
  std::erase_if(entries_, [](const Entry& entry) {
    return entry.record.state == ActivationRecord::State::kProbation;
  });
  if (entries_.size() != before)
    WriteLocked();
}

std::vector<ActivationRecord> ActivationJournal::Records() const {
  MutexLock lock(mutex_);
  std::vector<ActivationRecord> records;
  for (const auto& entry : entries_)
    records.push_back(entry.record);
  return records;
}

}  // namespace backplane
