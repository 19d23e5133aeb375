// backplane: the command-line front end. `check` now; `run` and `serve` come with the networks and
// server work.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "check_command.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Backplane: inference backends that can be replaced while they serve"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));

  backplane::server::CheckOptions check;
  auto* check_command = app.add_subcommand(
      "check", "Say whether each backend file would load, stage by stage, and why not");
  check_command->add_option("FILE", check.files,
                            "backend files or directories (default: the backend paths)");
  check_command->add_flag("--json", check.json, "print a JSON array, one object per file");
  check_command->add_flag("--allow-unsafe-permissions", check.allow_unsafe_permissions,
                          "accept files writable by group/others or owned by another user");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  // Logs go to stderr: stdout carries the command's own output (e.g. --json).
  spdlog::set_default_logger(spdlog::stderr_color_mt("backplane"));
  spdlog::set_level(spdlog::level::from_str(log_level));
  if (check_command->parsed())
    return backplane::server::RunCheck(check);
  return 2;
}
