// CpuAcc: FP32 inference on oneDNN (Debian's libdnnl 2.6, OpenMP runtime).
//
// Ops: Conv, MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool, Gemm, MatMul, Relu,
// LeakyRelu, Sigmoid, Tanh, HardSigmoid, HardSwish, Clip (constant bounds), Softmax,
// BatchNormalization (inference), Add, Sub, Mul, Div (numpy broadcasting of either operand or
// both), Dropout (inference: the identity; no mask output), Pad (constant mode, pads >= 0),
// Concat, Transpose, Identity, Flatten, Reshape, with ONNX semantics as CpuRef implements them
// (backends/cpu_ref). What oneDNN cannot do, or not with CpuRef's results, IsSupported refuses
// with the reason (op_support.cpp), and the layer falls to the next backend of the network's
// preference list. Inside a compiled run (compiler.hpp) Conv + BatchNormalization + constant Add
// + residual Add (a sum post-op) + activations (Relu, LeakyRelu, Sigmoid, Tanh, HardSigmoid,
// HardSwish, Clip) become one convolution, and a zero spatial Pad before a Conv its padding.
//
// Primitives are created once, when a workload is created or a run of layers is compiled
// (SDK 1.1 CompileSubgraph, compiler.cpp); Execute only binds the host's tensors and runs them
// (program.cpp). Shapes: a layer whose description has dynamic dims gets its primitives per
// concrete shape on first use, cached per workload (kShapeCacheSize shapes); a compiled run needs
// static shapes and is declined otherwise (its layers then run one by one).
//
// Threading (option intra_op_threads, default 1): oneDNN here runs on OpenMP, and every primitive
// runs on the thread that calls Execute, with that thread's OpenMP thread count set for the call
// (a per-thread setting, restored after). The count is per step: intra_op_threads for a layer
// with enough work, 1 below the thresholds of compiler.cpp (kParallelMinConvFlops,
// kParallelMinMatMulFlops, kParallelMinElements; bench/cpu_acc_threads_bench.cpp times them), so
// that a second thread never slows a small layer down. The host runs up to max_in_flight requests
// at once, so requests x intra_op_threads threads may compute at once: keep that product within the
// cores (1, the default, never oversubscribes). intra_op_threads itself is at most the CPUs this
// process may use (sdk/thread_limits.hpp: affinity, cgroup CPU quota). libgomp keeps the workers
// of each calling thread's teams after a call; OmpTeamScope (program.hpp) releases them after the
// option is lowered and refuses a request whose team the process could not create. The value is
// read when a workload is created (oneDNN sizes some kernels' work split at creation); the host's
// runtime re-prepares loaded networks when an option changes and switches them as a swap does, so
// an update reaches them too. A network may set its own value (SDK 1.3 per-network options: the
// ...WithOptions calls prepare with the network's values, PrepareSettings), so networks on one
// instance may run with different counts (TeamSizes). A compiled run with a batch may instead run
// as parts of its batch, one thread each: at once through the host's ParallelFor, or one after the
// other on the calling thread when the parts' activations stay in cache where the whole batch's do
// not (batch_split.hpp; option batch_split).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>

#include "backplane/sdk/thread_limits.hpp"
#include "batch_split.hpp"
#include "compiler.hpp"
#include "op_support.hpp"
#include "program.hpp"

