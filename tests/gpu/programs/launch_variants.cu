// launch_variants: launch shapes and Hopper launch features. 3D grids and
// blocks; grid.x above 65535; a kernel without parameters; thread-block
// clusters (compile-time __cluster_dims__ with <<<>>>, and run-time cluster
// dimensions through cudaLaunchKernelEx) using cluster.sync() and distributed
// shared memory (map_shared_rank); cudaOccupancyMaxActiveClusters;
// programmatic dependent launch (cudaLaunchAttributeProgrammaticStreamSerialization
// + cudaGridDependencySynchronize); a launch-priority attribute.
#include <cooperative_groups.h>
#include <vector>
#include "common.h"

namespace cg = cooperative_groups;

__device__ int d_noarg_hits;

__global__ void noarg() { atomicAdd(&d_noarg_hits, 1); }

__global__ void ids3d(int* out) {
  int bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  int tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  int nt = blockDim.x * blockDim.y * blockDim.z;
  out[bx * nt + tx] = bx * 1000 + tx;
}

__global__ void wide(unsigned int* count) {
  if (threadIdx.x == 0) atomicAdd(count, blockIdx.x % 3);
}

// Each block fills its shared memory; then reads its neighbour's in the cluster.
__device__ void dsmem_body(int* out) {
  __shared__ int smem[128];
  cg::cluster_group cluster = cg::this_cluster();
  unsigned int rank = cluster.block_rank();
  smem[threadIdx.x] = static_cast<int>(blockIdx.x) * 1000 + threadIdx.x;
  cluster.sync();
  unsigned int peer = (rank + 1) % cluster.num_blocks();
  int* remote = cluster.map_shared_rank(smem, peer);
  out[blockIdx.x * blockDim.x + threadIdx.x] =
      remote[threadIdx.x] + static_cast<int>(cluster.num_blocks()) * 1000000;
  cluster.sync();  // keep shared memory alive until every peer has read it
}

__global__ void __cluster_dims__(2, 1, 1) cluster_static(int* out) { dsmem_body(out); }
__global__ void cluster_dynamic(int* out) { dsmem_body(out); }

__global__ void pdl_producer(int* buf, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) buf[i] = i * 2;
  cudaTriggerProgrammaticLaunchCompletion();
}
__global__ void pdl_consumer(const int* buf, int* out, int n) {
  cudaGridDependencySynchronize();
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = buf[i] + 1;
}

static int check_cluster(const std::vector<int>& o, int blocks, int cs) {
  int bad = 0;
  for (int b = 0; b < blocks; ++b) {
    int base = (b / cs) * cs;
    int peer = base + ((b - base) + 1) % cs;
    for (int t = 0; t < 128; ++t) bad += o[b * 128 + t] != peer * 1000 + t + cs * 1000000;
  }
  return bad;
}

int main() {
  int bad = 0;
  // 3D shapes.
  dim3 grid(3, 4, 5), block(8, 4, 2);
  const int total = 3 * 4 * 5 * 8 * 4 * 2;
  int* d;
  CHECK(cudaMalloc(&d, total * sizeof(int)));
  ids3d<<<grid, block>>>(d);
  CHECK_LAUNCH();
  std::vector<int> h(total);
  CHECK(cudaMemcpy(h.data(), d, total * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < total; ++i) bad += h[i] != (i / 64) * 1000 + i % 64;
  printf("3d launch mismatches=%d\n", bad);

  // More than 65535 blocks in x.
  unsigned int* cnt;
  CHECK(cudaMalloc(&cnt, sizeof(unsigned int)));
  CHECK(cudaMemset(cnt, 0, sizeof(unsigned int)));
  const unsigned int nb = (1u << 20) + 3;
  wide<<<nb, 32>>>(cnt);
  CHECK_LAUNCH();
  unsigned int c = 0, ce = 0;
  CHECK(cudaMemcpy(&c, cnt, sizeof(c), cudaMemcpyDeviceToHost));
  for (unsigned int b = 0; b < nb; ++b) ce += b % 3;
  printf("wide grid blocks=%u sum=%u %s\n", nb, c, c == ce ? "ok" : "MISMATCH");
  bad += c != ce;

  // No parameters.
  int zero = 0, hits = 0;
  CHECK(cudaMemcpyToSymbol(d_noarg_hits, &zero, sizeof(int)));
  noarg<<<7, 33>>>();
  CHECK_LAUNCH();
  CHECK(cudaMemcpyFromSymbol(&hits, d_noarg_hits, sizeof(int)));
  printf("noarg hits=%d\n", hits);
  bad += hits != 7 * 33;

  // Clusters.
  const int blocks = 16;
  int* dc;
  CHECK(cudaMalloc(&dc, blocks * 128 * sizeof(int)));
  std::vector<int> o(blocks * 128);
  cluster_static<<<blocks, 128>>>(dc);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(o.data(), dc, o.size() * sizeof(int), cudaMemcpyDeviceToHost));
  int bc = check_cluster(o, blocks, 2);
  printf("cluster_dims(2) mismatches=%d\n", bc);
  bad += bc;

  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(128);
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = 4;
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributePriority;
  attrs[1].val.priority = 0;
  cfg.attrs = attrs;
  cfg.numAttrs = 2;
  int clusters = 0;
  CHECK(cudaOccupancyMaxActiveClusters(&clusters, cluster_dynamic, &cfg));
  EXPECT(clusters > 0, "max active clusters");
  CHECK(cudaMemset(dc, 0, o.size() * sizeof(int)));
  CHECK(cudaLaunchKernelEx(&cfg, cluster_dynamic, dc));
  CHECK(cudaMemcpy(o.data(), dc, o.size() * sizeof(int), cudaMemcpyDeviceToHost));
  bc = check_cluster(o, blocks, 4);
  printf("cudaLaunchKernelEx cluster(4) mismatches=%d\n", bc);
  bad += bc;

  // Programmatic dependent launch.
  const int n = 1 << 16;
  int *buf, *out;
  CHECK(cudaMalloc(&buf, n * sizeof(int)));
  CHECK(cudaMalloc(&out, n * sizeof(int)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  pdl_producer<<<n / 256, 256, 0, s>>>(buf, n);
  CHECK_LAUNCH();
  cudaLaunchConfig_t pc = {};
  pc.gridDim = dim3(n / 256);
  pc.blockDim = dim3(256);
  pc.stream = s;
  cudaLaunchAttribute pa[1];
  pa[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pa[0].val.programmaticStreamSerializationAllowed = 1;
  pc.attrs = pa;
  pc.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&pc, pdl_consumer, static_cast<const int*>(buf), out, n));
  std::vector<int> ho(n);
  CHECK(cudaMemcpyAsync(ho.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  int bp = 0;
  for (int i = 0; i < n; ++i) bp += ho[i] != i * 2 + 1;
  printf("programmatic dependent launch mismatches=%d\n", bp);
  bad += bp;

  EXPECT(bad == 0, "launch variants");
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(d));
  CHECK(cudaFree(cnt));
  CHECK(cudaFree(dc));
  CHECK(cudaFree(buf));
  CHECK(cudaFree(out));
  pass("launch_variants");
  return 0;
}
