// Process isolation: each client process has CUDA state of its own, as on a local GPU.
//
//   isolation work SECONDS   allocations, copies (byte-exact round trips), launches and
//                            synchronizations in a loop for SECONDS; must never see an error
//   isolation fault          launches flyt_sim_fault_kernel, which writes through a null
//                            pointer (the sim backend models it as a sticky fault): the
//                            synchronize and every later context call fail with
//                            cudaErrorIllegalAddress, while device queries still work
//   isolation hold MIB       allocates MIB MiB, prints "holding", then waits to be killed
//                            (or for a line on stdin, then frees and passes)
//   isolation alloc MIB      cudaMalloc of MIB MiB; prints the error name
// Under `flyt-server --backend sim` no kernel runs: nothing here reads a kernel's result.
#include <vector>

#include "e2e_common.h"

#define CHECK(call)                                                           \
  do {                                                                        \
    cudaError_t err_ = (call);                                                \
    if (err_ != cudaSuccess)                                                  \
      e2e::Fail(__FILE__, __LINE__, "%s: %s", #call, cudaGetErrorName(err_)); \
  } while (0)

__global__ void flyt_sim_fault_kernel(int* p) { *p = 42; }

__global__ void scale(float* x, int n, float f) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= f;
}

static double Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int Work(double seconds) {
  e2e::Step("work");
  const double end = Now() + seconds;
  int rounds = 0;
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  while (Now() < end || rounds < 3) {
    const size_t n = 4096 + 1024 * (rounds % 7);
    std::vector<unsigned char> in(n), out(n);
    e2e::Fill(in.data(), n, rounds + 1);
    void* d = nullptr;
    CHECK(cudaMalloc(&d, n));
    CHECK(cudaMemcpyAsync(d, in.data(), n, cudaMemcpyHostToDevice, s));
    scale<<<1, 32, 0, s>>>(static_cast<float*>(d), 0, 2.0f);  // n = 0: writes nothing
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(out.data(), d, n, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    long long diff = e2e::FirstDiff(in.data(), out.data(), n);
    if (diff >= 0) e2e::Fail(__FILE__, __LINE__, "round %d: byte %lld differs", rounds, diff);
    CHECK(cudaFree(d));
    CHECK(cudaDeviceSynchronize());
    ++rounds;
    usleep(2000);
  }
  CHECK(cudaStreamDestroy(s));
  printf("isolation: %s\n", rounds >= 3 ? "worked" : "too few rounds");
  e2e::Pass();
  return 0;
}

static int Fault() {
  e2e::Step("fault");
  int* d = nullptr;
  CHECK(cudaMalloc(&d, 4));
  CHECK(cudaDeviceSynchronize());
  flyt_sim_fault_kernel<<<1, 1>>>(nullptr);
  cudaError_t launch = cudaGetLastError();
  cudaError_t sync = cudaDeviceSynchronize();
  cudaError_t after = cudaMalloc(&d, 4);
  int count = -1;
  cudaError_t query = cudaGetDeviceCount(&count);
  printf("isolation fault: launch %s, synchronize %s, malloc after %s, device count %s\n",
         cudaGetErrorName(launch), cudaGetErrorName(sync), cudaGetErrorName(after),
         cudaGetErrorName(query));
  if (launch != cudaSuccess || sync != cudaErrorIllegalAddress || after != cudaErrorIllegalAddress)
    e2e::Fail(__FILE__, __LINE__, "not a sticky illegal-address fault");
  e2e::Pass();
  return 0;
}

static int Hold(size_t mib) {
  e2e::Step("hold");
  void* d = nullptr;
  CHECK(cudaMalloc(&d, mib << 20));
  CHECK(cudaMemset(d, 1, mib << 20));
  printf("holding %zu MiB\n", mib);
  char line[16];
  if (fgets(line, sizeof(line), stdin) == nullptr) pause();
  CHECK(cudaFree(d));
  e2e::Pass();
  return 0;
}

static int Alloc(size_t mib) {
  e2e::Step("alloc");
  void* d = nullptr;
  cudaError_t err = cudaMalloc(&d, mib << 20);
  printf("alloc %zu MiB: %s\n", mib, cudaGetErrorName(err));
  if (err == cudaSuccess) CHECK(cudaFree(d));
  e2e::Pass();
  return 0;
}

int main(int argc, char** argv) {
  e2e::Init("isolation", 0);
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "work" && argc == 3) return Work(atof(argv[2]));
  if (mode == "fault") return Fault();
  if (mode == "hold" && argc == 3) return Hold(strtoull(argv[2], nullptr, 10));
  if (mode == "alloc" && argc == 3) return Alloc(strtoull(argv[2], nullptr, 10));
  fprintf(stderr, "usage: isolation work SECONDS | fault | hold MIB | alloc MIB\n");
  return 2;
}
