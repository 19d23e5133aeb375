#include "serving/crash_capture.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "backplane/core/thread_name.hpp"
#include "backplane/loader/digest.hpp"
#include "backplane/onnx/network.hpp"
#include "serving/model_repository.hpp"
#include "serving/serving_log.hpp"
#include "serving/utc_time.hpp"

namespace backplane::server {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kBuildCopies[] = "backends";  // <crash_dir>/backends/<sha256>/<file name>
// "20261206T182455.123Z": sorts as it happened, which is the order Prune removes in.
constexpr char kSortableUtc[] = "%Y%m%dT%H%M%S";

std::string ShellQuoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text)
    quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

uint64_t BytesUnder(const fs::path& path) {
  uint64_t bytes = 0;
  std::error_code error;
  for (fs::recursive_directory_iterator it(path, error), end; !error && it != end;
       it.increment(error)) {
    if (it->is_regular_file(error))
      bytes += it->file_size(error);
  }
  return bytes;
}

// The generation whose worker died, as the crash message names it: a worker's label starts
// "backend <id> generation <n> (" (isolation's MakeWorkerRunner). The registry's history still
// holds that generation after a restart replaced it, and the network may have moved off it
// already, so the placement cannot say which it was.
struct CrashedGeneration {
  std::string backend_id;
  GenerationStatus generation;
};
std::optional<CrashedGeneration> FindCrashedGeneration(const std::vector<BackendStatus>& backends,
                                                       std::string_view message) {
  for (const auto& backend : backends) {
    for (const auto& generation : backend.generations) {
      const std::string label =
          "backend " + backend.id + " generation " + std::to_string(generation.generation) + " (";
      if (message.find(label) != std::string_view::npos)
        return CrashedGeneration{backend.id, generation};
    }
  }
  return std::nullopt;
}

// The server's own executable when it is `backplane` (not a test binary that embeds the server).
std::string BackplaneExecutable() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  return !error && self.filename() == "backplane" ? self.string() : std::string("backplane");
}

Status WriteText(const fs::path& file, const std::string& text) {
  std::ofstream out(file);
  out << text;
  out.close();
  return out ? Status::Ok() : Internal("cannot write " + file.string());
}

// input_0.pb ... in the network's input order, named as its inputs (as `backplane run --input`
// and the ONNX test data have them); the file names.
Result<std::vector<std::string>> WriteInputs(const fs::path& capture,
                                             const std::vector<Tensor>& inputs,
                                             const Network* network) {
  std::vector<std::string> files;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string file = "input_" + std::to_string(i) + ".pb";
    const std::string name = network != nullptr && i < network->inputs.size()
                                 ? network->inputs[i].name
                                 : "input_" + std::to_string(i);
    BACKPLANE_RETURN_IF_ERROR(WriteTensorProtoFile(capture / file, inputs[i], name));
    files.push_back(file);
  }
  return files;
}

// `run MODEL --backends ... --prefer ... --input ...`, paths relative to the capture where they
// are in it. The copy's directory comes first: of two files of one backend id the first
// registration wins, and the server's directories then give the model's other backends.
std::string ReplayArguments(const fs::path& model_file, const fs::path& copy_directory,
                            const std::vector<fs::path>& backend_directories,
                            const std::vector<std::string>& preferences,
                            const std::vector<std::string>& input_files) {
  // Absolute: the script runs in the capture, and the server's paths may be relative to where
  // it was started.
  const auto absolute = [](const fs::path& path) {
    std::error_code error;
    return ShellQuoted(fs::absolute(path, error).lexically_normal().string());
  };
  std::string arguments = "run " + absolute(model_file);
  if (!copy_directory.empty())
    arguments += " --backends " + ShellQuoted(copy_directory.string());
  for (const auto& directory : backend_directories)
    arguments += " --backends " + absolute(directory);
  std::string prefer;
  for (const auto& id : preferences)
    prefer += (prefer.empty() ? "" : ",") + id;
  if (!prefer.empty())
    arguments += " --prefer " + ShellQuoted(prefer);
  for (const auto& file : input_files)
    arguments += " --input " + file;
  return arguments;
}

}  // namespace

struct CrashCapture::Pending {
  NetworkId network = 0;
  std::string message;
  std::chrono::system_clock::time_point at;
  std::vector<Tensor> inputs;
};

Result<std::unique_ptr<CrashCapture>> CrashCapture::Create(
    fs::path dir, const BackendRegistry& registry, std::vector<std::string> default_preferences,
    CrashCaptureLimits limits) {
  const auto refuse = [&](const std::string& why) {
    return FailedPrecondition("crash_dir " + dir.string() + ": " + why);
  };
  std::error_code error;
  fs::create_directories(dir, error);
  if (!fs::is_directory(dir))
    return refuse(error ? "cannot be created: " + error.message() : "is not a directory");
  // Whether a file can be made in it, as the captures will be (permissions, a read-only mount).
  const fs::path probe = dir / ".backplane-write-check";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return refuse("cannot be written: " + std::string(std::strerror(errno)));
  ::close(fd);
  fs::remove(probe, error);
  return std::unique_ptr<CrashCapture>(
      new CrashCapture(std::move(dir), registry, std::move(default_preferences), limits));
}

