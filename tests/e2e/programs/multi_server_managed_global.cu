// multi_server_managed_global: a __managed__ variable of the program with the
// GPUs of two servers as one list (FLYT_SERVER "A,B"). Natively the variable is
// one per process and every GPU's kernels reach it. Through two servers each
// server would load its own copy of the program's code with a variable of its
// own, so Flyt refuses the code on the second server's GPU rather than let the
// two copies drift apart: the host writes the variable, device 0's kernel adds
// to it and the host reads the sum; a launch on device 1 answers
// cudaErrorNotSupported (not sticky), and device 0 goes on.
//
// Under the sim a __managed__ variable is not found (the sim has no module
// loader that knows them) and no kernel but flyt_sim_affine runs: the
// program says so ("not_managed_here") and checks nothing else. The GPU host's
// tests/gpu/run_multi_server.sh runs it against two `--backend cuda` servers.
// Prints key=value lines, then "multi_server_managed_global: PASS".
#include <cstdio>

#include "e2e_common.h"

__managed__ unsigned g_counter;

__global__ void bump_counter(unsigned add) { g_counter += add; }

int main() {
  e2e::Init("multi_server_managed_global");
  int devices = 0;
  CK(cudaGetDeviceCount(&devices));
  EXPECT(devices == 2, "two devices (one per server), got %d", devices);
  CK(cudaSetDevice(0));
  void* addr = nullptr;
  cudaPointerAttributes pa{};
  const cudaError_t found = cudaGetSymbolAddress(&addr, g_counter);  // the sim knows none
  cudaGetLastError();
  if (found == cudaSuccess) CK(cudaPointerGetAttributes(&pa, addr));
  if (found != cudaSuccess || pa.type != cudaMemoryTypeManaged) {
    printf("managed_global=not_managed_here\n");
    e2e::Pass();
    return 0;
  }
  e2e::Step("the variable on device 0");
  g_counter = 5;
  bump_counter<<<1, 1>>>(3);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  printf("managed_global.device0=%u\n", g_counter);
  EXPECT(g_counter == 8, "5 + 3, got %u", g_counter);

  e2e::Step("the code on device 1");
  CK(cudaSetDevice(1));
  bump_counter<<<1, 1>>>(1);
  const cudaError_t on_second = cudaGetLastError();
  printf("managed_global.device1=%s\n", cudaGetErrorName(on_second));
  EXPECT(on_second == cudaErrorNotSupported, "refused on the second server's GPU, got %s",
         cudaGetErrorName(on_second));
  CK(cudaDeviceSynchronize());  // not sticky

  e2e::Step("device 0 goes on");
  CK(cudaSetDevice(0));
  bump_counter<<<1, 1>>>(3);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  printf("managed_global.after=%u\n", g_counter);
  EXPECT(g_counter == 11, "8 + 3, got %u", g_counter);
  e2e::Pass();
  return 0;
}
