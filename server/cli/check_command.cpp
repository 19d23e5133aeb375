#include "cli/check_command.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "backplane/loader/digest.hpp"
#include "backplane/loader/loader.hpp"
#include "backplane/loader/trust.hpp"
#include "backplane/registry/activation_journal.hpp"
#include "backplane/registry/backend_registry.hpp"
#include "config/server_config.hpp"

namespace backplane::server {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The verdict on one file.
struct FileReport {
  std::string file;
  std::vector<loader::LoadStage> stages;
  std::optional<LoadReason> reason;  // nullopt: would load
  std::string message;
  std::string id;
  std::string api_version;
  std::string release;
  std::string resolved_file;  // the real file the name resolved to
  std::string sha256;         // of the content loaded
};

// The stage that runs after `stage`, and the reason a crash in it is reported with.
std::pair<std::string, LoadReason> CrashedStageAfter(const std::string& stage) {
  static const std::vector<std::pair<std::string, std::pair<std::string, LoadReason>>> kNext = {
      {"", {"file", LoadReason::kIoError}},
      {"file", {"permissions", LoadReason::kIoError}},
      {"permissions", {"copy", LoadReason::kIoError}},
      {"copy", {"digest", LoadReason::kIoError}},
      {"digest", {"elf", LoadReason::kNotElf}},
      {"trust", {"elf", LoadReason::kNotElf}},
      {"elf", {"dependencies", LoadReason::kDlopenFailed}},
      {"build", {"dependencies", LoadReason::kDlopenFailed}},
      {"threads", {"dependencies", LoadReason::kDlopenFailed}},
      {"dependencies", {"dlopen", LoadReason::kDlopenFailed}},
      {"registries", {"dlopen", LoadReason::kDlopenFailed}},
      {"dlopen", {"entry points", LoadReason::kMissingEntryPoint}},
      {"entry points", {"id", LoadReason::kInvalidId}},
      {"id", {"version", LoadReason::kApiIncompatible}},
      {"version", {"factory", LoadReason::kFactoryFailed}},
      {"factory", {"instance", LoadReason::kFactoryFailed}},
      {"instance", {"unload", LoadReason::kNotUnloadable}},
  };
  for (const auto& [after, next] : kNext) {
    if (after == stage)
      return next;
  }
  return {"unload", LoadReason::kNotUnloadable};
}

// Loads `file` in a fresh loader, then does what a runtime does with it (an instance, its
// context, its options) and lets it go, checking that the code really leaves the process.
// Streams each stage as it ends, then the verdict, as JSON lines through `emit`.
void CheckStages(const std::string& file, bool allow_unsafe, const loader::TrustPolicy* trust,
                 const std::function<void(const json&)>& emit) {
  auto verdict_error = [&](std::string_view reason, const std::string& message) {
    emit({{"result", false}, {"reason", reason}, {"message", message}});
  };
  auto stage = [&](const std::string& name, bool ok, const std::string& detail,
                   bool warning = false) {
    emit({{"stage", name}, {"ok", ok}, {"detail", detail}, {"warning", warning}});
  };
  loader::LoaderOptions options;
  options.file_policy.allow_unsafe_permissions = allow_unsafe;
  auto created = loader::Loader::Create(options);
  if (!created.ok())
    return verdict_error(created.error().reason() ? created.error().name() : "IO_ERROR",
                         created.error().message());
  loader::Loader& host_loader = *created;

  loader::LoadTrace trace;
  trace.on_stage = [&](const loader::LoadStage& done) {
    stage(done.name, done.ok, done.detail, done.warning);
  };
  auto loaded = host_loader.Load(file, &trace, loader::Loader::Reuse::kLiveUnchanged, trust);
  if (!loaded.ok()) {
    return verdict_error(loaded.error().name(), loaded.error().message());
  }
  loader::GenerationLease generation = std::move(loaded).value();
  const loader::GenerationInfo info = generation->info();

  {
    auto instance = host_loader.CreateInstance(generation);
    if (!instance.ok()) {
      stage("instance", false, instance.error().message());
      return verdict_error(instance.error().name(), instance.error().message());
    }
    auto context = instance->CreateBackendContext();
    if (!context.ok()) {
      stage("instance", false, context.error().message());
      return verdict_error(context.error().reason() ? context.error().name() : "FACTORY_FAILED",
                           context.error().message());
    }
    std::string described;
    for (const auto& option : instance->DescribeOptions()) {
      described += (described.empty() ? "" : ", ") + option.name + " (" +
                   std::string(ToString(option.type)) + ")";
    }
    stage("instance", true,
          std::string(context.value() ? "with" : "without") +
              " a backend context; options: " + (described.empty() ? "none" : described));
  }

  generation.reset();  // the last lease: the reaper shuts down, dlcloses, verifies
  host_loader.WaitForUnloads();
  if (host_loader.stats().leaked.load() != 0) {
    const std::string message = file +
                                " stayed mapped after dlclose (verified with RTLD_NOLOAD): "
                                "glibc kept it, e.g. for a thread_local destructor still "
                                "registered or a unique symbol another library bound to";
    stage("unload", false, message);
    return verdict_error("NOT_UNLOADABLE", message);
  }
  stage("unload", true, "unmapped after dlclose, sealed copy closed");
  emit({{"result", true},
        {"id", info.backend_id},
        {"api_version",
         std::to_string(info.api_version.major) + "." + std::to_string(info.api_version.minor)},
        {"release", info.release},
        {"resolved_file", info.real_path.string()},
        {"sha256", info.sha256}});
}

// Child side of CheckFile: runs CheckStages, writing to `fd`, and exits without returning (no
// atexit handlers or static destructors of the parent's state).
[[noreturn]] void CheckInChild(const std::string& file, bool allow_unsafe,
                               const loader::TrustPolicy* trust, int fd) {
  CheckStages(file, allow_unsafe, trust, [fd](const json& line) {
    const std::string text = line.dump() + "\n";
    for (std::size_t done = 0; done < text.size();) {
      const ssize_t n = write(fd, text.data() + done, text.size() - done);
      if (n <= 0)
        _exit(3);
      done += static_cast<std::size_t>(n);
    }
  });
  std::fflush(nullptr);
  _exit(0);
}

FileReport CheckFile(const std::string& file, bool allow_unsafe, const loader::TrustPolicy* trust) {
  FileReport report{.file = file};
  int fds[2];
  if (pipe(fds) != 0) {
    report.reason = LoadReason::kIoError;
    report.message = std::string("cannot create a pipe: ") + std::strerror(errno);
    return report;
  }
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    CheckInChild(file, allow_unsafe, trust, fds[1]);
  }
  close(fds[1]);
  std::string output;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fds[0], buffer, sizeof buffer)) > 0)
    output.append(buffer, n);
  close(fds[0]);
  int status = 0;
  if (child > 0)
    waitpid(child, &status, 0);

  bool finished = false;
  std::size_t start = 0;
  while (start < output.size()) {
    const std::size_t end = output.find('\n', start);
    if (end == std::string::npos)
      break;
    const json line = json::parse(output.substr(start, end - start), nullptr, false);
    start = end + 1;
    if (line.is_discarded())
      continue;
    if (line.contains("stage")) {
      report.stages.push_back(
          {line["stage"], line["ok"], line["detail"], line.value("warning", false)});
    } else if (line.contains("result")) {
      finished = true;
      if (line["result"].get<bool>()) {
        report.id = line["id"];
        report.api_version = line["api_version"];
        report.release = line["release"];
        report.resolved_file = line.value("resolved_file", "");
        report.sha256 = line.value("sha256", "");
      } else {
        report.reason = ParseLoadReason(line["reason"].get<std::string>());
        report.message = line["message"];
      }
    }
  }
  if (child < 0 || !finished || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const std::string last = report.stages.empty() ? "" : report.stages.back().name;
    // A crash after the verdict was written happened while unloading.
    auto [stage, reason] = CrashedStageAfter(finished ? "instance" : last);
    std::string how = child < 0 ? std::string("could not fork: ") + std::strerror(errno)
                      : WIFSIGNALED(status)
                          ? std::string("killed by signal ") + strsignal(WTERMSIG(status))
                          : "exited with status " + std::to_string(WEXITSTATUS(status));
    report.reason = reason;
    report.message =
        file + ": the backend crashed the loading process in stage '" + stage + "' (" + how +
        (stage == "unload" ? "); a backend must finish all of its own work (threads, tasks, "
                             "callbacks) in Shutdown(), before its code is unmapped"
                           : "); a backend must not crash in its constructors, entry points, "
                             "factory or context");
    report.stages.push_back({stage, false, report.message});
  }
  return report;
}

