// managed_atomics: system-scope atomics on managed memory, as the
// systemWideAtomics sample uses them: many blocks apply atomicAdd_system,
// atomicMax_system, atomicCAS_system, atomicExch_system and atomicOr_system to
// managed counters that the host initialises and checks after
// cudaDeviceSynchronize; the host adds to them between kernels, and a host
// write just before a launch is what the kernel reads.
#include "common.h"

__global__ void atomics(int* c, unsigned* bits, int* order, int flag_expected) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (c[5] != flag_expected) return;  // the host's last write before the launch
  atomicAdd_system(&c[0], 1);
  atomicMax_system(&c[1], t);
  atomicOr_system(&bits[t % 32 / 32], 1u << (t % 32));
  int prev = atomicCAS_system(&c[2], 0, t + 1);
  if (prev == 0) atomicExch_system(&c[3], t + 1);
  order[t] = atomicAdd_system(&c[4], 1) >= 0;
}

int main() {
  int dev = 0, concurrent = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev));
  const int blocks = 512, threads = 256, total = blocks * threads;
  int *c, *order;
  unsigned* bits;
  CHECK(cudaMallocManaged(&c, 8 * sizeof(int)));
  CHECK(cudaMallocManaged(&bits, sizeof(unsigned)));
  CHECK(cudaMallocManaged(&order, total * sizeof(int)));
  for (int i = 0; i < 8; ++i) c[i] = 0;
  *bits = 0;
  int adds = 0;
  for (int round = 1; round <= 5; ++round) {
    c[5] = round;  // the kernel runs only if it sees this
    c[0] += 1000;  // host adds between kernels
    adds += 1000;
    atomics<<<blocks, threads>>>(c, bits, order, round);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    adds += total;
  }
  int ordered = 0;
  for (int i = 0; i < total; ++i) ordered += order[i];
  printf(
      "concurrent=%d add=%d want=%d max=%d cas_set=%d exch_matches=%d bits=%08x counted=%d "
      "ordered=%d\n",
      concurrent, c[0], adds, c[1], c[2] != 0, c[3] == c[2], *bits, c[4], ordered);
  EXPECT(c[0] == adds && c[1] == total - 1 && c[4] == 5 * total && ordered == total,
         "atomics lost updates");
  CHECK(cudaFree(c));
  CHECK(cudaFree(bits));
  CHECK(cudaFree(order));
  printf("managed_atomics: PASS\n");
  return 0;
}
