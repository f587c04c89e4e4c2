// Native probe: module global placement against local memory growth
// (tests/gpu/migrate/lmem/run.sh).
__device__ int gb[16];
extern "C" __global__ void touch(int* out) { out[0] = gb[0]; }
