#pragma once
// Host entry points of the other translation units.
int part_a_run(float* d, int n);  // scales by 2 (TU-local constant), returns its launch count
int part_b_run(float* d, int n);  // scales by 3 (TU-local constant), returns its launch count
int part_a_counter();             // TU-local __device__ counter of part A
__global__ void b_public(int* out, int n);  // defined in part_b.cu, launched from main.cu
