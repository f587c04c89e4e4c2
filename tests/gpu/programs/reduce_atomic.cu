// reduce_atomic: block reductions in shared memory and with warp shuffles,
// finished with global atomics (64-bit add, int min/max, float add on exact
// values, and/or/xor, atomicCAS loops, atomicExch, atomicInc), plus a
// 256-bin histogram with shared-memory atomics. All compared with the CPU.
#include <vector>
#include "common.h"

struct Results {
  unsigned long long sum;
  int vmin, vmax;
  float fcount;
  unsigned int and_all, or_all, xor_all;
  unsigned long long cas_max;   // max of 64-bit keys via atomicCAS
  int exch_seen;                // atomicExch
  unsigned int inc_wrap;        // atomicInc wraps at 1000
  unsigned long long shfl_sum;  // warp shuffle reduction
};

__global__ void reduce_shared(const int* in, int n, Results* r) {
  __shared__ long long s[256];
  long long acc = 0;
  int lmin = 0x7fffffff, lmax = -0x7fffffff - 1;
  unsigned int land = 0xffffffffu, lor = 0, lxor = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    int v = in[i];
    acc += v;
    lmin = min(lmin, v);
    lmax = max(lmax, v);
    unsigned int u = static_cast<unsigned int>(v) | 0x100u;
    land &= u;
    lor |= u;
    lxor ^= static_cast<unsigned int>(v);
  }
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(&r->sum, static_cast<unsigned long long>(s[0]));
  atomicMin(&r->vmin, lmin);
  atomicMax(&r->vmax, lmax);
  atomicAnd(&r->and_all, land);
  atomicOr(&r->or_all, lor);
  atomicXor(&r->xor_all, lxor);
}

__global__ void reduce_shuffle(const int* in, int n, Results* r) {
  unsigned long long acc = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    acc += static_cast<unsigned long long>(static_cast<long long>(in[i]));
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
  if ((threadIdx.x & 31) == 0) atomicAdd(&r->shfl_sum, acc);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (in[i] % 7 == 0) atomicAdd(&r->fcount, 1.0f);
}

__global__ void cas_max_kernel(const int* in, int n, Results* r) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    unsigned long long key =
        (static_cast<unsigned long long>(static_cast<unsigned int>(in[i])) << 32) |
        static_cast<unsigned int>(i);
    unsigned long long old = r->cas_max;
    while (old < key) {
      unsigned long long prev = atomicCAS(&r->cas_max, old, key);
      if (prev == old) break;
      old = prev;
    }
    if (i == 12345) atomicExch(&r->exch_seen, in[i]);
    atomicInc(&r->inc_wrap, 999u);
  }
}

__global__ void histogram(const int* in, int n, unsigned int* bins) {
  __shared__ unsigned int local[256];
  for (int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    atomicAdd(&local[static_cast<unsigned int>(in[i]) & 255u], 1u);
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += blockDim.x) atomicAdd(&bins[b], local[b]);
}

int main() {
  const int n = 10 * 1000 * 1000 + 17;
  std::vector<int> h(n);
  Rng rng(777);
  for (int i = 0; i < n; ++i) h[i] = rng.range(-1000000, 1000000);

  // CPU reference.
  Results ref{};
  ref.vmin = 0x7fffffff;
  ref.vmax = -0x7fffffff - 1;
  ref.and_all = 0xffffffffu;
  long long s = 0;
  unsigned long long cnt7 = 0, casmax = 0;
  std::vector<unsigned int> rbins(256, 0);
  for (int i = 0; i < n; ++i) {
    int v = h[i];
    s += v;
    ref.vmin = v < ref.vmin ? v : ref.vmin;
    ref.vmax = v > ref.vmax ? v : ref.vmax;
    unsigned int u = static_cast<unsigned int>(v) | 0x100u;
    ref.and_all &= u;
    ref.or_all |= u;
    ref.xor_all ^= static_cast<unsigned int>(v);
    if (v % 7 == 0) ++cnt7;
    unsigned long long key = (static_cast<unsigned long long>(static_cast<unsigned int>(v)) << 32) |
                             static_cast<unsigned int>(i);
    if (key > casmax) casmax = key;
    rbins[static_cast<unsigned int>(v) & 255u]++;
  }
  ref.sum = static_cast<unsigned long long>(s);
  ref.shfl_sum = ref.sum;
  ref.fcount = static_cast<float>(cnt7);
  ref.cas_max = casmax;
  ref.exch_seen = h[12345];
  ref.inc_wrap = static_cast<unsigned int>(n % 1000);

  int* d;
  Results* dr;
  unsigned int* dbins;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  CHECK(cudaMalloc(&dr, sizeof(Results)));
  CHECK(cudaMalloc(&dbins, 256 * sizeof(unsigned int)));
  CHECK(cudaMemcpy(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  Results init{};
  init.vmin = 0x7fffffff;
  init.vmax = -0x7fffffff - 1;
  init.and_all = 0xffffffffu;
  CHECK(cudaMemcpy(dr, &init, sizeof(init), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dbins, 0, 256 * sizeof(unsigned int)));

  reduce_shared<<<120, 256>>>(d, n, dr);
  CHECK_LAUNCH();
  reduce_shuffle<<<97, 224>>>(d, n, dr);
  CHECK_LAUNCH();
  cas_max_kernel<<<64, 256>>>(d, n, dr);
  CHECK_LAUNCH();
  histogram<<<80, 512>>>(d, n, dbins);
  CHECK_LAUNCH();
  Results got;
  std::vector<unsigned int> bins(256);
  CHECK(cudaMemcpy(&got, dr, sizeof(got), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(bins.data(), dbins, 256 * sizeof(unsigned int), cudaMemcpyDeviceToHost));

  printf("n=%d sum=%lld min=%d max=%d\n", n, static_cast<long long>(got.sum), got.vmin, got.vmax);
  printf("and=%08x or=%08x xor=%08x count7=%.0f\n", got.and_all, got.or_all, got.xor_all,
         got.fcount);
  printf("cas_max=%016llx exch=%d inc_wrap=%u shfl_sum=%lld\n", got.cas_max, got.exch_seen,
         got.inc_wrap, static_cast<long long>(got.shfl_sum));
  printf("hist_checksum=%016llx\n", (unsigned long long)fnv1a(bins.data(), bins.size() * 4));
  EXPECT(got.sum == ref.sum, "sum %lld vs %lld", (long long)got.sum, (long long)ref.sum);
  EXPECT(got.shfl_sum == ref.shfl_sum, "shuffle sum");
  EXPECT(got.vmin == ref.vmin && got.vmax == ref.vmax, "min/max");
  EXPECT(got.and_all == ref.and_all && got.or_all == ref.or_all && got.xor_all == ref.xor_all,
         "bit ops");
  EXPECT(got.fcount == ref.fcount, "float count %.0f vs %.0f", got.fcount, ref.fcount);
  EXPECT(got.cas_max == ref.cas_max, "cas max");
  EXPECT(got.exch_seen == ref.exch_seen, "exch");
  EXPECT(got.inc_wrap == ref.inc_wrap, "inc wrap %u vs %u", got.inc_wrap, ref.inc_wrap);
  EXPECT(bins == rbins, "histogram");
  CHECK(cudaFree(d));
  CHECK(cudaFree(dr));
  CHECK(cudaFree(dbins));
  pass("reduce_atomic");
  return 0;
}
