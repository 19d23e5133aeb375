// backplane: the command-line front end: `serve`, `check`, `run`.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/check_command.hpp"
#include "cli/run_command.hpp"
#include "cli/serve_command.hpp"
#include "config/server_config.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Backplane: inference backends that can be replaced while they serve"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  const auto log_levels =
      CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"});
  auto* top_log_level =
      app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical, off")
          ->check(log_levels);

  backplane::server::ServeOptions serve;
  std::string config_keys;
  for (const auto& line : backplane::server::DescribeConfigKeys())
    config_keys += "\n  " + line;
  auto* serve_command = app.add_subcommand(
      "serve",
      "Serve the models of a model repository over KServe v2 (HTTP/REST and gRPC), with the "
      "backend admin API "
      "and Prometheus metrics. With no arguments: the example repository on the build's "
      "backends, on 127.0.0.1:8000.");
  serve_command->footer("Config file keys (JSON object) and their defaults:" + config_keys +
                        "\nFlags override the config file; BACKPLANE_ADMIN_TOKEN sets "
                        "admin_token. See docs/operators.md.");
  serve_command->add_option("--config", serve.config_file, "JSON config file")
      ->check(CLI::ExistingFile);
  serve_command->add_option("--models", serve.models, "model repository directory");
  serve_command->add_option("--backends", serve.backends,
                            "backend directory (repeatable; default: the backend paths)");
  serve_command->add_option("--listen", serve.listen,
                            "HOST:PORT to listen on (default 127.0.0.1:8000; port 0: any free)");
  serve_command->add_option("--grpc-listen", serve.grpc_listen,
                            "HOST:PORT for KServe v2 gRPC (default 127.0.0.1:8001; port 0: any "
                            "free; off: no gRPC)");
  serve_command->add_option("--log-level", serve.log_level, "default: info")->check(log_levels);
  serve_command->add_option("--admin-token", serve.admin_token,
                            "bearer token required by mutating admin and repository calls");
  serve_command->add_flag("--check-config", serve.check_config,
                          "resolve the configuration (file, environment, flags), print it as "
                          "JSON and exit: 0 valid, 1 not; starts nothing");

  backplane::server::CheckOptions check;
  auto* check_command = app.add_subcommand(
      "check", "Say whether each backend file would load, stage by stage, and why not");
  check_command->add_option("FILE", check.files,
                            "backend files or directories (default: the backend paths)");
  check_command->add_flag("--json", check.json, "print a JSON array, one object per file");
  check_command->add_flag("--allow-unsafe-permissions", check.allow_unsafe_permissions,
                          "accept files writable by group/others or owned by another user");
  check_command
      ->add_option("--config", check.config,
                   "judge the files as `serve` with this config file would: its trust "
                   "policy, and its backend directories when no FILE is given")
      ->check(CLI::ExistingFile);
  check_command
      ->add_flag("--digest", check.digest,
                 "print each file's SHA-256 as sha256sum does (\"<hex>  <file>\"): the line to "
                 "add to trusted_backends_file; loads nothing")
      ->excludes("--json");

  backplane::server::RunOptions run;
  auto* run_command =
      app.add_subcommand("run", "Run an ONNX model on the backends and say where each layer ran");
  run_command->add_option("MODEL", run.model, "the model.onnx file")->required();
  run_command->add_option("--backends", run.backend_dirs,
                          "backend directory (repeatable; default: the backend paths)");
  run_command->add_option("--prefer", run.preferences, "backend ids, most preferred first")
      ->delimiter(',');
  auto* backend_option =
      run_command->add_option("--option", run.backend_options,
                              "ID.KEY=VALUE: a backend option set before the model loads, e.g. "
                              "CpuAcc.intra_op_threads=2 (repeatable)");
  backend_option->allow_extra_args(false);  // one value per --option: `--option X.k=v model.onnx`
  backend_option->check(CLI::Validator(
      [](std::string& text) {
        auto parsed = backplane::server::ParseBackendOptionText(text);
        return parsed.ok() ? std::string() : parsed.error().message();
      },
      "ID.KEY=VALUE"));
  run_command->add_option("--input", run.inputs,
                          "TensorProto file per graph input, in graph order (repeatable)");
  run_command->add_option("--output-dir", run.output_dir, "write output_N.pb files here");
  run_command->add_option("--test-data", run.test_data,
                          "ONNX test-data folder: run each test_data_set_* and compare outputs");
  run_command->add_option("--repeat", run.repeat, "runs per input set (timed)")
      ->check(CLI::Range(1, 1000000));
  run_command->get_option("--test-data")->excludes(run_command->get_option("--input"));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  // Logs go to stderr: stdout carries the command's own output (e.g. --json).
  spdlog::set_default_logger(spdlog::stderr_color_mt("backplane"));
  spdlog::set_level(spdlog::level::from_str(log_level));
  // Expected failures are statuses; this is the last line against the unexpected (e.g. a model
  // whose declared shapes ask for more memory than there is): a message and exit 1, not abort.
  try {
    if (serve_command->parsed()) {
      if (top_log_level->count() > 0)
        serve.inherited_log_level = log_level;
      return backplane::server::RunServe(serve);
    }
    if (check_command->parsed())
      return backplane::server::RunCheck(check);
    if (run_command->parsed())
      return backplane::server::RunModel(run);
  } catch (const std::exception& e) {
    std::cerr << "backplane: " << e.what() << "\n";
    return 1;
  }
  return 2;
}
