// Micro-benchmarks of the compute kernels at Kimi K3's real dimensions, with the machine's
// memory read bandwidth measured by the same binary so every figure can be quoted as a fraction
// of it (DESIGN.md 5). Everything here is single-threaded unless the name says threads:2.
//
// Rates are per CPU second of the benchmark thread (Google Benchmark's default), not per wall
// second: on a shared machine the thread is sometimes descheduled, and CPU time leaves that out
// while still counting every stall on memory.
//
// "Cold" benchmarks rotate through a 1 GiB pool of copies of the weights, so the weights come
// from DRAM as they would for a freshly read expert, not from a cache that still holds them;
// "Hot" ones reuse one matrix (it then sits in L2/L3) and show the compute ceiling.
//
// Run: k3_bench_kernels --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
// (bench/kernels/summarize.py does that and prints medians as fractions of the bandwidth).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "bench/kernels/read_bandwidth.h"
#include "kernels/bf16.h"
#include "kernels/dispatch.h"
#include "kernels/mxfp4.h"
#include "kernels/ops.h"

namespace k3::bench {
namespace {

using kernels::Bf16Matrix;
using kernels::Mxfp4Matrix;

// Larger than any last-level cache this will run on.
constexpr size_t kPoolBytes = size_t{1} << 30;

// Real dimensions: an expert's w1/w3 (3072 x 3584) and a large trunk matrix (12288 x 7168).
constexpr size_t kExpertRows = 3072;
constexpr size_t kExpertCols = 3584;
constexpr size_t kTrunkRows = 12288;
constexpr size_t kTrunkCols = 7168;

// A page-aligned array, like the O_DIRECT buffers the engine reads weights into. Alignment
// matters here: on the development machine (Zen 5) streaming loads that straddle cache lines
// lose about a third of the read bandwidth, and std::vector's large blocks start 16 bytes into a
// page.
template <class T>
class AlignedArray {
 public:
  explicit AlignedArray(size_t n)
      : data_(static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t{4096}))), size_(n) {
    std::memset(data_.get(), 0, n * sizeof(T));  // touch every page before timing
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  std::span<T> span() { return {data(), size_}; }
  std::span<const T> span() const { return {data(), size_}; }

 private:
  struct Delete {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t{4096}); }
  };
  std::unique_ptr<T[], Delete> data_;
  size_t size_;
};

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void FillRandom(std::span<uint8_t> out, uint64_t seed) {
  uint64_t state = seed;
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    const uint64_t v = SplitMix64(state);
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < out.size(); ++i) out[i] = static_cast<uint8_t>(SplitMix64(state));
}

std::vector<float> RandomActivations(size_t n, uint64_t seed) {
  std::vector<float> x(n);
  uint64_t state = seed;
  for (float& v : x)
    v = static_cast<float>(static_cast<int64_t>(SplitMix64(state) >> 40) - (1 << 23)) / (1 << 23);
  return x;
}

// `count` copies of one random rows x cols MXFP4 matrix, back to back, scales drawn from the
// codes the released checkpoint uses (0x70..0x7A).
class Mxfp4Pool {
 public:
  Mxfp4Pool(size_t rows, size_t cols, size_t count)
      : rows_(rows),
        cols_(cols),
        count_(count),
        packed_(count * rows * cols / 2),
        scales_(count * rows * cols / kernels::kMxfp4GroupSize) {
    const size_t p = rows * cols / 2, s = rows * cols / kernels::kMxfp4GroupSize;
    FillRandom(packed_.span().first(p), 1);
    for (size_t i = 0; i < s; ++i) scales_.data()[i] = static_cast<uint8_t>(0x70 + (i * 7919) % 11);
    for (size_t c = 1; c < count; ++c) {
      std::memcpy(packed_.data() + c * p, packed_.data(), p);
      std::memcpy(scales_.data() + c * s, scales_.data(), s);
    }
  }
  size_t count() const { return count_; }
  size_t bytes_per_matrix() const { return rows_ * cols_ / 2 + rows_ * cols_ / 32; }
  Mxfp4Matrix Get(size_t i) const {
    const size_t p = rows_ * cols_ / 2, s = rows_ * cols_ / kernels::kMxfp4GroupSize;
    return {packed_.span().subspan(i * p, p), scales_.span().subspan(i * s, s), rows_, cols_};
  }

