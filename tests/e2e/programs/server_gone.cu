// server_gone: allocates and copies while the server is up, prints "ready", waits until
// the file named by argv[1] exists (the harness kills the server, then creates it), then
// calls cudaMemcpy and cudaMalloc and prints the errors they return with the time each
// took. Exit 0 when the copy failed (the expected outcome), 1 when it claimed success.
// It must never hang: FLYT_TIMEOUT_MS bounds how long the client waits for the server.
#include <sys/stat.h>
#include <time.h>

#include <vector>

#include "e2e_common.h"

namespace {

long long NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

}  // namespace

int main(int argc, char** argv) {
  e2e::Init("server_gone", 120);
  if (argc != 2) {
    fprintf(stderr, "usage: %s TRIGGER_FILE\n", argv[0]);
    return 2;
  }
  const size_t n = 1 << 20;
  std::vector<unsigned char> src(n), got(n, 0);
  e2e::Fill(src.data(), n, 5);

  e2e::Step("work while the server is up");
  unsigned char* d = nullptr;
  CK(cudaMalloc(&d, n));
  CK(cudaMemcpy(d, src.data(), n, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(got.data(), d, n, cudaMemcpyDeviceToHost));
  EXPECT_SAME(got.data(), src.data(), n, "round trip before the server went away");
  printf("ready\n");
  fflush(stdout);

  e2e::Step("waiting for the trigger file");
  struct stat st;
  while (stat(argv[1], &st) != 0) {
    timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }

  e2e::Step("cudaMemcpy after the server died");
  long long t0 = NowMs();
  cudaError_t err = cudaMemcpy(got.data(), d, n, cudaMemcpyDeviceToHost);
  long long t1 = NowMs();
  printf("memcpy_error=%d %s elapsed_ms=%lld\n", static_cast<int>(err), cudaGetErrorName(err),
         t1 - t0);
  fflush(stdout);

  e2e::Step("cudaMalloc after the server died");
  unsigned char* d2 = nullptr;
  cudaError_t err2 = cudaMalloc(&d2, n);
  long long t2 = NowMs();
  printf("malloc_error=%d %s elapsed_ms=%lld\n", static_cast<int>(err2), cudaGetErrorName(err2),
         t2 - t1);
  fflush(stdout);

  e2e::Step("exit");
  if (err == cudaSuccess) {
    printf("server_gone: FAIL cudaMemcpy succeeded after the server was killed\n");
    return 1;
  }
  printf("server_gone: PASS\n");
  return 0;
}
