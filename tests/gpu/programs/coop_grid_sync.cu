// coop_grid_sync: cooperative groups grid-wide synchronisation. The grid is
// sized from cudaOccupancyMaxActiveBlocksPerMultiprocessor and the SM count
// (every block resident), launched with cudaLaunchCooperativeKernel, and
// runs 20 stencil steps with grid.sync() between them over an array larger
// than the grid; a second launch goes through cudaLaunchKernelEx with the
// cooperative attribute. The result does not depend on the grid size.
#include <cooperative_groups.h>
#include <vector>
#include "common.h"

namespace cg = cooperative_groups;

__global__ void stencil_steps(unsigned int* a, unsigned int* b, int n, int steps,
                              unsigned long long* total) {
  cg::grid_group grid = cg::this_grid();
  for (int s = 0; s < steps; ++s) {
    const unsigned int* src = (s % 2 == 0) ? a : b;
    unsigned int* dst = (s % 2 == 0) ? b : a;
    for (int i = grid.thread_rank(); i < n; i += grid.size()) {
      unsigned int l = src[(i + n - 1) % n], c = src[i], r = src[(i + 1) % n];
      dst[i] = (l * 3u + c * 5u + r * 7u + static_cast<unsigned int>(s)) % 1000003u;
    }
    grid.sync();
  }
  // Final reduction after the last sync: every element is final.
  const unsigned int* fin = (steps % 2 == 0) ? a : b;
  unsigned long long acc = 0;
  for (int i = grid.thread_rank(); i < n; i += grid.size()) acc += fin[i];
  atomicAdd(total, acc);
}

int main() {
  int dev = 0, coop = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  EXPECT(coop == 1, "cooperative launch unsupported");
  const int threads = 256;
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, stencil_steps, threads, 0));
  EXPECT(per_sm >= 1, "occupancy");
  int blocks = per_sm * sms;

  const int n = (1 << 20) + 5, steps = 20;
  std::vector<unsigned int> h(n);
  for (int i = 0; i < n; ++i) h[i] = static_cast<unsigned int>((i * 2654435761u) % 1000003u);
  // CPU reference.
  std::vector<unsigned int> ra = h, rb(n);
  for (int s = 0; s < steps; ++s) {
    std::vector<unsigned int>& src = (s % 2 == 0) ? ra : rb;
    std::vector<unsigned int>& dst = (s % 2 == 0) ? rb : ra;
    for (int i = 0; i < n; ++i)
      dst[i] = (src[(i + n - 1) % n] * 3u + src[i] * 5u + src[(i + 1) % n] * 7u +
                static_cast<unsigned int>(s)) %
               1000003u;
  }
  const std::vector<unsigned int>& rfin = (steps % 2 == 0) ? ra : rb;
  unsigned long long rtotal = 0;
  for (unsigned int v : rfin) rtotal += v;

  unsigned int *da, *db;
  unsigned long long* dt;
  CHECK(cudaMalloc(&da, n * sizeof(unsigned int)));
  CHECK(cudaMalloc(&db, n * sizeof(unsigned int)));
  CHECK(cudaMalloc(&dt, sizeof(unsigned long long)));
  std::vector<unsigned int> out(n);

  for (int variant = 0; variant < 2; ++variant) {
    CHECK(cudaMemcpy(da, h.data(), n * sizeof(unsigned int), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(db, 0, n * sizeof(unsigned int)));
    CHECK(cudaMemset(dt, 0, sizeof(unsigned long long)));
    int nn = n, ss = steps;
    if (variant == 0) {
      void* args[] = {&da, &db, &nn, &ss, &dt};
      CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(stencil_steps), dim3(blocks),
                                        dim3(threads), args, 0, 0));
    } else {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(blocks / 2 > 0 ? blocks / 2 : 1);
      cfg.blockDim = dim3(threads);
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeCooperative;
      attr[0].val.cooperative = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      CHECK(cudaLaunchKernelEx(&cfg, stencil_steps, da, db, nn, ss, dt));
    }
    CHECK(cudaDeviceSynchronize());
    unsigned long long total = 0;
    CHECK(cudaMemcpy(&total, dt, sizeof(total), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(out.data(), (steps % 2 == 0) ? da : db, n * sizeof(unsigned int),
                     cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; ++i) bad += out[i] != rfin[i];
    printf("%s: steps=%d mismatches=%d total=%llu checksum=%016llx\n",
           variant == 0 ? "cudaLaunchCooperativeKernel" : "cudaLaunchKernelEx(cooperative)", steps,
           bad, total, (unsigned long long)fnv1a(out.data(), n * sizeof(unsigned int)));
    EXPECT(bad == 0 && total == rtotal, "grid sync result");
  }
  CHECK(cudaFree(da));
  CHECK(cudaFree(db));
  CHECK(cudaFree(dt));
  pass("coop_grid_sync");
  return 0;
}