// A file in a directory argument that is not checked, and why.
struct SkippedFile {
  std::string file;
  std::string reason;  // NAME_SCHEME or SUPERSEDED
  std::string message;
};

struct CheckList {
  std::vector<std::string> files;
  std::vector<SkippedFile> skipped;
};

// `arguments`, directories expanded; none: the backend directories `default_paths`.
// Which files of a backend family a directory argument gives.
enum class Versions {
  kServing,  // the name that speaks for the family: what a server would load now
  kEvery,    // every versioned file too: what a trust list must hold to allow a rollback
};

CheckList ExpandArguments(const std::vector<std::string>& arguments,
                          const std::vector<fs::path>& default_paths, Versions versions) {
  std::vector<fs::path> directories;
  std::vector<std::string> files;
  if (arguments.empty()) {
    for (const auto& path : default_paths) {
      std::error_code error;
      if (fs::is_directory(path, error))
        directories.push_back(path);
    }
  }
  for (const auto& argument : arguments) {
    std::error_code error;
    // A directory named like a backend file is a file argument (and gets NOT_REGULAR).
    if (fs::is_directory(argument, error) &&
        !loader::IsBackendFileName(fs::path(argument).filename().string())) {
      directories.emplace_back(argument);
    } else {
      files.push_back(argument);
    }
  }
  // A directory is read as the registry reads it: one entry per backend family.
  const auto discovery =
      loader::DiscoverBackendFiles(directories, {.allow_unsafe_permissions = true});
  for (const auto& file : discovery.files)
    files.push_back(file.path.string());
  for (const auto& rejected : discovery.rejected)
    files.push_back(rejected.file.string());
  // Not checked, as not loaded, and said so: a misnamed file is the commonest first mistake.
  std::vector<SkippedFile> skipped;
  for (const auto& misnamed : discovery.misnamed)
    skipped.push_back({misnamed.string(), "NAME_SCHEME", loader::MisnamedReason()});
  // Every versioned name of a backend is one backend.
  for (const auto& superseded : discovery.superseded) {
    if (versions == Versions::kEvery) {
      files.push_back(superseded.file.string());
      continue;
    }
    skipped.push_back({superseded.file.string(), "SUPERSEDED",
                       "a leftover: " + superseded.speaking.filename().string() +
                           " speaks for that backend (the least specific name), so this one "
                           "never serves; check it by name to check this version"});
  }
  return {std::move(files), std::move(skipped)};
}