namespace backplane::cpu_acc {
namespace {

constexpr std::string_view kIntraOpThreads = "intra_op_threads";
constexpr std::string_view kBatchSplit = "batch_split";
constexpr std::size_t kShapeCacheSize = 8;

// The OpenMP team sizes the live workloads of one instance were prepared with.
//
// Trap: a network may set its own intra_op_threads (SDK 1.3), so the largest team a request
// thread started is no longer the instance's value, and when the workloads that ran it go (their
// network unloaded, or re-prepared with a lower value of its own) no option is lowered: nothing
// would call ReleaseOmpPoolsOnNextUse, and a request thread that goes on running only smaller
// teams (a team of one never touches the pool) would keep its workers until it exits. So the
// last workload of the largest size releases the pools when it goes, as a lowering does. A
// network prepared with fewer threads than others needs nothing itself: its team of one leaves
// the pool alone and a smaller team shrinks it (OmpTeamScope counts that), and it must not
// release the pools when prepared, or the threads of the networks that still run the larger
// teams would create their workers anew. Releasing while another instance of this library still
// runs teams of that size costs only that: its threads create their workers once more.
//
// Thread-safe.
class TeamSizes {
 public:
  // Counts one workload of `threads` while it lives.
  class Use {
   public:
    Use(TeamSizes& sizes, int threads) : sizes_(sizes), threads_(threads) { sizes_.Add(threads_); }
    ~Use() { sizes_.Remove(threads_); }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    TeamSizes& sizes_;
    const int threads_;
  };

 private:
  void Add(int threads) {
    std::lock_guard lock(mutex_);
    ++live_[threads];
  }
  void Remove(int threads) {
    bool largest_gone = false;
    {
      std::lock_guard lock(mutex_);
      auto it = live_.find(threads);
      if (--it->second == 0) {
        live_.erase(it);
        largest_gone = threads > 1 && (live_.empty() || live_.rbegin()->first < threads);
      }
    }
    if (largest_gone)
      ReleaseOmpPoolsOnNextUse();
  }

  std::mutex mutex_;
  std::map<int, int> live_;  // guarded by mutex_: team size -> live workloads prepared with it
};

// What the workloads of one backend instance share. Thread-safe.
struct BackendState {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  // The networks' weights as the programs want them, one copy however many programs share them.
  ConstantCache constants;
  OptionSet options{std::string(kId),
                    {{std::string(kIntraOpThreads), OptionType::kInt64, int64_t{1},
                      "OpenMP threads each request's primitives use: 1 to the CPUs this "
                      "process may use (affinity, cgroup CPU quota); requests in flight x "
                      "this should not exceed the cores. Lowering it releases the surplus "
                      "threads. Only convolutions of at least 1 MFLOP, "
                      "matrix products (Gemm, MatMul) of at least 0.5 MFLOP and other layers of "
                      "at least 64K output elements use more than one: below that a second "
                      "thread was measured to slow them down. Read when "
                      "a network is prepared: a network may set its own value; an update "
                      "re-prepares loaded networks"},
                     {std::string(kBatchSplit), OptionType::kString, std::string("auto"),
                      "Run a compiled run's batch as parts, one thread each: at once with "
                      "intra_op_threads > 1 (instead of splitting each layer's work), else one "
                      "after the other (a few samples' activations stay in cache). 'auto': when "
                      "the layers keep samples apart, the run has the work for it and the parts "
                      "timed faster at compile; 'always': whenever the layers keep samples "
                      "apart (a part per thread, or two); 'never'. Read when a network is "
                      "prepared: a network may set its own value"}}};
  std::atomic<int> executing{0};  // Execute calls inside this instance's code
  TeamSizes team_sizes;
  // The host's parallel work (SDK 1.2), set once by SetHost before any workload is created; null
  // on an older host, whose batch parts then only run one after the other.
  IHost* host = nullptr;
};

// Counts an Execute in progress, for Shutdown.
class ExecutingScope {
 public:
  explicit ExecutingScope(std::atomic<int>& counter) : counter_(counter) { counter_.fetch_add(1); }
  ~ExecutingScope() { counter_.fetch_sub(1); }
  ExecutingScope(const ExecutingScope&) = delete;
  ExecutingScope& operator=(const ExecutingScope&) = delete;

