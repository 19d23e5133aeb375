// A compiled run executed as parts of its batch, each part on one thread: at once, or one after
// the other.
//
// Why: with intra_op_threads 2, oneDNN splits each primitive's work over an OpenMP team, and on
// this kind of machine (AVX2, 2 cores) the mid-size convolutions of zoo-like models at batch 4
// gain little from the second thread, the layers below the two-thread thresholds nothing at all,
// and every layer pays a barrier. A batch of independent samples needs none of that: two halves
// of the batch run the whole run side by side, each on one thread, with no synchronisation until
// both end (a SqueezeNet-like half batch on one thread took well under half the whole batch's time
// on two OpenMP threads; docs/performance.md, bench/ort_compare.sh). The parts run through the
// host's IHost::ParallelFor, so they take the request's arena's threads when free and run one after
// the other when not: never more threads than the host allows, and no OpenMP team at all.
//
// Parts help on one thread too: a CNN's activations for a few samples stay in the core's caches
// from one layer to the next, a large batch's do not: per sample, MobileNetV2-like and
// SqueezeNet-like ran about twice as long at large batches as at small ones on one thread, and
// ResNet-like and DenseNet-like stayed flat (bench/make_compare_models.py's models, `backplane run
// --repeat`; the numbers are in docs/performance.md). So a run with a batch is also compiled as
// parts of kCachePartRows rows run one after the other (at once with intra_op_threads > 1), and the
// fastest is kept.
//
// Only runs whose every layer treats the samples of the batch independently are split: the ops
// and attributes that keep the first dimension a batch are listed in batch_split.cpp
// (SplittableBatch); anything else keeps the whole-batch program.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backplane/sdk/backend.hpp"

namespace backplane::cpu_acc {

// A run split pays a hand-off to another thread per request; below this many FLOPs in the run's
// convolutions and matrix products, that costs more than half the run saves. Parts one after the
// other pay no hand-off, but each is a compile and a timing at compile, for a run too small to
// leave the caches anyway.
inline constexpr double kBatchSplitMinFlops = 2e6;

// The run's batch when it can be split: every boundary value and every value a layer reads or
// writes (but constants) has the same first dimension B >= 2, and every layer computes each
// sample from that sample alone. Else nullopt.
std::optional<int64_t> SplittableBatch(const SubgraphDesc& run);

// A part streams every weight of the run once, where oneDNN's own threads split the weights
// between them: a run with fewer FLOPs than this per weight element and part is bound by weight
// traffic, and a split makes it slower (an MLP 784-512-512-10 at batch 64, 64 FLOPs per weight in
// each half, was slower split; a LeNet-like at batch 64, a few hundred, was faster).
inline constexpr double kBatchSplitMinFlopsPerWeight = 256;

// The part sizes timed against the whole batch (and against a part per thread), when smaller
// than the batch: few, since each is a compile and a timing of its own.
inline constexpr int64_t kCachePartRows[] = {8, 4, 2};

// Whether the run split in `parts` parts has the work to pay for it: at least
// kBatchSplitMinFlops, and at least kBatchSplitMinFlopsPerWeight FLOPs per weight element and
// part.
bool SplitPays(const SubgraphDesc& run, int64_t parts);

// `run` with batch `rows` instead of its own: the first dimension of every non-constant value.
// Only for a run SplittableBatch accepted.
SubgraphDesc WithBatch(const SubgraphDesc& run, int64_t rows);

// `batch` rows in `parts` parts as even as possible, larger parts first (5 in 2: 3 and 2).
std::vector<int64_t> PartRows(int64_t batch, int64_t parts);

}  // namespace backplane::cpu_acc