void PrintText(const FileReport& report) {
  std::cout << report.file << "\n";
  for (const auto& stage : report.stages) {
    std::printf("  %-13s %-5s %s\n", stage.name.c_str(),
                !stage.ok       ? "FAIL"
                : stage.warning ? "WARN"
                                : "ok",
                stage.detail.c_str());
  }
  if (!report.reason) {
    const auto warnings = std::count_if(report.stages.begin(), report.stages.end(),
                                        [](const auto& stage) { return stage.warning; });
    std::cout << "  verdict: OK"
              << (warnings == 0 ? ""
                                : " with " + std::to_string(warnings) + " warning" +
                                      (warnings == 1 ? "" : "s"))
              << ", backend " << report.id << " (API " << report.api_version
              << (report.release.empty() ? "" : ", release " + report.release) << ")\n"
              << "  serves:  " << report.resolved_file << " sha256 " << report.sha256 << "\n";
  } else {
    std::cout << "  verdict: REJECTED " << ToString(*report.reason) << ": " << report.message
              << "\n";
  }
}

json ToJson(const FileReport& report) {
  json stages = json::array();
  for (const auto& stage : report.stages) {
    stages.push_back({{"stage", stage.name},
                      {"ok", stage.ok},
                      {"warning", stage.warning},
                      {"detail", stage.detail}});
  }
  const bool ok = !report.reason;
  return {
      {"file", report.file},
      {"ok", ok},
      {"id", report.id.empty() ? json(nullptr) : json(report.id)},
      {"api_version", report.api_version.empty() ? json(nullptr) : json(report.api_version)},
      {"release", report.release.empty() ? json(nullptr) : json(report.release)},
      {"resolved_file", report.resolved_file.empty() ? json(nullptr) : json(report.resolved_file)},
      {"sha256", report.sha256.empty() ? json(nullptr) : json(report.sha256)},
      {"stage", report.stages.empty() ? json(nullptr) : json(report.stages.back().name)},
      {"reason", ok ? json(nullptr) : json(ToString(*report.reason))},
      {"message", ok ? json("would load") : json(report.message)},
      {"stages", stages},
      {"skipped", false}};
}

