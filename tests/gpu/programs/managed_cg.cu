// managed_cg: a conjugate-gradient solver on managed memory, the way NVIDIA's
// conjugateGradientUM sample and teaching codes write it: the host builds a CSR
// matrix (1-D Laplacian plus a diagonal shift, 1M rows) and the right-hand side
// straight into cudaMallocManaged buffers; kernels do the SpMV, dot products
// (into a managed scalar) and vector updates; the host reads the scalar after
// each cudaDeviceSynchronize to compute alpha and beta. Prints the iteration
// count and the residual and solution checks (the residual against 1e-6: the
// iteration stops on 1e-20 of the first, about 6.5e-8 absolute on an H200), rounded (dot products
// use atomics, so the last bits may differ between runs).
#include <cmath>

#include "common.h"

__global__ void spmv(int n, const int* rowp, const int* col, const double* val, const double* x,
                     double* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double s = 0;
  for (int k = rowp[i]; k < rowp[i + 1]; ++k) s += val[k] * x[col[k]];
  y[i] = s;
}
__global__ void dot(int n, const double* a, const double* b, double* out) {
  __shared__ double part[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  part[threadIdx.x] = i < n ? a[i] * b[i] : 0;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, part[0]);
}
__global__ void axpy(int n, double a, const double* x, double* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}
__global__ void xpby(int n, const double* x, double b, double* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + b * y[i];
}

int main() {
  const int n = 1 << 20, nnz = 3 * n - 2;
  int *rowp, *col;
  double *val, *x, *r, *p, *ap, *b, *scalar;
  CHECK(cudaMallocManaged(&rowp, (n + 1) * sizeof(int)));
  CHECK(cudaMallocManaged(&col, nnz * sizeof(int)));
  CHECK(cudaMallocManaged(&val, nnz * sizeof(double)));
  CHECK(cudaMallocManaged(&x, n * sizeof(double)));
  CHECK(cudaMallocManaged(&r, n * sizeof(double)));
  CHECK(cudaMallocManaged(&p, n * sizeof(double)));
  CHECK(cudaMallocManaged(&ap, n * sizeof(double)));
  CHECK(cudaMallocManaged(&b, n * sizeof(double)));
  CHECK(cudaMallocManaged(&scalar, sizeof(double)));
  int k = 0;
  for (int i = 0; i < n; ++i) {  // tridiag(-1, 2.5, -1): SPD, well conditioned
    rowp[i] = k;
    if (i > 0) col[k] = i - 1, val[k++] = -1.0;
    col[k] = i, val[k++] = 2.5;
    if (i < n - 1) col[k] = i + 1, val[k++] = -1.0;
  }
  rowp[n] = k;
  for (int i = 0; i < n; ++i) {
    b[i] = 1.0 + (i % 7) * 0.125;
    x[i] = 0;
    r[i] = b[i];
    p[i] = b[i];
  }
  const int threads = 256, blocks = (n + threads - 1) / threads;
  *scalar = 0;
  dot<<<blocks, threads>>>(n, r, r, scalar);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  double rr = *scalar, rr0 = rr;
  int it = 0;
  for (; it < 200 && rr > 1e-20 * rr0; ++it) {
    spmv<<<blocks, threads>>>(n, rowp, col, val, p, ap);
    *scalar = 0;  // the host writes the scalar while the SpMV may run
    dot<<<blocks, threads>>>(n, p, ap, scalar);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    double alpha = rr / *scalar;
    axpy<<<blocks, threads>>>(n, alpha, p, x);
    axpy<<<blocks, threads>>>(n, -alpha, ap, r);
    *scalar = 0;
    dot<<<blocks, threads>>>(n, r, r, scalar);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    double rr_new = *scalar;
    xpby<<<blocks, threads>>>(n, r, rr_new / rr, p);
    rr = rr_new;
  }
  CHECK(cudaDeviceSynchronize());
  // Check on the host: |b - A x| from the managed data, and the sum of x.
  double err = 0, sum = 0;
  for (int i = 0; i < n; ++i) {
    double ax = 0;
    for (int q = rowp[i]; q < rowp[i + 1]; ++q) ax += val[q] * x[col[q]];
    err = fmax(err, fabs(ax - b[i]));
    sum += x[i];
  }
  printf("iterations=%d converged=%d max_residual_below_1e-6=%d sum_x=%.6e\n", it,
         rr <= 1e-20 * rr0 ? 1 : 0, err < 1e-6 ? 1 : 0, sum);
  EXPECT(err < 1e-6, "residual %g", err);
  for (void* q : {(void*)rowp, (void*)col, (void*)val, (void*)x, (void*)r, (void*)p, (void*)ap,
                  (void*)b, (void*)scalar})
    CHECK(cudaFree(q));
  printf("managed_cg: PASS\n");
  return 0;
}
