// What the backend directories hold, read the way the registry needs it: one candidate file per
// backend family. Private to the registry.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/loader/backend_file.hpp"

namespace backplane::registry_detail {

// The name that speaks for one backend family in a directory (see loader::DiscoverBackendFiles):
// every versioned name of a backend is one backend.
struct Candidate {
  std::filesystem::path family;  // <dir>/<vendor>_<name>_backend.so: what a lineage follows
  std::filesystem::path path;    // the chosen name (maybe a versioned name, maybe a symlink)
  Status unusable;  // why the chosen name fails the checks that need no opening; ok when it passes
  // What `path` resolved to when it was listed (FileFingerprint), so that a rejection is
  // remembered for the state that was tried: re-read later, it could already describe the fix.
  std::string fingerprint;
};

// The real file a path resolves to and that file's identity: any change of it (a link
// re-pointed, a file renamed over or rewritten) changes the fingerprint. Empty for nothing.
std::string FileFingerprint(const std::filesystem::path& path);
// The real file `candidate`'s name resolved to when it was listed (from its fingerprint): the
// versioned file behind a link, which a rejection names. Its path when the fingerprint is empty.
std::filesystem::path ResolvedFile(const Candidate& candidate);

struct Scan {
  std::vector<Candidate> candidates;  // one per family, in directory order, then name order
  // The backend directories and the directories their symlinks point into.
  std::vector<std::filesystem::path> watch_directories;
  // Files in the backend directories not named like a backend (see loader::Discovery::misnamed).
  std::vector<std::filesystem::path> misnamed;
};

// Thread-compatible: used in the registry's change sequence only.
class BackendScanner {
 public:
  BackendScanner(std::vector<std::filesystem::path> directories, loader::FilePolicy policy);

  Scan ScanAll() const;
  // The candidate of one family now (its directory need not be a backend directory); nullopt
  // when no name of it is left.
  std::optional<Candidate> ScanFamily(const std::filesystem::path& family) const;

  // A rejection is reported once per version of a file, not at every scan: whether the
  // candidate's name was rejected when it resolved as it does in this listing, and for the same
  // kind of reason (failing before it is opened, or failing to load).
  // A rejection remembered with a trust revision (an UNTRUSTED one) holds only while
  // `trust_revision` is that revision: a changed trusted list may admit the file now.
  bool RejectedAndUnchanged(const Candidate& candidate, uint64_t trust_revision = 0) const;
  // Remembers `candidate` as rejected, unless its name no longer resolves as the listing said
  // (then the change that moved it brings another scan, which decides again).
  // `why`: the refusal, kept to be told again (RolledBackAndUnchanged).
  void RememberRejected(const Candidate& candidate,
                        std::optional<uint64_t> trust_revision = std::nullopt,
                        Status why = Status::Ok());
  void ForgetRejected(const std::filesystem::path& file);
  // The refusal of `candidate` when it was rolled back (LoadReason::kRolledBack) in the state its
  // name resolves to now; nullopt otherwise. A rolled-back build stays refused until another file
  // is published, even to an operator's reload: rolling it out again is a new publish.
  std::optional<Status> RolledBackAndUnchanged(const Candidate& candidate) const;

  // A misnamed file is said once (at info), not at every scan, and only once a second scan in a
  // row still finds it: `ln -sfn` makes the new link under a temporary name and renames it over
  // the old, and a scan between the two must not warn about a name nobody chose. A file that
  // disappears is forgotten, so one put back is said again.
  struct MisnamedNews {
    std::vector<std::filesystem::path> to_say;
    bool second_look_due = false;  // some file waits for its second scan: rescan soon
  };
  MisnamedNews NotYetSaid(const std::vector<std::filesystem::path>& misnamed);

 private:
  static std::vector<Candidate> Candidates(const loader::Discovery& discovery);

  const std::vector<std::filesystem::path> directories_;
  const loader::FilePolicy policy_;
  // What a rejection was remembered for: the fingerprint, and whether the name failed before it
  // was opened. Trap: the verdict (in loader::DiscoverBackendFiles) and the fingerprint (read
  // after it) are two reads of the directory; a link re-pointed from a loop to a good file
  // between them pairs "unusable" with the good file's fingerprint. Remembered without its kind,
  // that silenced the good file for good: the next scan found it usable, "rejected and
  // unchanged", and never loaded it (DeployModelTest, seed 3814792992 on a loaded machine). A
  // name rejected before opening can only silence a name that still fails before opening, which
  // is a rejection either way.
  struct Rejection {
    std::string fingerprint;
    bool before_opening = false;
    std::optional<uint64_t> trust_revision;  // refused as untrusted under this revision
    Status why;
  };
  std::map<std::filesystem::path, Rejection> rejected_;
  std::set<std::filesystem::path> seen_misnamed_;  // by the last scan, not said yet
  std::set<std::filesystem::path> said_misnamed_;
};

}  // namespace backplane::registry_detail