json ToJson(const SkippedFile& skipped) {
  return {{"file", skipped.file},
          {"ok", nullptr},
          {"skipped", true},
          {"reason", skipped.reason},
          {"message", skipped.message},
          {"stages", json::array()}};
}

// What the state directory of `--config` suspects: its suspects, and, when no server holds the
// directory, the builds left on probation, which the next start turns into suspects.
std::vector<ActivationRecord> Suspects(const fs::path& state_dir, bool quiet) {
  const ActivationJournalContents contents = ReadActivationJournal(state_dir);
  if (!contents.problem.ok() && !quiet) {
    std::cout << "crash journal: " << contents.problem.message()
              << " (the server ignores it and suspects nothing)\n";
  }
  std::vector<ActivationRecord> suspects;
  for (const auto& record : contents.records) {
    if (record.state == ActivationRecord::State::kSuspected || !contents.in_use)
      suspects.push_back(record);
  }
  if (!quiet) {
    std::cout << "crash journal: " << state_dir.string() << ": " << suspects.size()
              << " build(s) suspected of a crash"
              << (contents.in_use ? " (a server holds the directory)" : "") << "\n";
  }
  return suspects;
}

void RefuseIfSuspected(FileReport& report, const std::vector<ActivationRecord>& suspects) {
  for (const auto& suspect : suspects) {
    if (suspect.backend_id != report.id || suspect.sha256 != report.sha256)
      continue;
    report.reason = LoadReason::kSuspectedCrash;
    report.message =
        report.file + " (sha256 " + report.sha256 + ") is suspected of a crash: the server that " +
        "activated it as generation " + std::to_string(suspect.generation) +
        " ended without a clean shutdown before it had survived crash_grace_s" +
        (suspect.state == ActivationRecord::State::kProbation
             ? " (no server holds the state directory: the next start suspects it)"
             : "") +
        "; the server does not load it until another file is published or an operator reloads "
        "backend " +
        suspect.backend_id;
    report.stages.push_back({"crash journal", false, report.message});
    return;
  }
}

}  // namespace

// `check --digest`: one sha256sum line per backend file, the line a trusted list takes: of a
// directory, every version of each backend, not only the one its main name designates, so that a
// list made from it also allows re-pointing a link back to an older version. Only the lines go
// to stdout, so that `backplane check --digest DIR >> trusted.sha256` is the whole job.
int PrintDigests(const CheckOptions& options) {
  const auto [files, skipped] =
      ExpandArguments(options.files, DefaultBackendPaths(), Versions::kEvery);
  for (const auto& file : skipped)
    std::cerr << "skipped " << file.file << ": " << file.message << "\n";
  if (files.empty()) {
    std::cerr << "backplane check: no backend files found"
              << (options.files.empty() ? " in the default backend paths" : "") << "\n";
    return 1;
  }
  bool all_ok = true;
  for (const auto& file : files) {
    // The content the file name leads to now, read as the loader reads it (through symlinks);
    // the loader checks the same digest on its private copy of those bytes.
    auto digest = loader::Sha256OfFile(file);
    if (!digest.ok()) {
      std::cerr << "backplane check: " << digest.error().message() << "\n";
      all_ok = false;
      continue;
    }
    std::cout << loader::DigestLine(digest.value(), file) << "\n";
  }
  return all_ok ? 0 : 1;
}