 private:
  std::atomic<int>& counter_;
};

// The options a workload is prepared with, fixed for its life: the instance's (CreateWorkload,
// CompileSubgraph) or one network's (CreateWorkloadWithOptions, CompileSubgraphWithOptions).
struct PrepareSettings {
  int threads = 1;          // intra_op_threads
  std::string batch_split;  // "auto", "always" or "never"
};

PrepareSettings InstanceSettings(const BackendState& state) {
  return {static_cast<int>(state.options.GetAs<int64_t>(kIntraOpThreads)),
          state.options.GetAs<std::string>(kBatchSplit)};
}

// One compiled program for a whole run of layers (or one layer with static shapes).
// Thread-safe: the program is immutable; per-request state comes from its context pool.
class ProgramWorkload final : public IWorkload {
 public:
  ProgramWorkload(BackendState& state, std::shared_ptr<const Program> program, std::string label,
                  std::optional<std::vector<std::size_t>> input_map)
      : state_(state),
        program_(std::move(program)),
        team_(state.team_sizes, program_->threads()),
        label_(std::move(label)),
        input_map_(std::move(input_map)) {}

  Status Execute(std::span<const ConstTensorView> inputs,
                 std::span<const TensorView> outputs) override {
    ExecutingScope scope(state_.executing);
    try {
      return program_->Run(inputs, input_map_ ? &*input_map_ : nullptr, outputs, label_);
    } catch (const std::exception& error) {
      return Internal("CpuAcc: " + label_ + ": " + error.what());
    } catch (...) {
      return Internal("CpuAcc: " + label_ + ": unknown exception");
    }
  }

 private:
  BackendState& state_;
  const std::shared_ptr<const Program> program_;
  const TeamSizes::Use team_;
  const std::string label_;
  // Per layer: boundary input -> index in Execute's inputs (all of the op's inputs). A compiled
  // run gets exactly its boundary inputs (nullopt).
  const std::optional<std::vector<std::size_t>> input_map_;
};

// A compiled run executed as parts of its batch (batch_split.hpp), each part a program compiled
// for its rows on one thread: at once through the host's ParallelFor, or one after the other on
// the calling thread. Thread-safe like ProgramWorkload: the programs are immutable, each call's
// views and statuses are its own. Not counted in TeamSizes: every part runs a team of one.
class BatchSplitWorkload final : public IWorkload {
 public:
  struct Part {
    int64_t first_row = 0;
    int64_t rows = 0;
    std::shared_ptr<const Program> program;
  };

  BatchSplitWorkload(BackendState& state, int64_t batch, std::vector<Part> parts, bool at_once,
                     std::string label)
      : state_(state),
        batch_(batch),
        parts_(std::move(parts)),
        at_once_(at_once),
        label_(std::move(label)) {}

  Status Execute(std::span<const ConstTensorView> inputs,
                 std::span<const TensorView> outputs) override {
    ExecutingScope scope(state_.executing);
    auto batched = [&](const TensorInfo& info) {
      return !info.shape.empty() && info.shape[0] == batch_;
    };
    for (const auto& input : inputs) {
      if (!batched(input.info)) {
        return InvalidArgument("CpuAcc: " + label_ + ": input " + ToString(input.info.shape) +
                               ", compiled for a batch of " + std::to_string(batch_));
      }
    }
    for (const auto& output : outputs) {
      if (!batched(output.info))
        return InvalidArgument("CpuAcc: " + label_ + ": an output is not of the batch");
    }
    Call call{this, inputs, outputs, std::vector<Status>(parts_.size())};
    Status status;
    if (at_once_)
      status = state_.host->ParallelFor(parts_.size(), 1, &RunParts, &call);
    else
      RunParts(&call, 0, parts_.size());
    for (Status& part : call.statuses) {
      if (status.ok() && !part.ok())
        status = std::move(part);
    }
    return status;
  }

 private:
  struct Call {
    const BatchSplitWorkload* self;
    std::span<const ConstTensorView> inputs;
    std::span<const TensorView> outputs;
    std::vector<Status> statuses;  // per part, each written by its own call only
  };