CrashCapture::CrashCapture(fs::path dir, const BackendRegistry& registry,
                           std::vector<std::string> default_preferences, CrashCaptureLimits limits)
    : dir_(std::move(dir)),
      registry_(registry),
      default_preferences_(std::move(default_preferences)),
      limits_(limits),
      backplane_(BackplaneExecutable()),
      thread_([this] { Run(); }) {}

CrashCapture::~CrashCapture() {
  Stop();
}

void CrashCapture::AttachModels(const ModelRepository& repository) {
  MutexLock lock(mutex_);
  repository_ = &repository;
}

void CrashCapture::OnCrashedRequest(const CrashedRequest& request) {
  try {
    auto pending = std::make_unique<Pending>();
    pending->network = request.network;
    pending->message = request.error.message();
    pending->at = std::chrono::system_clock::now();
    for (const ConstTensorView& input : request.inputs)
      pending->inputs.push_back(Tensor::CopyOf(input));
    {
      MutexLock lock(mutex_);
      if (stopping_)
        return;
      if (queue_.size() >= limits_.max_pending) {
        if (!std::exchange(dropped_logged_, true)) {
          Log().warn(
              "crash_dir {}: {} crashed requests wait to be written; more are not kept "
              "(logged once)",
              dir_.string(), queue_.size());
        }
        return;
      }
      queue_.push_back(std::move(pending));
    }
    changed_.notify_all();
  } catch (const std::exception& error) {  // out of memory: the request matters more
    Log().warn("crash_dir {}: a crashed request was not kept: {}", dir_.string(), error.what());
  }
}

