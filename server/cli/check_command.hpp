// `backplane check [--json] FILE...`: would these backend files load, and if not, exactly why.
// `backplane check --digest FILE...`: the lines to add to a trusted backend list.
// `backplane check --config FILE [FILE...]`: as that server would judge them (its trust policy;
// its backend directories when no file is named).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace backplane::server {

struct CheckOptions {
  std::vector<std::string> files;  // files or directories; empty: the default backend paths
  bool json = false;
  bool allow_unsafe_permissions = false;
  // Print one "<sha256>  <file>" line per backend file instead (sha256sum's format, what
  // trusted_backends_file takes), checking nothing else.
  bool digest = false;
  // A `serve` config file: its trust settings (trusted_backends, trusted_backends_file,
  // trusted_signing_keys) apply, as the server would apply them, and with no `files` its
  // backend directories are checked. Empty: no trust policy, the default backend paths.
  std::filesystem::path config;
};

// Runs every loading stage on each file, each file in a child process so that a backend that
// crashes in its constructors is reported instead of taking `check` down. Prints one line per
// stage and a verdict per file (or a JSON array). Returns 0 when every file would load, else 1.
// With `digest`: 0 when every file's digest was printed, else 1. A config that cannot be read or
// a trust policy that cannot be built: a message naming the key, and 1.
int RunCheck(const CheckOptions& options);

}  // namespace backplane::server