  // Runs on a host thread; returns into host code (rule 5). Nothing may escape it.
  static void RunParts(void* context, std::size_t begin, std::size_t end) {
    auto& call = *static_cast<Call*>(context);
    for (std::size_t p = begin; p < end; ++p) {
      try {
        call.statuses[p] = call.self->RunPart(call.self->parts_[p], call.inputs, call.outputs);
      } catch (const std::exception& error) {
        call.statuses[p] = Internal("CpuAcc: " + call.self->label_ + ": " + error.what());
      } catch (...) {
        call.statuses[p] = Internal("CpuAcc: " + call.self->label_ + ": unknown exception");
      }
    }
  }

  // The part's rows of every tensor: the batch is the first dimension of dense row-major data,
  // so they are one contiguous block.
  template <typename View>
  static View Rows(View view, const Part& part, int64_t batch) {
    const std::size_t row_bytes = view.info.ByteSize() / static_cast<std::size_t>(batch);
    using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<decltype(view.data)>>,
                                    const std::byte, std::byte>;
    view.data =
        static_cast<Byte*>(view.data) + static_cast<std::size_t>(part.first_row) * row_bytes;
    view.info.shape[0] = part.rows;
    return view;
  }

  Status RunPart(const Part& part, std::span<const ConstTensorView> inputs,
                 std::span<const TensorView> outputs) const {
    std::vector<ConstTensorView> part_inputs;
    std::vector<TensorView> part_outputs;
    part_inputs.reserve(inputs.size());
    part_outputs.reserve(outputs.size());
    for (const auto& input : inputs)
      part_inputs.push_back(Rows(input, part, batch_));
    for (const auto& output : outputs)
      part_outputs.push_back(Rows(output, part, batch_));
    return part.program->Run(part_inputs, nullptr, part_outputs, label_);
  }

  BackendState& state_;
  const int64_t batch_;
  const std::vector<Part> parts_;
  const bool at_once_;  // else one after the other, on the calling thread
  const std::string label_;
};

// A layer whose description has dynamic dims: a program per concrete shape, made on first use.
// Thread-safe: the cache is locked; programs are shared and immutable.
class DynamicLayerWorkload final : public IWorkload {
 public:
  DynamicLayerWorkload(BackendState& state, OperatorDesc op, int threads)
      : state_(state),
        op_(std::move(op)),
        label_(NodeLabel(op_)),
        threads_(threads),
        team_(state.team_sizes, threads) {}

  Status Execute(std::span<const ConstTensorView> inputs,
                 std::span<const TensorView> outputs) override {
    ExecutingScope scope(state_.executing);
    try {
      if (inputs.size() != op_.inputs.size() || outputs.size() != op_.outputs.size())
        return InvalidArgument("CpuAcc: " + label_ + ": wrong number of inputs or outputs");
      // The steady state allocates nothing: shapes are compared in place, the entry shared.
      std::shared_ptr<const Entry> entry;
      {
        std::lock_guard lock(mutex_);
        for (const auto& candidate : cache_) {
          if (Matches(*candidate, inputs, outputs))
            entry = candidate;
        }
      }
      if (entry == nullptr) {
        auto made = std::make_shared<Entry>();
        OperatorDesc concrete = op_;
        for (std::size_t k = 0; k < inputs.size(); ++k) {
          made->key.push_back(HasInput(op_, k) ? inputs[k].info.shape : Shape{});
          if (HasInput(op_, k))
            concrete.inputs[k].shape = inputs[k].info.shape;
        }
        for (std::size_t k = 0; k < outputs.size(); ++k) {
          made->key.push_back(outputs[k].info.shape);
          concrete.outputs[k].shape = outputs[k].info.shape;
        }
        BACKPLANE_RETURN_IF_ERROR(CheckOp(concrete));
        // On this request's path: untuned (the shape program, built in the background, tunes).
        auto compiled = Compile(SingleLayer(concrete, &made->input_map), state_.engine,
                                state_.constants, threads_, {.tune = false});
        if (!compiled.ok())
          return compiled.error();
        made->program = compiled.value().program;
        entry = made;
        std::lock_guard lock(mutex_);
        if (cache_.size() == kShapeCacheSize)
          cache_.erase(cache_.begin());  // the oldest shape; requests using it keep their entry
        cache_.push_back(std::move(made));
      }
      return entry->program->Run(inputs, &entry->input_map, outputs, label_);
    } catch (const std::exception& error) {
      return Internal("CpuAcc: " + label_ + ": " + error.what());
    } catch (...) {
      return Internal("CpuAcc: " + label_ + ": unknown exception");
    }
  }

