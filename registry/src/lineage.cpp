#include "lineage.hpp"

#include <algorithm>
#include <cassert>
#include <utility>

namespace backplane::registry_detail {
namespace fs = std::filesystem;

namespace {

constexpr std::size_t kHistoryLimit = 16;   // generation records kept per id
constexpr std::size_t kRejectedLimit = 64;  // rejected files kept

}  // namespace

// One backend id. Only LineageTable touches it, under its lock.
class LineageTable::Lineage {
 public:
  // One generation as the lineage remembers it, after its lease may be long gone.
  struct Record {
    GenerationStatus status;
    std::weak_ptr<const loader::Generation> generation;
    std::optional<SteadyClock::time_point> deactivated_at;
  };

  std::string id;
  StaticBackendFactory factory;    // static backends only
  loader::GenerationLease active;  // what the id offers; null: static, withdrawn, never active
  fs::path file;                   // the backend file family its generations come from
  std::optional<loader::FileIdentity> identity;
  bool pinned = false;
  std::optional<loader::FileIdentity> pinned_seen;
  loader::GenerationLease candidate;  // a progressive rollout's; null: none
  std::optional<loader::FileIdentity> candidate_identity;
  loader::GenerationLease baseline;  // the candidate's; null: none
  std::deque<Record> history;        // newest first, bounded

  bool is_static() const { return factory != nullptr; }
  bool offered() const { return is_static() || active != nullptr; }

  LineageView View() const {
    return {id,        is_static(),        active,  file, identity, pinned,
            candidate, candidate_identity, baseline};
  }

  const Record* Find(uint64_t number) const {
    for (const auto& record : history) {
      if (record.status.generation == number)
        return &record;
    }
    return nullptr;
  }
  Record* Find(uint64_t number) { return const_cast<Record*>(std::as_const(*this).Find(number)); }

  void Add(Record record) {
    // One record per generation: a file designated again is a new generation with a new number
    // (the loader maps every load anew), never an old record brought back to life.
    assert(Find(record.status.generation) == nullptr);
    history.push_front(std::move(record));
    Prune();
  }

  // Forgets the oldest generations that are over (unloaded, leaked, or rejected and gone) while
  // there are more than the limit; a generation still draining is kept whatever its age.
  void Prune() {
    for (auto it = history.end(); history.size() > kHistoryLimit && it != history.begin();) {
      --it;
      const auto state = it->status.state;
      const bool over = state == GenerationState::kUnloaded || state == GenerationState::kLeaked ||
                        (state == GenerationState::kRejected && it->generation.expired());
      if (over)
        it = history.erase(it);
    }
  }

  // The candidate's baseline is let go of with it: it drains (its worker ends once the runtimes'
  // bindings on it are gone). Returned, so that the caller drops what may be its last lease after
  // the table's lock is released.
  [[nodiscard]] loader::GenerationLease ReleaseBaseline() {
    if (baseline == nullptr)
      return nullptr;
    if (Record* record = Find(baseline->info().number)) {
      record->status.state = GenerationState::kDraining;
      record->deactivated_at = SteadyClock::now();
    }
    return std::exchange(baseline, nullptr);
  }