void CrashCapture::Stop() {
  {
    MutexLock lock(mutex_);
    if (stopping_)
      return;
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void CrashCapture::Run() {
  NameThisThread("bp-crash-dir");
  for (;;) {
    std::unique_ptr<Pending> pending;
    const ModelRepository* repository = nullptr;
    {
      MutexLock lock(mutex_);
      while (!stopping_ && queue_.empty())
        changed_.wait(mutex_);
      if (queue_.empty())
        return;  // stopping, and everything queued is written
      pending = std::move(queue_.front());
      queue_.pop_front();
      repository = repository_;
    }
    Status written;
    try {
      written = Write(*pending, repository);
    } catch (const std::exception& error) {
      written = Internal(error.what());
    }
    if (written.ok()) {
      failure_logged_ = false;
    } else if (!std::exchange(failure_logged_, true)) {
      Log().warn(
          "crash_dir {}: a crashed request was not kept: {} (further failures are not "
          "logged until one is kept)",
          dir_.string(), written.message());
    }
    MutexLock lock(mutex_);
    dropped_logged_ = false;
  }
}

Status CrashCapture::Write(const Pending& pending, const ModelRepository* repository) {
  const auto crashed = FindCrashedGeneration(registry_.Describe(), pending.message);
  const ResolvedModel model =
      repository != nullptr ? repository->FindNetwork(pending.network) : ResolvedModel{};

  const std::string what =
      crashed ? crashed->backend_id + "-g" + std::to_string(crashed->generation.generation)
              : std::string("unknown");
  const fs::path capture = dir_ / (UtcWithMillis(pending.at, kSortableUtc) + "-" + what + "-" +
                                   std::to_string(++written_));
  std::error_code error;
  if (!fs::create_directory(capture, error))
    return Internal("cannot create " + capture.string() + ": " + error.message());
  fs::permissions(capture, fs::perms::owner_all, error);  // the inputs are a client's data

  auto inputs =
      WriteInputs(capture, pending.inputs, model.version ? &model.version->network() : nullptr);
  if (!inputs.ok())
    return inputs.error();

  // The build that died, copied: its file may be replaced (a fix deployed) before anyone looks.
  Result<fs::path> copy = FailedPrecondition("the crash message names no generation");
  if (crashed)
    copy = CopyBuild(crashed->generation);
  json record = {{"captured_at", UtcWithMillis(pending.at, kSortableUtc)},
                 {"message", pending.message},
                 {"network", pending.network},
                 {"inputs", *inputs},
                 {"model", nullptr},
                 {"version", nullptr},
                 {"backend", nullptr},
                 {"backend_copy", nullptr}};
  if (model.model) {
    record["model"] = model.model->name;
    record["version"] = model.version->version();
  }
  if (crashed) {
    record["backend"] = crashed->backend_id;
    record["generation"] = crashed->generation.generation;
    record["file"] = crashed->generation.resolved_file.string();
    record["sha256"] = crashed->generation.sha256;
  }
  if (copy.ok())
    record["backend_copy"] = copy->lexically_relative(capture).string();
  else
    record["backend_copy_missing"] = copy.error().message();
  BACKPLANE_RETURN_IF_ERROR(WriteText(capture / "crash.json", record.dump(2) + "\n"));

  if (model.model) {
    const fs::path model_file = repository->root() / model.model->name /
                                std::to_string(model.version->version()) / "model.onnx";
    const auto& preferences =
        model.model->config.backends.empty() ? default_preferences_ : model.model->config.backends;
    std::string script =
        "#!/bin/sh\n"
        "# Runs the request again with `backplane run`, which loads the backend in its own\n"
        "# process: expect it to die as the worker did. crash.json says how it died.\n"
        "# BACKPLANE: the backplane executable to run it with.\n";
    if (!copy.ok()) {
      script += "# NOT the build that died (" + copy.error().message() +
                "): the backend directories as they are now.\n";
    }
    script +=
        "cd \"$(dirname \"$0\")\" && exec \"${BACKPLANE:-" + backplane_ + "}\" " +
        ReplayArguments(model_file,
                        copy.ok() ? copy->lexically_relative(capture).parent_path() : fs::path(),
                        registry_.directories(), preferences, *inputs) +
        "\n";
    BACKPLANE_RETURN_IF_ERROR(WriteText(capture / "replay.sh", script));
    fs::permissions(capture / "replay.sh", fs::perms::owner_all, error);
  }
  Log().info("crash_dir: the request that crashed {} is kept in {}{}",
             crashed ? "backend " + crashed->backend_id + " generation " +
                           std::to_string(crashed->generation.generation)
                     : std::string("a backend"),
             capture.string(), model.model ? "; replay.sh there replays it" : "");
  Prune();
  return Status::Ok();
}

Result<fs::path> CrashCapture::CopyBuild(const GenerationStatus& generation) {
  const fs::path directory = dir_ / kBuildCopies / generation.sha256;
  const fs::path copy = directory / generation.resolved_file.filename();
  std::error_code error;
  if (fs::exists(copy, error))
    return copy;  // this content crashed before
  fs::create_directories(directory, error);
  // The loader refuses a file whose directory group or others may write (whatever the umask).
  const auto code_directory = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                              fs::perms::others_read | fs::perms::others_exec;
  fs::permissions(directory.parent_path(), code_directory, error);
  fs::permissions(directory, code_directory, error);
  const fs::path partial = directory / ("." + copy.filename().string() + ".partial");
  if (!fs::copy_file(generation.resolved_file, partial, fs::copy_options::overwrite_existing,
                     error)) {
    return Internal("cannot copy " + generation.resolved_file.string() + ": " + error.message());
  }
  auto digest = loader::Sha256OfFile(partial);
  if (!digest.ok() || *digest != generation.sha256) {
    fs::remove_all(directory, error);
    return FailedPrecondition(generation.resolved_file.string() +
                              " no longer holds the build that died (sha256 " + generation.sha256 +
                              ")");
  }
  // What the loader accepts (not writable by group or others), whatever the original's mode.
  fs::permissions(partial,
                  fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                      fs::perms::others_read,
                  error);
  fs::rename(partial, copy, error);
  if (error)
    return Internal("cannot rename " + partial.string() + ": " + error.message());
  return copy;
}

void CrashCapture::Prune() {
  struct Entry {
    fs::path path;
    uint64_t bytes;
  };
  std::vector<Entry> captures;
  std::error_code error;
  for (fs::directory_iterator it(dir_, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name != kBuildCopies && !name.starts_with(".") && it->is_directory())
      captures.push_back({it->path(), BytesUnder(it->path())});
  }
  std::sort(captures.begin(), captures.end(),
            [](const Entry& a, const Entry& b) { return a.path.filename() < b.path.filename(); });
  std::vector<Entry> copies;
  for (fs::directory_iterator it(dir_ / kBuildCopies, error), end; !error && it != end;
       it.increment(error)) {
    copies.push_back({it->path(), BytesUnder(it->path())});
  }
  uint64_t total = 0;
  for (const auto& entry : captures)
    total += entry.bytes;
  for (const auto& entry : copies)
    total += entry.bytes;

  std::size_t kept_from = 0;
  while (kept_from < captures.size() &&
         (captures.size() - kept_from > limits_.max_captures || total > limits_.max_bytes)) {
    fs::remove_all(captures[kept_from].path, error);
    total -= captures[kept_from].bytes;
    ++kept_from;
  }
  std::set<std::string> named;  // the contents the remaining captures name
  for (std::size_t i = kept_from; i < captures.size(); ++i) {
    std::ifstream in(captures[i].path / "crash.json");
    const json record = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (record.is_object() && record.value("sha256", json()).is_string())
      named.insert(record["sha256"].get<std::string>());
  }
  for (const auto& copy : copies) {
    if (!named.contains(copy.path.filename().string()))
      fs::remove_all(copy.path, error);
  }
}

}  // namespace backplane::server