 private:
  struct Entry {
    std::vector<Shape> key;  // per input ([] when omitted), then per output
    std::shared_ptr<const Program> program;
    std::vector<std::size_t> input_map;
  };

  bool Matches(const Entry& entry, std::span<const ConstTensorView> inputs,
               std::span<const TensorView> outputs) const {
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      if (HasInput(op_, k) && entry.key[k] != inputs[k].info.shape)
        return false;
    }
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      if (entry.key[inputs.size() + k] != outputs[k].info.shape)
        return false;
    }
    return true;
  }

  BackendState& state_;
  const OperatorDesc op_;  // its constant_inputs stay valid while the workload lives
  const std::string label_;
  const int threads_;
  const TeamSizes::Use team_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<const Entry>> cache_;  // guarded by mutex_
};

bool HasDynamicShape(const OperatorDesc& op) {
  for (std::size_t k = 0; k < op.inputs.size(); ++k) {
    if (HasInput(op, k) && !IsStatic(op.inputs[k].shape))
      return true;
  }
  return std::any_of(op.outputs.begin(), op.outputs.end(),
                     [](const TensorInfo& info) { return !IsStatic(info.shape); });
}

// Thread-safe: the state's option set locks; dnnl engines are safe to share.
class CpuAccBackend final : public IBackend {
 public:
  // Trap: oneDNN's primitive cache (process-wide, in the resident libdnnl) hands a compile the
  // very primitive objects that requests are executing when the descriptors match, and tuning a
  // convolution executes its candidates (compiler.cpp, FastestConv). A compile running beside
  // requests (a shape program's build, a network re-prepared for a swap or an option update)
  // then executed primitives that requests were executing, and oneDNN 2.6 crashed in them
  // (DenseNet-like model, symbolic batch: a SIGSEGV or "double free" in 1 run of 2; none in 16
  // with the cache off). Without the cache every compile owns its primitives; what it costs is
  // JIT time at compile, off the request path.
  CpuAccBackend() { dnnl::set_primitive_cache_capacity(0); }

  std::string_view GetId() const override { return kId; }

  Status IsSupported(const OperatorDesc& op) const override { return CheckOp(op); }

  Result<std::unique_ptr<IWorkload>> CreateWorkload(const OperatorDesc& op) override {
    return PrepareLayer(op, InstanceSettings(state_));
  }

  Result<CompiledSubgraph> CompileSubgraph(const SubgraphDesc& subgraph) override {
    return CompileRun(subgraph, InstanceSettings(state_));
  }

  // SDK 1.3: the same, with the values of the network being prepared.
  Result<std::unique_ptr<IWorkload>> CreateWorkloadWithOptions(
      const OperatorDesc& op, const BackendOptions& options) override {
    auto settings = SettingsFrom(options);
    if (!settings.ok())
      return std::move(settings).error();
    return PrepareLayer(op, settings.value());
  }

  Result<CompiledSubgraph> CompileSubgraphWithOptions(const SubgraphDesc& subgraph,
                                                      const BackendOptions& options) override {
    auto settings = SettingsFrom(options);
    if (!settings.ok())
      return std::move(settings).error();
    return CompileRun(subgraph, settings.value());
  }

  void SetHost(IHost* host) override { state_.host = host; }

  std::vector<OptionDescriptor> DescribeOptions() const override {
    return state_.options.descriptors();
  }

