// quota_probe: runs a script of device-memory steps given as arguments and prints one line
// per step, so that the control-plane tests can check a tenant's memory quota and SM share
// from the application's side.
//
//   alloc:MiB  cudaMalloc of MiB MiB, kept until `free`; prints "alloc MiB ok" or
//              "alloc MiB oom" (cudaErrorMemoryAllocation; any other error fails)
//   free       frees everything allocated so far; prints "free ok"
//   info       prints "info free=BYTES total=BYTES sms=N" (cudaMemGetInfo, SM count)
//   sleep:MS   sleeps MS milliseconds (keeps the session open)
//   touch:PATH creates the file PATH (tells the test a point was reached)
//   wait:PATH  waits until the file PATH exists (the test's go-ahead; the watchdog bounds it)
//
// Ends with "quota_probe: PASS". Valid under flyt-server --backend sim (no kernel runs).
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "e2e_common.h"

int main(int argc, char** argv) {
  e2e::Init("quota_probe", 120);
  std::vector<void*> held;
  for (int i = 1; i < argc; ++i) {
    std::string step = argv[i];
    std::string arg;
    size_t colon = step.find(':');
    if (colon != std::string::npos) {
      arg = step.substr(colon + 1);
      step = step.substr(0, colon);
    }
    if (step == "alloc") {
      e2e::Step("alloc");
      const size_t mib = static_cast<size_t>(std::strtoull(arg.c_str(), nullptr, 10));
      void* p = nullptr;
      cudaError_t err = cudaMalloc(&p, mib << 20);
      if (err == cudaSuccess) {
        held.push_back(p);
        printf("alloc %zu ok\n", mib);
      } else if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // not sticky: the session goes on
        printf("alloc %zu oom\n", mib);
      } else {
        e2e::Fail(__FILE__, __LINE__, "cudaMalloc(%zu MiB) returned %d (%s: %s)", mib,
                  static_cast<int>(err), cudaGetErrorName(err), cudaGetErrorString(err));
      }
    } else if (step == "free") {
      e2e::Step("free");
      for (void* p : held) CK(cudaFree(p));
      held.clear();
      printf("free ok\n");
    } else if (step == "info") {
      e2e::Step("info");
      size_t free_bytes = 0, total_bytes = 0;
      CK(cudaMemGetInfo(&free_bytes, &total_bytes));
      int sms = 0;
      CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
      printf("info free=%zu total=%zu sms=%d\n", free_bytes, total_bytes, sms);
    } else if (step == "sleep") {
      e2e::Step("sleep");
      usleep(static_cast<useconds_t>(std::strtoul(arg.c_str(), nullptr, 10)) * 1000u);
    } else if (step == "touch") {
      e2e::Step("touch");
      int fd = open(arg.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      EXPECT(fd >= 0, "cannot create %s", arg.c_str());
      close(fd);
      printf("touch ok\n");
    } else if (step == "wait") {
      e2e::Step("wait for the test's go-ahead file");
      while (access(arg.c_str(), F_OK) != 0) usleep(20000);
      printf("wait ok\n");
    } else {
      e2e::Fail(__FILE__, __LINE__, "unknown step '%s'", argv[i]);
    }
  }
  e2e::Step("teardown");
  for (void* p : held) CK(cudaFree(p));
  CK(cudaDeviceSynchronize());
  e2e::Pass();
  return 0;
}
