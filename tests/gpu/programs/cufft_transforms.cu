// cufft_transforms: cuFFT as applications call it: 1D C2C forward and inverse, R2C/C2R
// round trip, 2D and 3D C2C, batched plans through cufftPlanMany with strides, Z2Z in
// double precision, sizes that need different kernels (powers of two, 3*5*7 products,
// a large prime that takes the Bluestein path), a plan on a created stream with a
// user-provided work area, and plan reuse. Results are checked against a CPU DFT; the
// output is the verdict per case and the CPU reference checksum (deterministic).
// FLYT_LIBS: -lcufft
#include <cufft.h>
#include <cmath>
#include <complex>
#include <vector>
#include "common.h"

#define CUFFT_CHECK(call)                                                                        \
  do {                                                                                           \
    cufftResult st_ = (call);                                                                    \
    if (st_ != CUFFT_SUCCESS) {                                                                  \
      printf("cuFFT error %d in %s:%d: %s\n", static_cast<int>(st_), __FILE__, __LINE__, #call); \
      fflush(stdout);                                                                            \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

using cd = std::complex<double>;

// Naive DFT of one line (sign -1 forward, +1 inverse, unnormalised).
static std::vector<cd> dft(const std::vector<cd>& x, int sign) {
  const size_t n = x.size();
  std::vector<cd> y(n);
  for (size_t k = 0; k < n; ++k) {
    cd s = 0;
    for (size_t j = 0; j < n; ++j) {
      double a = sign * 2.0 * M_PI * static_cast<double>((k * j) % n) / static_cast<double>(n);
      s += x[j] * cd(std::cos(a), std::sin(a));
    }
    y[k] = s;
  }
  return y;
}

// Multi-dimensional DFT over a row-major array of `dims`, one axis at a time.
static std::vector<cd> dftnd(std::vector<cd> x, const std::vector<int>& dims, int sign) {
  size_t total = x.size();
  size_t inner = total;
  for (size_t d = 0; d < dims.size(); ++d) {
    size_t n = dims[d];
    inner /= n;
    size_t outer = total / (n * inner);
    for (size_t o = 0; o < outer; ++o)
      for (size_t i = 0; i < inner; ++i) {
        std::vector<cd> line(n);
        for (size_t k = 0; k < n; ++k) line[k] = x[(o * n + k) * inner + i];
        line = dft(line, sign);
        for (size_t k = 0; k < n; ++k) x[(o * n + k) * inner + i] = line[k];
      }
  }
  return x;
}

static std::vector<cd> input(size_t n, int seed) {
  std::vector<cd> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = cd(std::sin(0.37 * static_cast<double>(i) + seed),
              std::cos(0.11 * static_cast<double>(i * i % 97) - seed));
  return v;
}

static double checksum(const std::vector<cd>& v) {
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += std::abs(v[i]) * static_cast<double>(i % 7 + 1);
  return s;
}

static int failures = 0;

template <typename C>
static void verdict(const char* name, const std::vector<cd>& ref, const std::vector<C>& got,
                    double scale, double tol) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    cd g(got[i].x, got[i].y);
    err = std::fmax(err, std::abs(g * scale - ref[i]));
    mag = std::fmax(mag, std::abs(ref[i]));
  }
  bool ok = err <= tol * std::fmax(1.0, mag);
  if (!ok) ++failures;
  printf("%s: %s ref_checksum=%.3f\n", name, ok ? "PASS" : "FAIL", checksum(ref));
  if (!ok) fprintf(stderr, "%s: max error %g (magnitude %g)\n", name, err, mag);
}

// 1D/ND single-precision C2C, forward then inverse on the same plan.
static void c2c(const char* name, std::vector<int> dims, int batch) {
  size_t per = 1;
  for (int d : dims) per *= static_cast<size_t>(d);
  size_t total = per * static_cast<size_t>(batch);
  std::vector<cd> x = input(total, static_cast<int>(dims[0]));
  std::vector<cufftComplex> h(total);
  for (size_t i = 0; i < total; ++i)
    h[i] = {static_cast<float>(x[i].real()), static_cast<float>(x[i].imag())};
  cufftComplex* d = nullptr;
  CHECK(cudaMalloc(&d, total * sizeof(cufftComplex)));
  CHECK(cudaMemcpy(d, h.data(), total * sizeof(cufftComplex), cudaMemcpyHostToDevice));
  cufftHandle plan;
  if (batch == 1 && dims.size() == 1) {
    CUFFT_CHECK(cufftPlan1d(&plan, dims[0], CUFFT_C2C, 1));
  } else if (batch == 1 && dims.size() == 2) {
    CUFFT_CHECK(cufftPlan2d(&plan, dims[0], dims[1], CUFFT_C2C));
  } else if (batch == 1 && dims.size() == 3) {
    CUFFT_CHECK(cufftPlan3d(&plan, dims[0], dims[1], dims[2], CUFFT_C2C));
  } else {
    CUFFT_CHECK(cufftPlanMany(&plan, static_cast<int>(dims.size()), dims.data(), nullptr, 1,
                              static_cast<int>(per), nullptr, 1, static_cast<int>(per), CUFFT_C2C,
                              batch));
  }
  CUFFT_CHECK(cufftExecC2C(plan, d, d, CUFFT_FORWARD));
  std::vector<cufftComplex> out(total);
  CHECK(cudaMemcpy(out.data(), d, total * sizeof(cufftComplex), cudaMemcpyDeviceToHost));
  std::vector<cd> ref(total);
  for (int b = 0; b < batch; ++b) {
    std::vector<cd> one(x.begin() + b * per, x.begin() + (b + 1) * per);
    one = dftnd(one, dims, -1);
    std::copy(one.begin(), one.end(), ref.begin() + b * per);
  }
  char label[96];
  snprintf(label, sizeof label, "%s forward", name);
  verdict(label, ref, out, 1.0, 2e-4 * std::log2(static_cast<double>(per) + 1));
  CUFFT_CHECK(cufftExecC2C(plan, d, d, CUFFT_INVERSE));
  CHECK(cudaMemcpy(out.data(), d, total * sizeof(cufftComplex), cudaMemcpyDeviceToHost));
  snprintf(label, sizeof label, "%s inverse", name);
  verdict(label, x, out, 1.0 / static_cast<double>(per),
          1e-4 * std::log2(static_cast<double>(per) + 1));
  CUFFT_CHECK(cufftDestroy(plan));
  CHECK(cudaFree(d));
}

// Real-to-complex and back, out of place, batched, on a created stream with a work
// area the program provides (cufftSetAutoAllocation(0) + cufftSetWorkArea).
static void r2c_c2r(int n, int batch) {
  const int nc = n / 2 + 1;
  std::vector<float> h(static_cast<size_t>(n) * batch);
  std::vector<cd> x(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    h[i] = static_cast<float>(std::sin(0.05 * static_cast<double>(i)) + 0.25 * (i % 5));
    x[i] = h[i];
  }
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float* dr = nullptr;
  cufftComplex* dc = nullptr;
  CHECK(cudaMalloc(&dr, h.size() * sizeof(float)));
  CHECK(cudaMalloc(&dc, static_cast<size_t>(nc) * batch * sizeof(cufftComplex)));
  CHECK(cudaMemcpyAsync(dr, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  cufftHandle fwd, inv;
  CUFFT_CHECK(cufftCreate(&fwd));
  CUFFT_CHECK(cufftCreate(&inv));
  CUFFT_CHECK(cufftSetAutoAllocation(fwd, 0));
  size_t work_fwd = 0, work_inv = 0;
  CUFFT_CHECK(cufftMakePlan1d(fwd, n, CUFFT_R2C, batch, &work_fwd));
  CUFFT_CHECK(cufftMakePlan1d(inv, n, CUFFT_C2R, batch, &work_inv));
  void* work = nullptr;
  CHECK(cudaMalloc(&work, work_fwd > 0 ? work_fwd : 1));
  CUFFT_CHECK(cufftSetWorkArea(fwd, work));
  CUFFT_CHECK(cufftSetStream(fwd, s));
  CUFFT_CHECK(cufftSetStream(inv, s));
  CUFFT_CHECK(cufftExecR2C(fwd, dr, dc));
  std::vector<cufftComplex> spec(static_cast<size_t>(nc) * batch);
  CHECK(cudaMemcpyAsync(spec.data(), dc, spec.size() * sizeof(cufftComplex), cudaMemcpyDeviceToHost,
                        s));
  CHECK(cudaStreamSynchronize(s));
  std::vector<cd> ref(spec.size());
  for (int b = 0; b < batch; ++b) {
    std::vector<cd> one(x.begin() + static_cast<size_t>(b) * n,
                        x.begin() + static_cast<size_t>(b + 1) * n);
    one = dft(one, -1);
    for (int k = 0; k < nc; ++k) ref[static_cast<size_t>(b) * nc + k] = one[k];
  }
  char label[64];
  snprintf(label, sizeof label, "r2c n=%d batch=%d", n, batch);
  verdict(label, ref, spec, 1.0, 2e-4 * std::log2(n + 1.0));
  CUFFT_CHECK(cufftExecC2R(inv, dc, dr));
  std::vector<float> back(h.size());
  CHECK(cudaMemcpyAsync(back.data(), dr, back.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  double err = 0;
  for (size_t i = 0; i < h.size(); ++i) err = std::fmax(err, std::fabs(back[i] / n - h[i]));
  bool ok = err < 1e-4 * std::log2(n + 1.0);
  if (!ok) ++failures;
  printf("c2r n=%d batch=%d round trip: %s\n", n, batch, ok ? "PASS" : "FAIL");
  CUFFT_CHECK(cufftDestroy(fwd));
  CUFFT_CHECK(cufftDestroy(inv));
  CHECK(cudaFree(work));
  CHECK(cudaFree(dr));
  CHECK(cudaFree(dc));
  CHECK(cudaStreamDestroy(s));
}

// Double precision Z2Z, executed several times on one plan.
static void z2z(int n) {
  std::vector<cd> x = input(static_cast<size_t>(n), 3);
  std::vector<cufftDoubleComplex> h(n);
  for (int i = 0; i < n; ++i) h[i] = {x[i].real(), x[i].imag()};
  cufftDoubleComplex *a = nullptr, *b = nullptr;
  CHECK(cudaMalloc(&a, n * sizeof(cufftDoubleComplex)));
  CHECK(cudaMalloc(&b, n * sizeof(cufftDoubleComplex)));
  CHECK(cudaMemcpy(a, h.data(), n * sizeof(cufftDoubleComplex), cudaMemcpyHostToDevice));
  cufftHandle plan;
  CUFFT_CHECK(cufftPlan1d(&plan, n, CUFFT_Z2Z, 1));
  for (int rep = 0; rep < 3; ++rep) CUFFT_CHECK(cufftExecZ2Z(plan, a, b, CUFFT_FORWARD));
  std::vector<cufftDoubleComplex> out(n);
  CHECK(cudaMemcpy(out.data(), b, n * sizeof(cufftDoubleComplex), cudaMemcpyDeviceToHost));
  char label[64];
  snprintf(label, sizeof label, "z2z n=%d", n);
  verdict(label, dft(x, -1), out, 1.0, 1e-9 * n);
  CUFFT_CHECK(cufftDestroy(plan));
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
}

int main() {
  int version = 0;
  CUFFT_CHECK(cufftGetVersion(&version));
  fprintf(stderr, "cuFFT %d\n", version);
  c2c("c2c n=256", {256}, 1);
  c2c("c2c n=105", {105}, 1);
  c2c("c2c n=1009 (prime)", {1009}, 1);
  c2c("c2c n=4096", {4096}, 1);
  c2c("c2c 2d 32x48", {32, 48}, 1);
  c2c("c2c 3d 8x12x16", {8, 12, 16}, 1);
  c2c("c2c many n=64 batch=7", {64}, 7);
  r2c_c2r(512, 3);
  r2c_c2r(90, 2);
  z2z(384);
  CHECK(cudaDeviceSynchronize());
  printf("cufft_transforms: %s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 2;
}