  // What UpdateOptions would refuse, applying nothing.
  Status CheckOptions(const BackendOptions& options) const override {
    BACKPLANE_RETURN_IF_ERROR(CheckValues(options));
    // At most the CPUs this process may use (affinity, cgroup quota): more threads only take
    // turns on the cores, and each request thread keeps a pool of that many (the host checks
    // this too, but an older host does not).
    if (auto threads = options.find(kIntraOpThreads); threads != options.end()) {
      BACKPLANE_RETURN_IF_ERROR(CheckThreadCount(
          kId, kIntraOpThreads, std::get<int64_t>(threads->second), FindUsableCpus()));
    }
    return Status::Ok();
  }

  // All-or-nothing: every value is checked before OptionSet applies anything.
  Status UpdateOptions(const BackendOptions& changes) override {
    BACKPLANE_RETURN_IF_ERROR(CheckOptions(changes));
    auto threads = changes.find(kIntraOpThreads);
    const bool lowered = threads != changes.end() &&
                         std::get<int64_t>(threads->second) < InstanceSettings(state_).threads;
    BACKPLANE_RETURN_IF_ERROR(state_.options.Update(changes));
    if (lowered)
      ReleaseOmpPoolsOnNextUse();
    return Status::Ok();
  }

  Result<OptionValue> GetOption(std::string_view key) const override {
    return state_.options.Get(key);
  }

  // Every primitive runs synchronously inside Execute, on the caller's thread: CpuAcc starts no
  // thread, task or callback of its own. OpenMP's worker threads belong to libgomp (and run
  // libdnnl's code, which the host keeps resident: loading rule 8), and they are idle once a
  // parallel region returns, which is before Execute returns. The host destroys every workload
  // before calling this, so no Execute can be running; the wait below only guards a host that
  // would break that order.
  void Shutdown() override {
    while (state_.executing.load() != 0)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }

 private:
  // Names, types and batch_split's values: what the options' types do not say, except the bound
  // on intra_op_threads that depends on the machine (CheckOptions).
  Status CheckValues(const BackendOptions& options) const {
    BACKPLANE_RETURN_IF_ERROR(ValidateOptions(options, state_.options.descriptors(), kId));
    if (auto split = options.find(kBatchSplit); split != options.end()) {
      const std::string& value = std::get<std::string>(split->second);
      if (value != "auto" && value != "always" && value != "never") {
        return InvalidArgument(
            "backend CpuAcc option 'batch_split' must be auto, always or never, got '" + value +
            "'");
      }
    }
    return Status::Ok();
  }

  // The settings of a network's options (the host passes every declared option; one it leaves
  // out keeps the instance's value). The thread count's upper bound is not checked again here:
  // the host and CheckOptions checked it when the value was set, and a network re-prepared after
  // the CPU quota shrank keeps preparing, as with the instance's own value (whose update
  // UpdateOptions checked once).
  Result<PrepareSettings> SettingsFrom(const BackendOptions& options) const {
    BACKPLANE_RETURN_IF_ERROR(CheckValues(options));
    PrepareSettings settings = InstanceSettings(state_);
    if (auto threads = options.find(kIntraOpThreads); threads != options.end()) {
      const int64_t value = std::get<int64_t>(threads->second);
      if (value < 1) {
        return InvalidArgument("backend CpuAcc option 'intra_op_threads' must be at least 1, got " +
                               std::to_string(value));
      }
      settings.threads =
          static_cast<int>(std::min<int64_t>(value, std::numeric_limits<int>::max()));
    }
    if (auto split = options.find(kBatchSplit); split != options.end())
      settings.batch_split = std::get<std::string>(split->second);
    return settings;
  }

  // One layer's workload, with `settings`' threads.
  Result<std::unique_ptr<IWorkload>> PrepareLayer(const OperatorDesc& op,
                                                  const PrepareSettings& settings) {
    BACKPLANE_RETURN_IF_ERROR(CheckOp(op));
    const int threads = settings.threads;
    if (HasDynamicShape(op))
      return std::unique_ptr<IWorkload>(new DynamicLayerWorkload(state_, op, threads));
    std::vector<std::size_t> input_map;
    auto compiled = Compile(SingleLayer(op, &input_map), state_.engine, state_.constants, threads);
    if (!compiled.ok())
      return compiled.error();
    return std::unique_ptr<IWorkload>(new ProgramWorkload(
        state_, std::move(compiled.value().program), NodeLabel(op), std::move(input_map)));
  }

