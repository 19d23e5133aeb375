// `backplane check [--json] FILE...`: would these backend files load, and if not, exactly why.
// `backplane check --digest FILE...`: the lines to add to a trusted backend list.
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
};

// Runs every loading stage on each file, each file in a child process so that a backend that
// crashes in its constructors is reported instead of taking `check` down. Prints one line per
// stage and a verdict per file (or a JSON array). Returns 0 when every file would load, else 1.
// With `digest`: 0 when every file's digest was printed, else 1.
int RunCheck(const CheckOptions& options);

}  // namespace backplane::server