 private:
  size_t rows_, cols_, count_;
  AlignedArray<uint8_t> packed_, scales_;
};

class Bf16Pool {
 public:
  Bf16Pool(size_t rows, size_t cols, size_t count)
      : rows_(rows), cols_(cols), count_(count), data_(count * rows * cols) {
    const size_t n = rows * cols;
    // Random bf16 in [-1, 1): random mantissa, exponent 0x70..0x7E, random sign.
    uint64_t state = 3;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t r = SplitMix64(state);
      data_.data()[i] = static_cast<uint16_t>(((r & 1) << 15) | ((0x70 + (r >> 8) % 15) << 7) |
                                              ((r >> 16) & 0x7F));
    }
    for (size_t c = 1; c < count; ++c) std::memcpy(data_.data() + c * n, data_.data(), n * 2);
  }
  size_t count() const { return count_; }
  size_t bytes_per_matrix() const { return rows_ * cols_ * 2; }
  Bf16Matrix Get(size_t i) const {
    return {data_.span().subspan(i * rows_ * cols_, rows_ * cols_), rows_, cols_};
  }

 private:
  size_t rows_, cols_, count_;
  AlignedArray<uint16_t> data_;
};

const Mxfp4Pool& ExpertPool() {
  static const Mxfp4Pool* pool = [] {
    const size_t per = kExpertRows * kExpertCols / 2 + kExpertRows * kExpertCols / 32;
    return new Mxfp4Pool(kExpertRows, kExpertCols, kPoolBytes / per + 1);
  }();
  return *pool;
}

const Bf16Pool& TrunkPool() {
  static const Bf16Pool* pool = [] {
    const size_t per = kTrunkRows * kTrunkCols * 2;
    return new Bf16Pool(kTrunkRows, kTrunkCols, kPoolBytes / per + 1);
  }();
  return *pool;
}

void SetRates(benchmark::State& state, double bytes_per_iter, double flops_per_iter) {
  const auto iters = static_cast<double>(state.iterations());
  state.counters["bytes_per_second"] =
      benchmark::Counter(bytes_per_iter * iters, benchmark::Counter::kIsRate);
  if (flops_per_iter > 0) {
    state.counters["flops"] =
        benchmark::Counter(flops_per_iter * iters, benchmark::Counter::kIsRate);
  }
}

// ---------------------------------------------------------------------------------------------
// The reference: streaming read of a 1 GiB buffer (each thread reads its share).

void BM_ReadBandwidth(benchmark::State& state) {
  static const AlignedArray<float>* buffer = [] {
    auto* b = new AlignedArray<float>(kPoolBytes / sizeof(float));
    for (size_t i = 0; i < b->size(); ++i) b->data()[i] = static_cast<float>(i & 1023);
    return b;
  }();
  const size_t share = buffer->size() / static_cast<size_t>(state.threads());
  const float* begin = buffer->data() + share * static_cast<size_t>(state.thread_index());
  for (auto _ : state) benchmark::DoNotOptimize(SumFloats(begin, share));
  // Google Benchmark sums a rate counter over the threads and divides by the sum of their
  // times, so each thread reports all threads' bytes to get bytes per wall second.
  SetRates(state, static_cast<double>(share * sizeof(float) * state.threads()), 0);
}
BENCHMARK(BM_ReadBandwidth)->Unit(benchmark::kMillisecond)->Threads(1);
// Both cores at once, timed by the wall clock (the CPU time of two threads would add up).
BENCHMARK(BM_ReadBandwidth)->Unit(benchmark::kMillisecond)->UseRealTime()->Threads(2);