  // A run of layers compiled with `settings`' threads and batch split.
  Result<CompiledSubgraph> CompileRun(const SubgraphDesc& subgraph,
                                      const PrepareSettings& settings) {
    if (subgraph.layers.empty() || subgraph.layer_inputs.size() != subgraph.layers.size() ||
        subgraph.layer_outputs.size() != subgraph.layers.size() ||
        subgraph.input_infos.size() != subgraph.inputs.size() ||
        subgraph.output_infos.size() != subgraph.outputs.size()) {
      return InvalidArgument("CpuAcc: inconsistent SubgraphDesc");
    }
    for (const OperatorDesc& op : subgraph.layers) {
      BACKPLANE_RETURN_IF_ERROR(CheckOp(op));
      if (HasDynamicShape(op)) {
        return Unimplemented("CpuAcc compiles runs with static shapes only; " + NodeLabel(op) +
                             " has a dynamic dim (its layers run one by one, with primitives per "
                             "shape)");
      }
    }
    for (const auto& info : subgraph.input_infos) {
      if (!IsStatic(info.shape))
        return Unimplemented("CpuAcc compiles runs with static shapes only");
    }
    std::string label = "run " + subgraph.layers.front().name + ".." + subgraph.layers.back().name;
    const int threads = settings.threads;
    const std::string& mode = settings.batch_split;
    const std::optional<int64_t> batch = SplittableBatch(subgraph);
    const bool at_once = threads >= 2 && state_.host != nullptr;
    if (mode == "always" && batch) {
      // Testing's mode: a part per thread at once, or two parts one after the other.
      if (auto split = CompileParts(subgraph, *batch, at_once ? threads : 2, at_once, label))
        return std::move(*split);
    }
    auto compiled = Compile(subgraph, state_.engine, state_.constants, threads);
    if (!compiled.ok())
      return compiled.error();
    CompiledSubgraph result;
    result.workload = std::unique_ptr<IWorkload>(
        new ProgramWorkload(state_, std::move(compiled.value().program), label, std::nullopt));
    result.layer_notes = std::move(compiled.value().layer_notes);
    if (mode != "auto" || !batch)
      return result;
    // Neither the whole batch nor any split wins everywhere (batch_split.hpp): time them, as
    // convolutions are tuned. The candidates: a part per thread at once; parts of a few rows
    // (kCachePartRows), whose activations stay in cache, at once or one after the other.
    std::vector<CompiledSubgraph> candidates;
    std::vector<int64_t> part_counts;
    const auto consider = [&](int64_t parts) {
      if (parts < 2 || parts > *batch || std::ranges::count(part_counts, parts) != 0 ||
          !SplitPays(subgraph, parts)) {
        return;
      }
      part_counts.push_back(parts);
      if (auto split = CompileParts(subgraph, *batch, parts, at_once, label))
        candidates.push_back(std::move(*split));
    };
    if (at_once)
      consider(std::min<int64_t>(threads, *batch));  // a batch of 2 on 4 threads: 2 parts
    for (const int64_t rows : kCachePartRows) {
      if (rows < *batch)
        consider((*batch + rows - 1) / rows);
    }
    if (candidates.empty())
      return result;
    std::vector<IWorkload*> workloads{result.workload.get()};
    for (auto& candidate : candidates)
      workloads.push_back(candidate.workload.get());
    const std::size_t fastest = Fastest(workloads, subgraph);
    return fastest == 0 ? std::move(result) : std::move(candidates[fastest - 1]);
  }

