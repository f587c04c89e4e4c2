// sm_share: which SMs a tenant's kernels run on under Flyt's SM share
// (flyt-server --sm-count, and set-share on its control socket while it runs).
// Flyt-only: its output depends on the share, so it is not compared with a
// native run (tests/gpu/run_sm_share.sh runs it; build.sh builds it into
// OUTDIR/flyt-only/).
//
// Usage: sm_share SECONDS [stream]
// With `stream`, the work goes to a stream and an event the program created
// before the loop, so a live change must move them (handles stay valid).
// About every 200 ms for SECONDS it launches a kernel of many blocks, each
// recording the SM it ran on (%smid) and spinning a little so that blocks
// spread over every SM they may use, and prints one line:
//   sample t_ms=T sms_used=U attr_sm=A mem_free=F mem_total=M
// where U is the number of distinct SMs the kernel used, A the device's
// MULTIPROCESSOR_COUNT attribute as the app sees it and F/M cudaMemGetInfo.
// Then it asks for more memory than cudaMemGetInfo's total and prints
//   over_quota_alloc=<error name>   (cudaErrorMemoryAllocation expected)
// Exit status: 0 when every sample had U <= A and the allocation failed with
// cudaErrorMemoryAllocation; 1 when a CUDA call failed; 2 otherwise.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "programs/common.h"  // CHECK

namespace {

constexpr int kMaxSm = 1024;
constexpr int kBlocks = 4096;
constexpr int kThreads = 128;

__global__ void RecordSm(int* sm_of_block, long long spin_cycles) {
  if (threadIdx.x == 0) {
    unsigned id = 0;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    sm_of_block[blockIdx.x] = static_cast<int>(id);
  }
  long long start = clock64();
  while (clock64() - start < spin_cycles) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 2 && argc != 3) {
    fprintf(stderr, "usage: sm_share SECONDS [stream]\n");
    return 2;
  }
  const int seconds = atoi(argv[1]);
  CHECK(cudaSetDevice(0));
  const bool own_stream = argc == 3 && std::string(argv[2]) == "stream";
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  if (own_stream) {
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&done));
  }
  int* d_sm = nullptr;
  CHECK(cudaMalloc(&d_sm, kBlocks * sizeof(int)));
  std::vector<int> sm_of_block(kBlocks);
  bool over_share = false;
  auto t0 = std::chrono::steady_clock::now();
  auto deadline = t0 + std::chrono::seconds(seconds);
  do {
    // A synchronous call first: after a live change the client library learns
    // the new share with its reply, before the attribute is read.
    size_t mem_free = 0, mem_total = 0;
    CHECK(cudaMemGetInfo(&mem_free, &mem_total));
    int attr_sm = 0;
    CHECK(cudaDeviceGetAttribute(&attr_sm, cudaDevAttrMultiProcessorCount, 0));
    if (own_stream) {
      CHECK(cudaMemsetAsync(d_sm, 0xff, kBlocks * sizeof(int), stream));
      RecordSm<<<kBlocks, kThreads, 0, stream>>>(d_sm, 20000);
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(done, stream));
      CHECK(cudaEventSynchronize(done));
      CHECK(cudaMemcpyAsync(sm_of_block.data(), d_sm, kBlocks * sizeof(int), cudaMemcpyDeviceToHost,
                            stream));
      CHECK(cudaStreamSynchronize(stream));
    } else {
      CHECK(cudaMemset(d_sm, 0xff, kBlocks * sizeof(int)));
      RecordSm<<<kBlocks, kThreads>>>(d_sm, 20000);
      CHECK(cudaGetLastError());
      CHECK(cudaMemcpy(sm_of_block.data(), d_sm, kBlocks * sizeof(int), cudaMemcpyDeviceToHost));
    }
    std::vector<bool> used(kMaxSm, false);
    int distinct = 0;
    for (int id : sm_of_block) {
      if (id >= 0 && id < kMaxSm && !used[id]) {
        used[id] = true;
        ++distinct;
      }
    }
    long long t_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    printf("sample t_ms=%lld sms_used=%d attr_sm=%d mem_free=%zu mem_total=%zu\n", t_ms, distinct,
           attr_sm, mem_free, mem_total);
    if (distinct > attr_sm) {
      printf("over_share t_ms=%lld sms_used=%d attr_sm=%d\n", t_ms, distinct, attr_sm);
      over_share = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (std::chrono::steady_clock::now() < deadline);

  size_t mem_free = 0, mem_total = 0;
  CHECK(cudaMemGetInfo(&mem_free, &mem_total));
  void* big = nullptr;
  cudaError_t err = cudaMalloc(&big, mem_total + (1u << 20));
  printf("over_quota_alloc=%s\n", cudaGetErrorName(err));
  bool oom_ok = err == cudaErrorMemoryAllocation;
  if (err == cudaSuccess) CHECK(cudaFree(big));
  (void)cudaGetLastError();  // the failed allocation is not sticky
  if (own_stream) {
    CHECK(cudaEventDestroy(done));
    CHECK(cudaStreamDestroy(stream));
  }
  CHECK(cudaFree(d_sm));
  CHECK(cudaDeviceSynchronize());
  if (over_share || !oom_ok) {
    printf("sm_share: FAIL\n");
    return 2;
  }
  printf("sm_share: PASS\n");
  return 0;
}
