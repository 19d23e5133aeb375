#include "backend_scan.hpp"

#include <algorithm>
#include <set>

#include "registry_log.hpp"

namespace backplane::registry_detail {
namespace fs = std::filesystem;

std::string FileFingerprint(const fs::path& path) {
  std::error_code error;
  const fs::path real_path = fs::canonical(path, error);
  const auto identity = loader::ReadFileIdentity(path);
  if (error || !identity)
    return "";
  return real_path.string() + "|" + std::to_string(identity->device) + ":" +
         std::to_string(identity->inode) + ":" + std::to_string(identity->size) + ":" +
         std::to_string(identity->mtime_ns) + ":" + std::to_string(identity->ctime_ns);
}

fs::path ResolvedFile(const Candidate& candidate) {
  // The identity after the last '|' holds none; the path before it may.
  const std::size_t bar = candidate.fingerprint.rfind('|');
  return bar == std::string::npos ? candidate.path : fs::path(candidate.fingerprint.substr(0, bar));
}

BackendScanner::BackendScanner(std::vector<fs::path> directories, loader::FilePolicy policy)
    : directories_(std::move(directories)), policy_(policy) {}

std::vector<Candidate> BackendScanner::Candidates(const loader::Discovery& discovery) {
  // Usable files and rejected names alike: a family whose speaking name is unusable (a FIFO or
  // an unsafe copy renamed over it) is a rejected deploy, not a deleted backend.
  std::vector<Candidate> candidates;
  for (const auto& file : discovery.files)
    candidates.push_back(
        {loader::BackendFamily(file.path), file.path, Status::Ok(), FileFingerprint(file.path)});
  for (const auto& rejected : discovery.rejected)
    candidates.push_back({loader::BackendFamily(rejected.file), rejected.file, rejected.error,
                          FileFingerprint(rejected.file)});
  return candidates;
}

Scan BackendScanner::ScanAll() const {
  const auto discovery = loader::DiscoverBackendFiles(directories_, policy_);
  std::set<fs::path> watch(directories_.begin(), directories_.end());
  for (const auto& file : discovery.files)
    watch.insert(file.real_path.parent_path());  // rule 7: where symlinks point is watched too
  return {Candidates(discovery), {watch.begin(), watch.end()}, discovery.misnamed};
}

std::optional<Candidate> BackendScanner::ScanFamily(const fs::path& family) const {
  const std::vector<fs::path> directory{family.parent_path()};
  for (auto& candidate : Candidates(loader::DiscoverBackendFiles(directory, policy_))) {
    if (candidate.family == family)
      return std::move(candidate);
  }
  return std::nullopt;
}

bool BackendScanner::RejectedAndUnchanged(const Candidate& candidate,
                                          uint64_t trust_revision) const {
  auto it = rejected_.find(candidate.path);
  return it != rejected_.end() && it->second.fingerprint == candidate.fingerprint &&
         it->second.before_opening == !candidate.unusable.ok() &&
         (!it->second.trust_revision || *it->second.trust_revision == trust_revision);
}

std::optional<Status> BackendScanner::RolledBackAndUnchanged(const Candidate& candidate) const {
  auto it = rejected_.find(candidate.path);
  if (it == rejected_.end() || it->second.fingerprint != candidate.fingerprint ||
      it->second.why.reason() != LoadReason::kRolledBack)
    return std::nullopt;
  return it->second.why;
}

void BackendScanner::RememberRejected(const Candidate& candidate,
                                      std::optional<uint64_t> trust_revision, Status why) {
  // Trap: the fingerprint of the listing, not one read now. A link re-pointed from a dangling
  // target to a good file while the rejection was being decided would otherwise be remembered as
  // rejected and never loaded (found by DeployModelTest). And when the name resolves differently
  // now than in the listing, the rejection may be about a state that is gone: nothing is
  // remembered, and the scan that the change brings decides again.
  std::erase_if(rejected_, [](const auto& entry) {
    std::error_code ignored;
    return !fs::exists(fs::symlink_status(entry.first, ignored));
  });
  if (FileFingerprint(candidate.path) != candidate.fingerprint) {
    rejected_.erase(candidate.path);
    return;
  }
  rejected_[candidate.path] = {candidate.fingerprint, !candidate.unusable.ok(), trust_revision,
                               std::move(why)};
}

void BackendScanner::ForgetRejected(const fs::path& file) {
  rejected_.erase(file);
}

BackendScanner::MisnamedNews BackendScanner::NotYetSaid(const std::vector<fs::path>& misnamed) {
  const std::set<fs::path> now(misnamed.begin(), misnamed.end());
  std::erase_if(said_misnamed_, [&now](const fs::path& file) { return !now.contains(file); });
  MisnamedNews news;
  std::set<fs::path> seen;
  for (const fs::path& file : now) {
    if (said_misnamed_.contains(file))
      continue;
    if (seen_misnamed_.contains(file)) {
      said_misnamed_.insert(file);
      news.to_say.push_back(file);
    } else {
      seen.insert(file);
      news.second_look_due = true;
    }
  }
  seen_misnamed_ = std::move(seen);
  return news;
}

}  // namespace backplane::registry_detail