  // The active generation stops being active (replaced or withdrawn): it drains.
  void Deactivate() {
    if (active == nullptr)
      return;
    if (Record* record = Find(active->info().number)) {
      record->status.state = GenerationState::kDraining;
      record->deactivated_at = SteadyClock::now();
    }
    active = nullptr;
  }
};

LineageTable::LineageTable() = default;
LineageTable::~LineageTable() = default;

LineageTable::Lineage* LineageTable::Find(std::string_view id) {
  for (auto& lineage : lineages_) {
    if (lineage->id == id)
      return lineage.get();
  }
  return nullptr;
}

const LineageTable::Lineage* LineageTable::Find(std::string_view id) const {
  for (const auto& lineage : lineages_) {
    if (lineage->id == id)
      return lineage.get();
  }
  return nullptr;
}

Status LineageTable::AddStatic(std::string id, StaticBackendFactory factory) {
  MutexLock lock(mutex_);
  if (Find(id) != nullptr)
    return {StatusCode::kAlreadyExists, "backend id " + id + " is already registered"};
  auto lineage = std::make_unique<Lineage>();
  lineage->id = std::move(id);
  lineage->factory = std::move(factory);
  lineages_.push_back(std::move(lineage));
  return Status::Ok();
}

std::vector<std::string> LineageTable::OfferedIds() const {
  MutexLock lock(mutex_);
  std::vector<std::string> ids;
  for (const auto& lineage : lineages_) {
    if (lineage->offered())
      ids.push_back(lineage->id);
  }
  return ids;
}

std::optional<Offer> LineageTable::FindOffer(std::string_view id) const {
  MutexLock lock(mutex_);
  const Lineage* lineage = Find(id);
  if (lineage == nullptr || !lineage->offered())
    return std::nullopt;
  return Offer{{lineage->id, lineage->active}, lineage->factory};
}

std::optional<LineageView> LineageTable::ById(std::string_view id) const {
  MutexLock lock(mutex_);
  const Lineage* lineage = Find(id);
  if (lineage == nullptr)
    return std::nullopt;
  return lineage->View();
}

std::optional<LineageView> LineageTable::ByFile(const fs::path& family) const {
  MutexLock lock(mutex_);
  for (const auto& lineage : lineages_) {
    if (!lineage->is_static() && lineage->file == family)
      return lineage->View();
  }
  return std::nullopt;
}

bool LineageTable::Recorded(const loader::GenerationInfo& generation) const {
  MutexLock lock(mutex_);
  const Lineage* lineage = Find(generation.backend_id);
  return lineage != nullptr && lineage->Find(generation.number) != nullptr;
}

std::vector<std::string> LineageTable::ActiveIdsMissingFrom(
    const std::vector<fs::path>& present) const {
  MutexLock lock(mutex_);
  std::vector<std::string> missing;
  for (const auto& lineage : lineages_) {
    if (lineage->active != nullptr && !lineage->file.empty() &&
        std::find(present.begin(), present.end(), lineage->file) == present.end())
      missing.push_back(lineage->id);
  }
  return missing;
}

loader::GenerationLease LineageTable::BeginLoading(const std::string& id, const fs::path& family,
                                                   const loader::GenerationLease& next) {
  const auto& info = next->info();
  MutexLock lock(mutex_);
  Lineage* lineage = Find(id);
  if (lineage == nullptr) {
    lineages_.push_back(std::make_unique<Lineage>());
    lineage = lineages_.back().get();
    lineage->id = id;
    lineage->file = family;
  }
  if (lineage->Find(info.number) != nullptr)  // a candidate being promoted
    return lineage->active;
  lineage->Add({.status = {.generation = info.number,
                           .state = GenerationState::kLoading,
                           .file = info.file,
                           .resolved_file = info.real_path,
                           .sha256 = info.sha256,
                           .release = info.release,
                           .api_version = info.api_version,
                           .build_id = info.build_id,
                           .runs_in = info.runs_in,
                           .loaded_at = info.loaded_at},
                .generation = next});
  return lineage->active;
}

void LineageTable::Activate(const std::string& id, const loader::GenerationLease& next,
                            std::optional<loader::FileIdentity> identity) {
  loader::GenerationLease released;  // after the lock
  MutexLock lock(mutex_);
  Lineage* lineage = Find(id);
  lineage->Deactivate();
  lineage->active = next;
  if (identity)
    lineage->identity = identity;
  lineage->pinned_seen.reset();
  if (lineage->candidate == next) {  // promoted
    lineage->candidate = nullptr;
    lineage->candidate_identity.reset();
    released = lineage->ReleaseBaseline();
  }
  if (Lineage::Record* record = lineage->Find(next->info().number))
    record->status.state = GenerationState::kActive;
}

void LineageTable::Reject(const std::string& id, uint64_t generation, const Status& why) {
  MutexLock lock(mutex_);
  if (Lineage* lineage = Find(id)) {
    if (Lineage::Record* record = lineage->Find(generation)) {
      record->status.state = GenerationState::kRejected;
      record->status.rejection = why;
    }
  }
}

void LineageTable::Propose(const std::string& id, const loader::GenerationLease& next,
                           const loader::FileIdentity& identity,
                           const loader::GenerationLease& baseline) {
  loader::GenerationLease released;  // after the lock
  MutexLock lock(mutex_);
  Lineage* lineage = Find(id);
  lineage->candidate = next;
  lineage->candidate_identity = identity;
  if (Lineage::Record* record = lineage->Find(next->info().number))
    record->status.state = GenerationState::kCandidate;
  released = lineage->ReleaseBaseline();  // a caller drops the candidate before; never two
  lineage->baseline = baseline;
  if (baseline == nullptr)
    return;
  if (Lineage::Record* record = lineage->Find(baseline->info().number))
    record->status.state = GenerationState::kBaseline;
}

loader::GenerationLease LineageTable::DropCandidate(const std::string& id) {
  loader::GenerationLease released;  // after the lock
  MutexLock lock(mutex_);
  Lineage* lineage = Find(id);
  if (lineage == nullptr)
    return nullptr;
  lineage->candidate_identity.reset();
  released = lineage->ReleaseBaseline();
  return std::exchange(lineage->candidate, nullptr);
}

loader::GenerationLease LineageTable::RetireCandidate(const std::string& id) {
  loader::GenerationLease released;  // after the lock
  MutexLock lock(mutex_);
  Lineage* lineage = Find(id);
  if (lineage == nullptr || lineage->candidate == nullptr)
    return nullptr;
  if (Lineage::Record* record = lineage->Find(lineage->candidate->info().number)) {
    record->status.state = GenerationState::kDraining;
    record->deactivated_at = SteadyClock::now();
  }
  lineage->candidate_identity.reset();
  released = lineage->ReleaseBaseline();
  return std::exchange(lineage->candidate, nullptr);
}

loader::GenerationLease LineageTable::Withdraw(const std::string& id) {
  MutexLock lock(mutex_);
  Lineage* lineage = Find(id);
  loader::GenerationLease leaving = lineage->active;
  lineage->Deactivate();
  lineage->identity.reset();
  return leaving;
}

std::optional<std::optional<double>> LineageTable::Unloaded(
    const loader::GenerationInfo& generation, bool leaked) {
  MutexLock lock(mutex_);
  Lineage* lineage = Find(generation.backend_id);
  Lineage::Record* record = lineage ? lineage->Find(generation.number) : nullptr;
  if (record == nullptr)
    return std::nullopt;
  std::optional<double> drain_ms;
  if (record->deactivated_at) {
    drain_ms =
        std::chrono::duration<double, std::milli>(SteadyClock::now() - *record->deactivated_at)
            .count();
    record->status.drain_ms = drain_ms;
  }
  if (record->status.state != GenerationState::kRejected)
    record->status.state = leaked ? GenerationState::kLeaked : GenerationState::kUnloaded;
  lineage->Prune();  // swaps faster than unloads leave the history long until they catch up
  return drain_ms;
}

Status LineageTable::SetPinned(std::string_view id, bool pinned) {
  MutexLock lock(mutex_);
  Lineage* lineage = Find(id);
  if (lineage == nullptr)
    return NotFound("no backend with id " + std::string(id) + " is registered");
  if (lineage->is_static()) {
    return FailedPrecondition("backend " + std::string(id) +
                              " is linked in (static): it has no generations to pin");
  }
  lineage->pinned = pinned;
  lineage->pinned_seen.reset();
  return Status::Ok();
}

bool LineageTable::NotePinnedSeen(std::string_view id, const loader::FileIdentity& identity) {
  MutexLock lock(mutex_);
  Lineage* lineage = Find(id);
  if (lineage == nullptr || lineage->pinned_seen == identity)
    return false;
  lineage->pinned_seen = identity;
  return true;
}

void LineageTable::ForgetPinnedSeen(std::string_view id) {
  MutexLock lock(mutex_);
  if (Lineage* lineage = Find(id))
    lineage->pinned_seen.reset();
}

void LineageTable::AddRejected(loader::RejectedFile rejected) {
  MutexLock lock(mutex_);
  rejected_.push_back(std::move(rejected));
  if (rejected_.size() > kRejectedLimit)
    rejected_.pop_front();
}

std::vector<loader::RejectedFile> LineageTable::Rejected() const {
  MutexLock lock(mutex_);
  return {rejected_.begin(), rejected_.end()};
}

BackendStatus LineageTable::DescribeLocked(const Lineage& lineage) const {
  BackendStatus status{
      .id = lineage.id,
      .is_static = lineage.is_static(),
      .active_generation = lineage.active ? lineage.active->info().number : 0,
      .candidate_generation = lineage.candidate ? lineage.candidate->info().number : 0,
      .baseline_generation = lineage.baseline ? lineage.baseline->info().number : 0,
      .pinned = lineage.pinned,
      .withdrawn = !lineage.offered() && !lineage.history.empty() &&
                   lineage.history.front().status.state != GenerationState::kRejected,
      .file = lineage.file};
  for (const auto& record : lineage.history) {
    GenerationStatus generation = record.status;
    generation.refcount = record.generation.use_count();
    status.generations.push_back(std::move(generation));
  }
  for (auto it = rejected_.rbegin(); it != rejected_.rend(); ++it) {
    if (it->backend_id == lineage.id)
      status.rejected.push_back(*it);
  }
  return status;
}

std::vector<BackendStatus> LineageTable::Describe() const {
  MutexLock lock(mutex_);
  std::vector<BackendStatus> statuses;
  for (const auto& lineage : lineages_)
    statuses.push_back(DescribeLocked(*lineage));
  return statuses;
}

std::optional<BackendStatus> LineageTable::Describe(std::string_view id) const {
  MutexLock lock(mutex_);
  const Lineage* lineage = Find(id);
  if (lineage == nullptr)
    return std::nullopt;
  return DescribeLocked(*lineage);
}

}  // namespace backplane::registry_detail
