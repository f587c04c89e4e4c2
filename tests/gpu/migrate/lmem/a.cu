// Native probe: module global placement against local memory growth
// (tests/gpu/migrate/lmem/run.sh).
__device__ int ga[16];
extern "C" __global__ void deep(int* out, int n) {
  volatile int buf[4096];
  for (int i = 0; i < 4096; ++i) buf[i] = i * n;
  int s = 0;
  for (int i = 0; i < 4096; i += 97) s += buf[i];
  if (threadIdx.x == 0) out[blockIdx.x] = s + ga[0];
}