int RunCheck(const CheckOptions& options) {
  if (options.digest)
    return PrintDigests(options);
  std::vector<fs::path> backend_paths = DefaultBackendPaths();
  std::shared_ptr<const loader::TrustPolicy> trust;
  std::vector<ActivationRecord> suspects;
  if (!options.config.empty()) {
    ServeConfig config = DefaultServeConfig();
    Status applied = ApplyConfigFile(options.config, config);
    auto made = applied.ok() ? MakeTrustPolicy(config)
                             : Result<std::shared_ptr<const loader::TrustPolicy>>(applied);
    if (!made.ok()) {
      std::cerr << "backplane check: " << made.error().message() << "\n";
      return 1;
    }
    trust = std::move(made).value();
    backend_paths = config.backends.value_or(backend_paths);
    if (!config.state_dir.empty())
      suspects = Suspects(config.state_dir, options.json);
    if (!options.json) {
      std::cout << "trust: "
                << (trust ? trust->Describe() : "any content (the config sets no trust policy)")
                << " (" << options.config.string() << ")\n";
    }
  }
  const auto [files, skipped] = ExpandArguments(options.files, backend_paths, Versions::kServing);
  if (!options.json) {
    for (const auto& file : skipped)
      std::cout << "skipped " << file.file << ": " << file.message << "\n";
  }
  if (files.empty()) {
    if (options.json) {
      json array = json::array();
      for (const auto& file : skipped)
        array.push_back(ToJson(file));
      std::cout << array.dump(2) << "\n";
    }
    std::cerr << "backplane check: no backend files found"
              << (options.files.empty() ? " in the default backend paths" : "")
              << (skipped.empty()
                      ? ""
                      : " (" + std::to_string(skipped.size()) + " file(s) skipped, named above)")
              << "\n";
    return 1;
  }
  std::vector<FileReport> reports;
  std::map<std::string, std::string> files_by_id;
  std::map<std::string, std::string> files_by_real_path;
  for (const auto& file : files) {
    FileReport report = CheckFile(file, options.allow_unsafe_permissions, trust.get());
    if (!report.reason)
      RefuseIfSuspected(report, suspects);
    if (!report.reason) {
      // Each file is checked in its own process, so files given together are compared here.
      std::error_code error;
      const std::string real_path = fs::canonical(file, error).string();
      auto [same, first_name] = files_by_real_path.emplace(real_path, file);
      auto [it, inserted] = files_by_id.emplace(report.id, file);
      if (!first_name) {
        report.stages.push_back(
            {"register", true, "same file as " + same->second + ", loaded once"});
      } else if (!inserted) {
        report.reason = LoadReason::kDuplicateId;
        report.message = file + " provides backend id " + report.id + ", which " + it->second +
                         " (given earlier) provides too; only the first would be registered";
        report.stages.push_back({"register", false, report.message});
      } else {
        report.stages.push_back({"register", true, "backend id " + report.id});
      }
    }
    if (!options.json)
      PrintText(report);
    reports.push_back(std::move(report));
  }
  bool all_ok = true;
  json array = json::array();
  for (const auto& report : reports) {
    all_ok = all_ok && !report.reason;
    array.push_back(ToJson(report));
  }
  for (const auto& file : skipped)
    array.push_back(ToJson(file));
  if (options.json) {
    std::cout << array.dump(2) << "\n";
  } else {
    std::cout << (all_ok ? "all " + std::to_string(reports.size()) + " file(s) would load\n"
                         : "some files would not load\n");
  }
  return all_ok ? 0 : 1;
}

}  // namespace backplane::server