  // The run (whose layers SplittableBatch accepted, with batch `batch`) as `parts` parts of its
  // batch, as even as possible, at once or one after the other; nullopt when a part fails to
  // compile (the whole-batch program then serves).
  std::optional<CompiledSubgraph> CompileParts(const SubgraphDesc& subgraph, int64_t batch,
                                               int64_t parts_count, bool at_once,
                                               const std::string& label) {
    const std::vector<int64_t> rows = PartRows(batch, parts_count);
    std::vector<BatchSplitWorkload::Part> parts;
    parts.reserve(rows.size());
    std::vector<std::string> notes;
    int64_t first_row = 0;
    for (const int64_t part_rows : rows) {
      BatchSplitWorkload::Part part{first_row, part_rows, nullptr};
      first_row += part_rows;
      // Parts of one size share one program (PartRows puts the larger ones first).
      if (!parts.empty() && parts.back().rows == part_rows) {
        part.program = parts.back().program;
        parts.push_back(std::move(part));
        continue;
      }
      auto compiled = Compile(WithBatch(subgraph, part_rows), state_.engine, state_.constants, 1);
      if (!compiled.ok())
        return std::nullopt;
      part.program = std::move(compiled.value().program);
      if (notes.empty())
        notes = std::move(compiled.value().layer_notes);
      parts.push_back(std::move(part));
    }
    std::string sizes;
    for (const int64_t part_rows : rows) {
      if (!sizes.empty())
        sizes += '+';
      sizes += std::to_string(part_rows);
    }
    for (std::string& note : notes) {
      note += (note.empty() ? "" : "; ") + std::string("batch of ") + std::to_string(batch) +
              " split into " + std::to_string(rows.size()) + " parts (" + sizes + " rows) " +
              (at_once ? "run at once, 1 thread each" : "run one after the other");
    }
    CompiledSubgraph result;
    result.workload = std::unique_ptr<IWorkload>(
        new BatchSplitWorkload(state_, batch, std::move(parts), at_once, label));
    result.layer_notes = std::move(notes);
    return result;
  }

  // Of workloads of `run`, the index of the one that executes it fastest on zeros: the best of 3
  // rounds, alternating (so that a load that rises or falls weighs on all), after a warm-up; a
  // round times 2 runs back to back, as requests come (threads awake, caches warm). 8 executions
  // each, at compile (off the request path: a shape program's build). An earlier one wins ties
  // within 3%. A failing run loses.
  static std::size_t Fastest(std::span<IWorkload* const> workloads, const SubgraphDesc& run) {
    std::vector<std::vector<float>> buffers;
    std::vector<ConstTensorView> inputs;
    std::vector<TensorView> outputs;
    buffers.reserve(run.input_infos.size() + run.output_infos.size());
    for (const TensorInfo& info : run.input_infos) {
      buffers.emplace_back(static_cast<std::size_t>(info.ElementCount()), 0.0f);
      inputs.push_back({info, buffers.back().data()});
    }
    for (const TensorInfo& info : run.output_infos) {
      buffers.emplace_back(static_cast<std::size_t>(info.ElementCount()), 0.0f);
      outputs.push_back({info, buffers.back().data()});
    }
    auto time = [&](IWorkload& workload) {
      const auto start = std::chrono::steady_clock::now();
      for (int k = 0; k < 2; ++k) {
        if (!workload.Execute(inputs, outputs).ok())
          return 1e300;
      }
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    std::vector<double> best;
    for (IWorkload* workload : workloads)
      best.push_back(time(*workload));
    for (int round = 0; round < 3; ++round) {
      for (std::size_t w = 0; w < workloads.size(); ++w)
        best[w] = std::min(best[w], time(*workloads[w]));
    }
    std::size_t fastest = 0;
    for (std::size_t w = 1; w < workloads.size(); ++w) {
      if (best[w] * 1.03 < best[fastest])
        fastest = w;
    }
    return fastest;
  }

  BackendState state_;
};

}  // namespace
}  // namespace backplane::cpu_acc

BACKPLANE_DEFINE_BACKEND(backplane::cpu_acc::CpuAccBackend, "CpuAcc")
