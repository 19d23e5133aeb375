// Where a second OpenMP thread starts to pay on oneDNN primitives: the thresholds of CpuAcc's
// two-thread policy (backends/cpu_acc/compiler.cpp, kParallelMinFlops and kParallelMinElements).
//
// For a sweep of sizes of the layers CpuAcc runs most (3x3 convolution, matmul, relu, binary
// add), each primitive is created and run the way CpuAcc does it — created under the thread
// count it runs with, executed on the calling thread with omp_set_num_threads — at 1 and at 2
// threads, alternating 1 and 2 per round so that noise from other processes hits both sides,
// and the medians are printed side by side with their ratio. The threshold is the smallest work
// from which 2 threads are not slower (ratio 1t/2t >= 1) at every larger size.
//
// Usage: backplane_bench_cpu_acc_threads [rounds]   (default 201 rounds per size)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

extern "C" {
void omp_set_num_threads(int);
}

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Clock = std::chrono::steady_clock;

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One primitive with its arguments, ready to run.
struct Runnable {
  dnnl::primitive primitive;
  std::unordered_map<int, memory> args;
};

memory Filled(const memory::desc& md, float value) {
  memory m(md, Engine());
  auto* data = static_cast<float*>(m.get_data_handle());
  std::fill(data, data + md.get_size() / sizeof(float), value);
  return m;
}

Runnable Conv3x3(int64_t n, int64_t c, int64_t hw) {
  const memory::dims src{n, c, hw, hw}, w{c, c, 3, 3}, dst{n, c, hw, hw};
  auto any = [](const memory::dims& d) {
    return memory::desc(d, memory::data_type::f32, Tag::any);
  };
  dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference,
                                       dnnl::algorithm::convolution_direct, any(src), any(w),
                                       any(dst), {1, 1}, {1, 1}, {1, 1});
  dnnl::convolution_forward::primitive_desc pd(desc, Engine());
  return {dnnl::convolution_forward(pd),
          {{DNNL_ARG_SRC, Filled(pd.src_desc(), 0.5f)},
           {DNNL_ARG_WEIGHTS, Filled(pd.weights_desc(), 0.01f)},
           {DNNL_ARG_DST, Filled(pd.dst_desc(), 0.0f)}}};
}

Runnable MatMul(int64_t m, int64_t k, int64_t n) {
  const memory::desc a({m, k}, memory::data_type::f32, Tag::ab);
  const memory::desc b({k, n}, memory::data_type::f32, Tag::any);
  const memory::desc y({m, n}, memory::data_type::f32, Tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, y), Engine());
  return {dnnl::matmul(pd),
          {{DNNL_ARG_SRC, Filled(a, 0.5f)},
           {DNNL_ARG_WEIGHTS, Filled(pd.weights_desc(), 0.01f)},
           {DNNL_ARG_DST, Filled(y, 0.0f)}}};
}

Runnable Relu(int64_t elements) {
  const memory::desc md({elements}, memory::data_type::f32, Tag::a);
  dnnl::eltwise_forward::primitive_desc pd(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::eltwise_relu,
                                  md, 0.0f, 0.0f),
      Engine());
  return {dnnl::eltwise_forward(pd),
          {{DNNL_ARG_SRC, Filled(md, -0.5f)}, {DNNL_ARG_DST, Filled(md, 0)}}};
}

Runnable Add(int64_t elements) {
  const memory::desc md({elements}, memory::data_type::f32, Tag::a);
  dnnl::binary::primitive_desc pd(dnnl::binary::desc(dnnl::algorithm::binary_add, md, md, md),
                                  Engine());
  return {dnnl::binary(pd),
          {{DNNL_ARG_SRC_0, Filled(md, 1.0f)},
           {DNNL_ARG_SRC_1, Filled(md, 2.0f)},
           {DNNL_ARG_DST, Filled(md, 0.0f)}}};
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Medians (µs) at 1 and 2 threads, rounds alternating between them.
std::pair<double, double> Measure(const std::function<Runnable()>& make, int rounds) {
  Runnable sides[2];
  for (int t = 0; t < 2; ++t) {
    omp_set_num_threads(t + 1);  // created under the count it runs with, as CpuAcc does
    sides[t] = make();
  }
  dnnl::stream stream(Engine());
  std::vector<double> times[2];
  for (int round = -5; round < rounds; ++round) {  // 5 warm-up rounds
    for (int t = 0; t < 2; ++t) {
      const int side = round % 2 == 0 ? t : 1 - t;  // alternate which side goes first
      omp_set_num_threads(side + 1);
      const auto start = Clock::now();
      sides[side].primitive.execute(stream, sides[side].args);
      stream.wait();
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (round >= 0)
        times[side].push_back(us);
    }
  }
  omp_set_num_threads(1);
  return {Median(times[0]), Median(times[1])};
}

void Row(const std::string& layer, double work, const std::function<Runnable()>& make, int rounds) {
  const auto [one, two] = Measure(make, rounds);
  std::printf("%-28s %12.0f %10.1f %10.1f %7.2f%s\n", layer.c_str(), work, one, two, one / two,
              one / two >= 1.0 ? "" : "  (2 threads slower)");
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 201;
  std::printf(
      "median of %d rounds per side, 1 and 2 threads alternating; ratio > 1: 2 threads "
      "faster\n\n",
      rounds);
  std::printf("%-28s %12s %10s %10s %7s\n", "layer", "work", "1t us", "2t us", "1t/2t");
  std::printf("-- convolutions 3x3, work = FLOPs\n");
  for (auto [n, c, hw] : {std::tuple{1, 4, 6},
                          {1, 8, 8},
                          {1, 16, 8},
                          {1, 16, 14},
                          {1, 16, 28},
                          {1, 32, 28},
                          {1, 64, 28},
                          {4, 64, 28}}) {
    const double flops = 2.0 * n * c * hw * hw * c * 9;
    Row(
        "conv n" + std::to_string(n) + " c" + std::to_string(c) + " " + std::to_string(hw) + "x" +
            std::to_string(hw),
        flops, [=] { return Conv3x3(n, c, hw); }, rounds);
  }
  std::printf("-- matmul MxK * KxN, work = FLOPs\n");
  for (auto [m, k, n] : {std::tuple{1, 64, 64},
                         {1, 256, 256},
                         {1, 784, 512},
                         {8, 512, 512},
                         {64, 512, 512},
                         {64, 784, 512}}) {
    Row(
        "matmul " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n),
        2.0 * m * k * n, [=] { return MatMul(m, k, n); }, rounds);
  }
  std::printf("-- relu and add, work = elements\n");
  for (int64_t elements : {1024, 4096, 16384, 32768, 65536, 131072, 262144, 1048576}) {
    Row(
        "relu " + std::to_string(elements), static_cast<double>(elements),
        [=] { return Relu(elements); }, rounds);
    Row(
        "add " + std::to_string(elements), static_cast<double>(elements),
        [=] { return Add(elements); }, rounds);
  }
  return 0;
}
