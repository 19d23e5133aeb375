#include "program.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backplane/core/thread_annotations.hpp"
#include "backplane/sdk/thread_limits.hpp"

// Declared here instead of including <omp.h>: the backend needs these three functions of libgomp
// only, and clang's installation may have no omp.h. omp_pause_resource_all on the host is
// libgomp's gomp_pause_host: it ends the calling thread's pool (its workers joined before it
// returns) and touches no offload device.
extern "C" {
int omp_get_max_threads(void);
void omp_set_num_threads(int);
int omp_pause_resource_all(int kind);  // omp_pause_resource_t: 1 is omp_pause_soft
}

namespace backplane::cpu_acc {

ScopedOmpThreads::ScopedOmpThreads(int threads) : previous_(omp_get_max_threads()) {
  if (threads != previous_)
    omp_set_num_threads(threads);
}

ScopedOmpThreads::~ScopedOmpThreads() {
  if (omp_get_max_threads() != previous_)
    omp_set_num_threads(previous_);
}

namespace {

constexpr int kOmpPauseSoft = 1;

// Bumped by ReleaseOmpPoolsOnNextUse; a thread whose pool was fitted at an older value releases
// it. Starts above every thread's 0, so that a thread's first use in this library (a new
// generation: the pool may be an older generation's) releases what it has.
std::atomic<uint64_t> omp_pool_epoch{1};

// This thread's pool, as far as this library knows: the epoch it was fitted at, the size of the
// last team it started (the thread itself included: libgomp grows or shrinks the pool to each
// team's size), and workers it reserved in scopes still open.
// Trivially destructible, so they pin nothing (docs/loading-rules.md rule 3).
thread_local uint64_t thread_pool_epoch = 0;
thread_local int thread_pool_threads = 1;
thread_local int thread_reserved_workers = 0;

Mutex headroom_mutex;
int64_t reserved_workers BACKPLANE_GUARDED_BY(headroom_mutex) = 0;  // by every thread

}  // namespace

void ReleaseOmpPoolsOnNextUse() {
  omp_pool_epoch.fetch_add(1, std::memory_order_release);
}

Result<OmpTeamScope> OmpTeamScope::Enter(int threads, bool starts_team, const std::string& label) {
  const uint64_t epoch = omp_pool_epoch.load(std::memory_order_acquire);
  if (thread_pool_epoch != epoch) {
    // Not inside a parallel region here (Execute and compiles are called by host threads), where
    // libgomp would refuse (-1) and keep the pool.
    if (thread_pool_epoch == 0 || thread_pool_threads > 1)
      omp_pause_resource_all(kOmpPauseSoft);
    thread_pool_epoch = epoch;
    thread_pool_threads = 1;
  }
  const bool release_at_exit =
      !starts_team && threads > 1 && thread_pool_threads == 1 && thread_reserved_workers == 0;
  const int more = threads - thread_pool_threads - thread_reserved_workers;
  if (more <= 0) {
    if (starts_team)
      thread_pool_threads = threads;  // a smaller team shrinks the pool to its size
    return OmpTeamScope(0, release_at_exit);
  }
  MutexLock lock(headroom_mutex);
  const ThreadHeadroom headroom = FindThreadHeadroom();
  const int64_t left = headroom.more == ThreadHeadroom::kUnlimited
                           ? ThreadHeadroom::kUnlimited
                           : std::max<int64_t>(0, headroom.more - reserved_workers);
  if (left < more) {
    return Status(
        StatusCode::kResourceExhausted,
        "CpuAcc: " + label + ": a team of " + std::to_string(threads) + " OpenMP threads needs " +
            std::to_string(more) + " more thread(s), and the process may create " +
            std::to_string(left) + " (" + headroom.limited_by +
            (reserved_workers > 0 ? ", " + std::to_string(reserved_workers) + " being created"
                                  : std::string()) +
            "): refused, since libgomp would end the process when it cannot create "
            "one; lower intra_op_threads or raise the limit");
  }
  reserved_workers += more;
  thread_reserved_workers += more;
  if (starts_team)
    thread_pool_threads = threads;
  return OmpTeamScope(more, release_at_exit);
}

OmpTeamScope::~OmpTeamScope() {
  if (reserved_ != 0) {
    // The workers exist now (or were never needed): pids.current counts them from here on.
    MutexLock lock(headroom_mutex);
    reserved_workers -= reserved_;
    thread_reserved_workers -= reserved_;
  }
  if (release_at_exit_) {
    omp_pause_resource_all(kOmpPauseSoft);
    thread_pool_threads = 1;
  }
}

namespace {

constexpr std::size_t kAlignment = 64;

std::size_t AlignUp(std::size_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

struct FreeDeleter {
  void operator()(void* pointer) const { std::free(pointer); }
};

}  // namespace

// Per-request state; used by one request at a time (the pool hands it out).
struct Program::Context {
  std::unique_ptr<std::byte, FreeDeleter> workspace;
  dnnl::stream stream;
  std::vector<dnnl::memory> memories;              // per value
  std::vector<dnnl::memory> scratchpads;           // per step (may be empty)
  std::vector<std::vector<dnnl_exec_arg_t>> args;  // per step, C handles of the above
};

Program::Program(dnnl::engine engine, int threads)
    : engine_(std::move(engine)), threads_(threads) {}

Program::~Program() = default;

int Program::AddValue(dnnl::memory::desc md, ValueStorage storage) {
  values_.push_back({std::move(md), storage, {}});
  return static_cast<int>(values_.size() - 1);
}

int Program::AddConstant(dnnl::memory memory) {
  values_.push_back({memory.get_desc(), {ValueStorage::Kind::kConstant, 0}, memory});
  return static_cast<int>(values_.size() - 1);
}

int Program::AddSharedConstant(std::shared_ptr<const dnnl::memory> memory) {
  const int index = AddConstant(*memory);
  shared_constants_.push_back(std::move(memory));
  return index;
}

int Program::AddTemporary(const dnnl::memory::desc& md) {
  const std::size_t offset = workspace_bytes_;
  workspace_bytes_ += AlignUp(md.get_size());
  return AddValue(md, {ValueStorage::Kind::kTemporary, offset});
}

void Program::AddPrimitive(dnnl::primitive primitive, std::vector<std::pair<int, int>> args,
                           const dnnl::memory::desc& scratchpad, int threads) {
  ProgramStep step;
  step.threads = std::clamp(threads, 1, threads_);
  team_threads_ = std::max(team_threads_, step.threads);
  step.primitive = std::move(primitive);
  step.args = std::move(args);
  step.scratchpad = scratchpad;
  scratchpad_bytes_ = std::max(scratchpad_bytes_, AlignUp(scratchpad.get_size()));
  steps_.push_back(std::move(step));
}

void Program::AddCopy(int from, int to) {
  ProgramStep step;
  step.kind = ProgramStep::Kind::kCopy;
  step.copy_from = from;
  step.copy_to = to;
  step.copy_bytes = values_[to].md.get_size();
  steps_.push_back(std::move(step));
}

void Program::AddFill(int to, float value) {
  ProgramStep step;
  step.kind = ProgramStep::Kind::kFill;
  step.copy_to = to;
  step.copy_bytes = values_[to].md.get_size();
  step.fill_value = value;
  steps_.push_back(std::move(step));
}

void Program::AddPool(int from, int to, PoolGeometry geometry) {
  ProgramStep step;
  step.kind = ProgramStep::Kind::kPool;
  step.copy_from = from;
  step.copy_to = to;
  step.pool = std::move(geometry);
  step.pool_function = BestPoolFunction();
  steps_.push_back(std::move(step));
}

std::size_t Program::parallel_step_count() const {
  return static_cast<std::size_t>(std::count_if(steps_.begin(), steps_.end(), [](const auto& step) {
    return step.kind == ProgramStep::Kind::kPrimitive && step.threads > 1;
  }));
}

namespace {

// " of INT8" when a tensor's type is not the one compiled for; "" when it is.
std::string OfOtherType(const TensorInfo& given, const TensorInfo& compiled) {
  return given.type == compiled.type ? "" : " of " + std::string(ToString(given.type));
}

}  // namespace

void Program::SetBoundary(std::vector<TensorInfo> inputs, std::vector<TensorInfo> outputs) {
  inputs_ = std::move(inputs);
  outputs_ = std::move(outputs);
}

void Program::Finish() {
  for (std::size_t i = 0; i < values_.size(); ++i) {
    const ValueStorage& storage = values_[i].storage;
    if (storage.kind == ValueStorage::Kind::kInput || storage.kind == ValueStorage::Kind::kOutput) {
      bindings_.push_back(
          {static_cast<int>(i), storage.kind == ValueStorage::Kind::kInput, storage.index});
    }
  }
  // One context up front: the first request pays no set-up.
  Release(NewContext());
}

std::unique_ptr<Program::Context> Program::NewContext() const {
  auto context = std::make_unique<Context>();
  const std::size_t bytes = workspace_bytes_ + scratchpad_bytes_;
  if (bytes > 0) {
    context->workspace.reset(static_cast<std::byte*>(std::aligned_alloc(kAlignment, bytes)));
    if (context->workspace == nullptr)
      throw std::bad_alloc();
  }
  std::byte* base = context->workspace.get();
  context->stream = dnnl::stream(engine_);
  context->memories.reserve(values_.size());
  for (const ProgramValue& value : values_) {
    switch (value.storage.kind) {
      case ValueStorage::Kind::kConstant:
        context->memories.push_back(value.constant);
        break;
      case ValueStorage::Kind::kTemporary:
        context->memories.emplace_back(value.md, engine_, base + value.storage.index);
        break;
      case ValueStorage::Kind::kInput:
      case ValueStorage::Kind::kOutput:
        context->memories.emplace_back(value.md, engine_, static_cast<void*>(nullptr));
        break;
    }
  }
  for (const ProgramStep& step : steps_) {
    std::vector<dnnl_exec_arg_t> args;
    dnnl::memory scratchpad;
    if (step.kind == ProgramStep::Kind::kPrimitive) {
      for (const auto& [arg, value] : step.args)
        args.push_back({arg, context->memories[value].get()});
      if (step.scratchpad.get_size() > 0) {
        scratchpad = dnnl::memory(step.scratchpad, engine_, base + workspace_bytes_);
        args.push_back({DNNL_ARG_SCRATCHPAD, scratchpad.get()});
      }
    }
    context->scratchpads.push_back(std::move(scratchpad));
    context->args.push_back(std::move(args));
  }
  return context;
}

std::unique_ptr<Program::Context> Program::Acquire() const {
  {
    std::lock_guard lock(pool_mutex_);
    if (!pool_.empty()) {
      auto context = std::move(pool_.back());
      pool_.pop_back();
      return context;
    }
  }
  return NewContext();  // more concurrent requests than ever before on this program
}

void Program::Release(std::unique_ptr<Context> context) const {
  std::lock_guard lock(pool_mutex_);
  pool_.push_back(std::move(context));
}

Status Program::Run(std::span<const ConstTensorView> all_inputs,
                    const std::vector<std::size_t>* input_map, std::span<const TensorView> outputs,
                    const std::string& label) const {
  const std::size_t input_count = input_map == nullptr ? all_inputs.size() : input_map->size();
  if (input_map != nullptr) {
    for (std::size_t index : *input_map) {
      if (index >= all_inputs.size())
        return InvalidArgument("CpuAcc: " + label + ": got " + std::to_string(all_inputs.size()) +
                               " input(s)");
    }
  }
  auto input = [&](std::size_t i) -> const ConstTensorView& {
    return all_inputs[input_map == nullptr ? i : (*input_map)[i]];
  };
  if (input_count != inputs_.size() || outputs.size() != outputs_.size()) {
    return InvalidArgument("CpuAcc: " + label + ": got " + std::to_string(input_count) +
                           " input(s) and " + std::to_string(outputs.size()) +
                           " output(s), compiled for " + std::to_string(inputs_.size()) + " and " +
                           std::to_string(outputs_.size()));
  }
  for (std::size_t i = 0; i < input_count; ++i) {
    if (input(i).info != inputs_[i]) {
      return InvalidArgument("CpuAcc: " + label + ": input " + std::to_string(i) + " is " +
                             ToString(input(i).info.shape) +
                             OfOtherType(input(i).info, inputs_[i]) + ", compiled for " +
                             std::string(ToString(inputs_[i].type)) + " " +
                             ToString(inputs_[i].shape));
    }
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].info != outputs_[i]) {
      return InvalidArgument("CpuAcc: " + label + ": output " + std::to_string(i) +
                             " allocated as " + ToString(outputs[i].info.shape) +
                             OfOtherType(outputs[i].info, outputs_[i]) + ", compiled for " +
                             std::string(ToString(outputs_[i].type)) + " " +
                             ToString(outputs_[i].shape));
    }
  }
  // Before a team may start: the pool released after a lowering, and the workers a larger team
  // needs known to be creatable (OmpTeamScope).
  auto team = OmpTeamScope::Enter(team_threads_, team_threads_ > 1, label);
  if (!team.ok())
    return std::move(team).error();
  std::unique_ptr<Context> context;
  try {
    context = Acquire();
  } catch (const std::exception& error) {
    return Internal("CpuAcc: " + label + ": cannot create an execution context: " + error.what());
  }
  Status status;
  {
    // Per step: a small step runs on one thread (its team size fixed at creation, see
    // ProgramStep::threads). omp_set_num_threads is a store to this thread's ICV: cheap per step.
    ScopedOmpThreads threads(threads_);
    int current_threads = threads_;
    for (const Binding& binding : bindings_) {
      void* data = binding.input ? const_cast<void*>(input(binding.index).data)
                                 : outputs[binding.index].data;
      // Plain (dense, unpadded) layouts only at the boundary, so this only stores the pointer.
      const dnnl_status_t result =
          dnnl_memory_set_data_handle_v2(context->memories[binding.value].get(), data, nullptr);
      if (result != dnnl_success) {
        status = Internal("CpuAcc: " + label + ": dnnl_memory_set_data_handle failed (status " +
                          std::to_string(static_cast<int>(result)) + ")");
        break;
      }
    }
    for (std::size_t i = 0; status.ok() && i < steps_.size(); ++i) {
      const ProgramStep& step = steps_[i];
      if (step.kind == ProgramStep::Kind::kCopy) {
        void* to = context->memories[step.copy_to].get_data_handle();
        const void* from = context->memories[step.copy_from].get_data_handle();
        if (step.copy_bytes > 0 && to != from)
          std::memcpy(to, from, step.copy_bytes);
        continue;
      }
      if (step.kind == ProgramStep::Kind::kFill) {
        auto* to = static_cast<float*>(context->memories[step.copy_to].get_data_handle());
        std::fill(to, to + step.copy_bytes / sizeof(float), step.fill_value);
        continue;
      }
      if (step.kind == ProgramStep::Kind::kPool) {
        step.pool_function(
            step.pool,
            static_cast<const float*>(context->memories[step.copy_from].get_data_handle()),
            static_cast<float*>(context->memories[step.copy_to].get_data_handle()));
        continue;
      }
      if (step.threads != current_threads) {
        omp_set_num_threads(step.threads);
        current_threads = step.threads;
      }
      const auto& args = context->args[i];
      const dnnl_status_t result = dnnl_primitive_execute(
          step.primitive.get(), context->stream.get(), static_cast<int>(args.size()), args.data());
      if (result != dnnl_success) {
        status = Internal("CpuAcc: " + label + ": oneDNN primitive " + std::to_string(i) +
                          " failed (status " + std::to_string(static_cast<int>(result)) + ")");
      }
    }
  }
  Release(std::move(context));
  return status;
}

}  // namespace backplane::cpu_acc