// ---------------------------------------------------------------------------------------------
// MXFP4.

void BM_Mxfp4MatVecCold(benchmark::State& state) {
  const Mxfp4Pool& pool = ExpertPool();
  const std::vector<float> x = RandomActivations(kExpertCols, 5);
  std::vector<float> y(kExpertRows);
  size_t i = 0;
  for (auto _ : state) {
    kernels::Mxfp4MatVec(pool.Get(i++ % pool.count()), x, y, 0, kExpertRows);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetRates(state, static_cast<double>(pool.bytes_per_matrix()), 2.0 * kExpertRows * kExpertCols);
}
BENCHMARK(BM_Mxfp4MatVecCold)->Name("BM_Mxfp4MatVecCold/3072x3584")->Unit(benchmark::kMicrosecond);

void BM_Mxfp4MatVecHot(benchmark::State& state) {
  const Mxfp4Pool& pool = ExpertPool();
  const std::vector<float> x = RandomActivations(kExpertCols, 5);
  std::vector<float> y(kExpertRows);
  for (auto _ : state) {
    kernels::Mxfp4MatVec(pool.Get(0), x, y, 0, kExpertRows);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetRates(state, static_cast<double>(pool.bytes_per_matrix()), 2.0 * kExpertRows * kExpertCols);
}
BENCHMARK(BM_Mxfp4MatVecHot)->Name("BM_Mxfp4MatVecHot/3072x3584")->Unit(benchmark::kMicrosecond);

// Arg: tokens. bytes_per_second counts the weight bytes (read once per call for all tokens).
// Cold cycles through a pool larger than the caches; Hot multiplies one matrix again and again
// (3072 x 3584 is 5.8 MB, so its bytes come from L3 or memory, but the activations are laid out
// once and the weights' pages stay mapped), which tells the kernel's own speed from the memory's.
void Mxfp4MatMulBench(benchmark::State& state, bool cold) {
  const size_t tokens = static_cast<size_t>(state.range(0));
  const Mxfp4Pool& pool = ExpertPool();
  const std::vector<float> x = RandomActivations(tokens * kExpertCols, 6);
  kernels::Mxfp4Activations laid_out;
  laid_out.Assign(x, tokens, kExpertCols);
  std::vector<float> y(tokens * kExpertRows);
  size_t i = 0;
  for (auto _ : state) {
    const Mxfp4Matrix w = pool.Get(cold ? i++ % pool.count() : 0);
    if (cold) {
      kernels::Mxfp4MatMul(w, x, tokens, y, 0, kExpertRows);
    } else {
      kernels::Mxfp4MatMul(w, laid_out, y, 0, kExpertRows);
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetRates(state, static_cast<double>(pool.bytes_per_matrix()),
           2.0 * static_cast<double>(tokens) * kExpertRows * kExpertCols);
}
void BM_Mxfp4MatMulCold(benchmark::State& state) { Mxfp4MatMulBench(state, true); }
void BM_Mxfp4MatMulHot(benchmark::State& state) { Mxfp4MatMulBench(state, false); }
BENCHMARK(BM_Mxfp4MatMulHot)
    ->Name("BM_Mxfp4MatMulHot/3072x3584")
    ->ArgName("T")
    ->Arg(40)
    ->Arg(64)
    ->Arg(256)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Mxfp4MatMulCold)
    ->Name("BM_Mxfp4MatMulCold/3072x3584")
    ->ArgName("T")
    ->Arg(1)
    ->Arg(4)
    ->Arg(16)
    ->Arg(40)  // a prefill chunk of 64 tokens gives each of its experts about 40
    ->Arg(64)
    ->Unit(benchmark::kMicrosecond);

// The per-expert 0xFF check: the scale bytes of one 3072 x 3584 matrix.
void BM_Mxfp4ScanScales(benchmark::State& state) {
  const Mxfp4Pool& pool = ExpertPool();
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(kernels::FindInvalidMxfp4Scale(pool.Get(i++ % pool.count()).scales));
  }
  SetRates(state, static_cast<double>(kExpertRows * kExpertCols / 32), 0);
}
BENCHMARK(BM_Mxfp4ScanScales)->Unit(benchmark::kMicrosecond);

void BM_Mxfp4DecodeRows(benchmark::State& state) {
  const Mxfp4Matrix w = ExpertPool().Get(0);
  std::vector<float> out(kExpertCols);
  const size_t rows = 64;
  for (auto _ : state) {
    for (size_t r = 0; r < rows; ++r) {
      kernels::DecodeMxfp4Row(w.packed.subspan(r * kExpertCols / 2, kExpertCols / 2),
                              w.scales.subspan(r * kExpertCols / 32, kExpertCols / 32), out);
      benchmark::DoNotOptimize(out.data());
    }
  }
  SetRates(state, static_cast<double>(rows * (kExpertCols / 2 + kExpertCols / 32)), 0);
}
BENCHMARK(BM_Mxfp4DecodeRows)->Unit(benchmark::kMicrosecond);

// ---------------------------------------------------------------------------------------------
// BF16.

void BM_Bf16MatVecCold(benchmark::State& state) {
  const Bf16Pool& pool = TrunkPool();
  const std::vector<float> x = RandomActivations(kTrunkCols, 7);
  std::vector<float> y(kTrunkRows);
  size_t i = 0;
  for (auto _ : state) {
    kernels::Bf16MatVec(pool.Get(i++ % pool.count()), x, y, 0, kTrunkRows);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetRates(state, static_cast<double>(pool.bytes_per_matrix()), 2.0 * kTrunkRows * kTrunkCols);
}
BENCHMARK(BM_Bf16MatVecCold)->Name("BM_Bf16MatVecCold/12288x7168")->Unit(benchmark::kMillisecond);

void BM_Bf16MatMulCold(benchmark::State& state) {
  const size_t tokens = static_cast<size_t>(state.range(0));
  const Bf16Pool& pool = TrunkPool();
  const std::vector<float> x = RandomActivations(tokens * kTrunkCols, 8);
  std::vector<float> y(tokens * kTrunkRows);
  size_t i = 0;
  for (auto _ : state) {
    kernels::Bf16MatMul(pool.Get(i++ % pool.count()), x, tokens, y, 0, kTrunkRows);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetRates(state, static_cast<double>(pool.bytes_per_matrix()),
           2.0 * static_cast<double>(tokens) * kTrunkRows * kTrunkCols);
}
BENCHMARK(BM_Bf16MatMulCold)
    ->Name("BM_Bf16MatMulCold/12288x7168")
    ->ArgName("T")
    ->Arg(4)
    ->Arg(16)
    ->Arg(64)
    ->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------------------------------------
// Small ops at their real widths.

void BM_SituGlu(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const std::vector<float> g = RandomActivations(n, 9), u = RandomActivations(n, 10);
  std::vector<float> out(n);
  for (auto _ : state) {
    kernels::SituGlu(g, u, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["elements_per_second"] =
      benchmark::Counter(static_cast<double>(n * state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SituGlu)->Arg(3072)->Arg(33792);

void BM_RmsNorm(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const std::vector<float> x = RandomActivations(n, 11), w = RandomActivations(n, 12);
  std::vector<float> out(n);
  for (auto _ : state) {
    kernels::RmsNorm(x, w, 1e-5f, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["elements_per_second"] =
      benchmark::Counter(static_cast<double>(n * state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_RmsNorm)->Arg(3584)->Arg(7168);

void BM_Dot(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const std::vector<float> a = RandomActivations(n, 13), b = RandomActivations(n, 14);
  for (auto _ : state) benchmark::DoNotOptimize(kernels::Dot(a, b));
  state.counters["elements_per_second"] =
      benchmark::Counter(static_cast<double>(n * state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Dot)->Arg(7168);

}  // namespace
}  // namespace k3::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("kernel_target", std::string(k3::kernels::ActiveKernelTarget()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
