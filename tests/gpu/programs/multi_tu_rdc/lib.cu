// Relocatable device code: device functions and a __device__ variable used
// from another translation unit, resolved by the device linker.
#include "../common.h"

__device__ int g_bias = 5;

__device__ int lib_mix(int x) { return x * 7 + g_bias; }

__global__ void lib_set_bias(int b) { g_bias = b; }
