// Each backend id's lineage: where its code comes from, the generation it offers, and the
// generations it has had. Private to the registry.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/thread_annotations.hpp"
#include "backplane/registry/backend_registry.hpp"

namespace backplane::registry_detail {

using SteadyClock = std::chrono::steady_clock;

// What the change sequence needs to know about one lineage to decide what a file means for it.
struct LineageView {
  std::string id;
  bool is_static = false;
  loader::GenerationLease active;  // null: static, withdrawn, or never active
  std::filesystem::path file;      // the backend file family its generations come from
  std::optional<loader::FileIdentity> identity;  // of the file `active` was loaded from
  bool pinned = false;
  // A progressive rollout's candidate (null: none) and the identity of its file.
  loader::GenerationLease candidate;
  std::optional<loader::FileIdentity> candidate_identity;
  loader::GenerationLease baseline;  // the candidate's baseline; null: none

  bool offered() const { return is_static || active != nullptr; }
};

// An id and how to make an instance of it.
struct Offer {
  RegisteredBackend backend;
  StaticBackendFactory factory;  // static backends only
};

// Thread-safe: one short lock around every lineage; it is never held while backend code, file
// copies, logging or observers run. The transitions are the generation state machine:
//   loading -> active -> draining -> unloaded | leaked;  loading -> rejected;
//   loading -> candidate -> active (promoted) | rejected (rolled back);
//   loading -> baseline -> draining (its candidate promoted or dropped) -> unloaded | leaked.
// A baseline lives exactly as long as its candidate: whatever ends the candidate (promoted,
// retired, dropped, superseded, withdrawn) lets go of the baseline in the same call, so that no
// path can leave a stable build's second copy (and its worker) behind.
class LineageTable {
 public:
  LineageTable();
  ~LineageTable();

  // kAlreadyExists for a registered id.
  Status AddStatic(std::string id, StaticBackendFactory factory) BACKPLANE_EXCLUDES(mutex_);

  std::vector<std::string> OfferedIds() const BACKPLANE_EXCLUDES(mutex_);  // registration order
  std::optional<Offer> FindOffer(std::string_view id) const BACKPLANE_EXCLUDES(mutex_);
  std::optional<LineageView> ById(std::string_view id) const BACKPLANE_EXCLUDES(mutex_);
  std::optional<LineageView> ByFile(const std::filesystem::path& family) const
      BACKPLANE_EXCLUDES(mutex_);
  // Whether `generation` has a record in its id's lineage (whatever its state).
  bool Recorded(const loader::GenerationInfo& generation) const BACKPLANE_EXCLUDES(mutex_);
  // Ids offered from a backend file whose family is not in `present`: they were deleted.
  std::vector<std::string> ActiveIdsMissingFrom(
      const std::vector<std::filesystem::path>& present) const BACKPLANE_EXCLUDES(mutex_);

  // A new generation of `id` (a new id when unknown, following `family`) starts loading; a
  // candidate being promoted keeps its record. Returns the generation active now, null when none.
  loader::GenerationLease BeginLoading(const std::string& id, const std::filesystem::path& family,
                                       const loader::GenerationLease& next)
      BACKPLANE_EXCLUDES(mutex_);
  // `next` becomes active; the previous active generation drains. `identity` is the file's as
  // loaded (nullopt for a rollback, which keeps the lineage's file and identity).
  void Activate(const std::string& id, const loader::GenerationLease& next,
                std::optional<loader::FileIdentity> identity) BACKPLANE_EXCLUDES(mutex_);
  void Reject(const std::string& id, uint64_t generation, const Status& why)
      BACKPLANE_EXCLUDES(mutex_);
  // `next` (loading) becomes the id's candidate beside its active generation, with `baseline`
  // (loading, recorded by BeginLoading; null: none) as the arm it is judged against.
  void Propose(const std::string& id, const loader::GenerationLease& next,
               const loader::FileIdentity& identity, const loader::GenerationLease& baseline)
      BACKPLANE_EXCLUDES(mutex_);
  // The id has no candidate any more (the caller records why with Reject); its baseline drains.
  // Returns the candidate it had.
  loader::GenerationLease DropCandidate(const std::string& id) BACKPLANE_EXCLUDES(mutex_);
  // The id's candidate served its rollout and was promoted as another generation of the same
  // build (a sandboxed candidate, loaded again as configured): it drains as a replaced active
  // generation does, and so does its baseline. Returns the one it had.
  loader::GenerationLease RetireCandidate(const std::string& id) BACKPLANE_EXCLUDES(mutex_);
  // The id's file was deleted: no generation is offered any more. Returns the one that was.
  loader::GenerationLease Withdraw(const std::string& id) BACKPLANE_EXCLUDES(mutex_);
  // The reaper closed `generation`. nullopt when the registry never recorded it (a duplicate, an
  // unchanged reload); else how long it drained (nullopt when it never was active).
  std::optional<std::optional<double>> Unloaded(const loader::GenerationInfo& generation,
                                                bool leaked) BACKPLANE_EXCLUDES(mutex_);

  // kNotFound for an unknown id, kFailedPrecondition for a static one.
  Status SetPinned(std::string_view id, bool pinned) BACKPLANE_EXCLUDES(mutex_);
  // Remembers `identity` as seen while pinned; false when it was seen already.
  bool NotePinnedSeen(std::string_view id, const loader::FileIdentity& identity)
      BACKPLANE_EXCLUDES(mutex_);
  void ForgetPinnedSeen(std::string_view id) BACKPLANE_EXCLUDES(mutex_);

  void AddRejected(loader::RejectedFile rejected) BACKPLANE_EXCLUDES(mutex_);
  std::vector<loader::RejectedFile> Rejected() const BACKPLANE_EXCLUDES(mutex_);

  std::vector<BackendStatus> Describe() const BACKPLANE_EXCLUDES(mutex_);
  std::optional<BackendStatus> Describe(std::string_view id) const BACKPLANE_EXCLUDES(mutex_);

 private:
  class Lineage;
  Lineage* Find(std::string_view id) BACKPLANE_REQUIRES(mutex_);
  const Lineage* Find(std::string_view id) const BACKPLANE_REQUIRES(mutex_);
  BackendStatus DescribeLocked(const Lineage& lineage) const BACKPLANE_REQUIRES(mutex_);

  mutable Mutex mutex_;
  std::vector<std::unique_ptr<Lineage>> lineages_
      BACKPLANE_GUARDED_BY(mutex_);                                         // registration order
  std::deque<loader::RejectedFile> rejected_ BACKPLANE_GUARDED_BY(mutex_);  // bounded, oldest first
};

}  // namespace backplane::registry_detail
