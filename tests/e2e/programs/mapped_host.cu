// mapped_host: pinned host memory that kernels read and write, the way NVIDIA's
// simpleZeroCopy sample and XLA use it:
//   - cudaHostAlloc(cudaHostAllocMapped) + cudaHostGetDevicePointer: the device pointer is
//     the host pointer (unified addressing); a kernel reads what the host wrote before
//     the launch, and writes that the host sees after cudaDeviceSynchronize;
//   - odd sizes and offsets into a buffer, host writes to other bytes of the same pages
//     while a kernel runs (both survive);
//   - cudaHostRegister(cudaHostRegisterMapped) of the program's own malloc'd memory: its
//     bytes stay, kernels reach it, and after cudaHostUnregister the bytes the kernel
//     wrote are in the program's memory;
//   - pinned memory from cudaMallocHost whose device pointer is asked for afterwards (XLA
//     allocates pinned memory, then asks for the device pointer);
//   - pointer attributes (host memory, device and host pointer, not managed, mapped) and
//     cudaHostGetFlags;
//   - several buffers chained on one stream, a host function on the stream reading the
//     results, an event query that says done, a blocking copy, copies to and from a
//     mapped buffer, cudaFreeHost of one buffer while another stays in use.
// The kernel is flyt_sim_affine (out[i] = in[i] * mul + add), which the sim backend models.
// Prints key=value lines and "mapped_host: PASS".
#include <cuda.h>

#include <atomic>
#include <vector>

#include "e2e_driver.h"

__global__ void flyt_sim_affine(const unsigned* in, unsigned* out, unsigned long long n,
                                unsigned mul, unsigned add) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<unsigned long long>(gridDim.x) * blockDim.x)
    out[i] = in[i] * mul + add;
}

namespace {

void Affine(const unsigned* in, unsigned* out, size_t n, unsigned mul, unsigned add,
            cudaStream_t s = 0) {
  flyt_sim_affine<<<64, 256, 0, s>>>(in, out, n, mul, add);
  CK(cudaGetLastError());
}

// Elements of p[0, n) that are not f(i).
template <typename F>
size_t Bad(const unsigned* p, size_t n, F f) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += p[i] != f(i) ? 1 : 0;
  return bad;
}

struct CallbackCheck {
  const unsigned* p = nullptr;
  size_t n = 0;
  std::atomic<long long> bad{-1};
};
void CheckInCallback(void* arg) {
  auto* c = static_cast<CallbackCheck*>(arg);
  c->bad = static_cast<long long>(Bad(c->p, c->n, [](size_t i) { return 4 * i + 3; }));
}

decltype(&::cuPointerGetAttribute) g_pointer_attribute = nullptr;
int IntAttribute(CUpointer_attribute a, const void* p) {
  int v = -1;
  CUresult r = g_pointer_attribute(&v, a, reinterpret_cast<CUdeviceptr>(p));
  return r == CUDA_SUCCESS ? v : -100 - static_cast<int>(r);
}

}  // namespace

int main() {
  e2e::Init("mapped_host", 120);
  CK(cudaSetDevice(0));
  e2e::ResolveDriver("cuPointerGetAttribute", &g_pointer_attribute);
  e2e::ResolveDriver("cuGetErrorName", &e2e::g_error_name);
  int can_map = 0, unified = 0;
  CK(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, 0));
  CK(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, 0));
  printf("attr.can_map_host_memory=%d\nattr.unified_addressing=%d\n", can_map, unified);

  e2e::Step("cudaHostAlloc(cudaHostAllocMapped), cudaHostGetDevicePointer");
  const size_t n = (3 << 20) / 4 + 77;  // not a whole number of pages
  unsigned* a = nullptr;
  CK(cudaHostAlloc(reinterpret_cast<void**>(&a), n * 4, cudaHostAllocMapped));
  unsigned flags = 0;
  CK(cudaHostGetFlags(&flags, a));
  printf("alloc.flags_mapped=%d\n", (flags & cudaHostAllocMapped) ? 1 : 0);
  unsigned* da = nullptr;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&da), a, 0));
  printf("alloc.device_is_host=%d\n", da == a ? 1 : 0);

  e2e::Step("pointer attributes of mapped memory");
  cudaPointerAttributes pa{};
  CK(cudaPointerGetAttributes(&pa, a + 100));
  printf("attr.type_host=%d\nattr.device_pointer_is_host=%d\nattr.host_pointer=%d\n",
         pa.type == cudaMemoryTypeHost ? 1 : 0, pa.devicePointer == a + 100 ? 1 : 0,
         pa.hostPointer == a + 100 ? 1 : 0);
  printf("attr.cu_memory_type=%d\nattr.cu_is_managed=%d\nattr.cu_mapped=%d\n",
         IntAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a),
         IntAttribute(CU_POINTER_ATTRIBUTE_IS_MANAGED, a),
         IntAttribute(CU_POINTER_ATTRIBUTE_MAPPED, a));
  CUdeviceptr cu_dev = 0;
  void* cu_host = nullptr;
  CUresult r1 = g_pointer_attribute(&cu_dev, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                    reinterpret_cast<CUdeviceptr>(a + 5));
  CUresult r2 = g_pointer_attribute(&cu_host, CU_POINTER_ATTRIBUTE_HOST_POINTER,
                                    reinterpret_cast<CUdeviceptr>(a + 5));
  printf("attr.cu_device_pointer=%s\nattr.cu_host_pointer=%s\n",
         r1 == CUDA_SUCCESS ? (cu_dev == reinterpret_cast<CUdeviceptr>(a + 5) ? "same" : "other")
                            : e2e::CuName(r1),
         r2 == CUDA_SUCCESS ? (cu_host == a + 5 ? "same" : "other") : e2e::CuName(r2));

  e2e::Step("host writes, then a kernel reads them");
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<unsigned>(i);
  unsigned* dev = nullptr;
  CK(cudaMalloc(&dev, n * 4));
  Affine(da, dev, n, 3, 1);
  std::vector<unsigned> got(n);
  CK(cudaMemcpy(got.data(), dev, n * 4, cudaMemcpyDeviceToHost));
  printf("host_to_kernel.bad=%zu\n", Bad(got.data(), n, [](size_t i) { return 3 * i + 1; }));

  e2e::Step("a kernel writes, the host reads after cudaDeviceSynchronize");
  Affine(da, da, n, 2, 5);
  CK(cudaDeviceSynchronize());
  printf("kernel_to_host.bad=%zu\n", Bad(a, n, [](size_t i) { return 2 * i + 5; }));

  e2e::Step("odd offsets; host writes to other bytes of the pages while the kernel runs");
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<unsigned>(i);
  const size_t off = 1027, len = 70001;
  Affine(da + off, da + off, len, 1, 9);
  a[off - 1] = 0xabcdef;  // the same page as the kernel's first element
  a[off + len] = 0x123456;
  CK(cudaStreamSynchronize(0));
  auto odd_want = [&](size_t i) -> unsigned {
    if (i == off - 1) return 0xabcdef;
    if (i == off + len) return 0x123456;
    return i >= off && i < off + len ? i + 9 : i;
  };
  size_t odd_bad = Bad(a, n, odd_want);
  printf("odd_offsets.bad=%zu\n", odd_bad);
  for (size_t i = 0; i < n && odd_bad != 0; ++i)
    if (a[i] != odd_want(i)) {
      printf("odd_offsets.first_bad=%zu got %u want %u\n", i, a[i], odd_want(i));
      break;
    }
  // The device sees the host's two writes too.
  Affine(da, dev, n, 1, 0);
  CK(cudaMemcpy(got.data(), dev, n * 4, cudaMemcpyDeviceToHost));
  printf("odd_offsets.device_bad=%zu\n", e2e::FirstDiff(got.data(), a, n * 4) < 0 ? 0ul : 1ul);

  e2e::Step("copies to and from mapped memory");
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<unsigned>(7 * i);
  CK(cudaMemcpy(dev, a, n * 4, cudaMemcpyHostToDevice));
  Affine(da, da, 16, 0, 0);  // device work on the host buffer: a[0, 16) = 0
  CK(cudaMemcpy(a + 16, dev + 16, (n - 16) * 4, cudaMemcpyDefault));
  printf("copies.bad=%zu\n", Bad(a, n, [](size_t i) { return i < 16 ? 0u : 7 * i; }));

  e2e::Step("cudaHostRegister(cudaHostRegisterMapped) of malloc'd memory");
  const size_t rn = 50001;  // 200004 bytes: malloc gives an odd start inside a page
  auto* reg = static_cast<unsigned*>(malloc(rn * 4));
  EXPECT(reg != nullptr, "malloc");
  for (size_t i = 0; i < rn; ++i) reg[i] = static_cast<unsigned>(5 * i);
  CK(cudaHostRegister(reg, rn * 4, cudaHostRegisterMapped));
  printf("register.kept_bad=%zu\n", Bad(reg, rn, [](size_t i) { return 5 * i; }));
  unsigned* dreg = nullptr;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dreg), reg, 0));
  printf("register.device_is_host=%d\n", dreg == reg ? 1 : 0);
  Affine(dreg, dreg, rn, 1, 2);
  CK(cudaDeviceSynchronize());
  printf("register.kernel_bad=%zu\n", Bad(reg, rn, [](size_t i) { return 5 * i + 2; }));
  reg[0] = 11;  // the host writes, the kernel reads
  Affine(dreg, dreg, 1, 3, 0);
  CK(cudaDeviceSynchronize());
  CK(cudaHostUnregister(reg));
  printf("unregister.kept_bad=%zu\n",
         Bad(reg, rn, [](size_t i) { return i == 0 ? 33u : 5 * i + 2; }));
  reg[1] = 1;  // ordinary memory again
  free(reg);

  e2e::Step("cudaMallocHost, then the device pointer (as XLA does)");
  unsigned* late = nullptr;
  CK(cudaMallocHost(reinterpret_cast<void**>(&late), 40000 * 4));
  for (size_t i = 0; i < 40000; ++i) late[i] = static_cast<unsigned>(i + 1);
  unsigned* dlate = nullptr;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dlate), late, 0));
  printf("late.device_is_host=%d\n", dlate == late ? 1 : 0);
  Affine(dlate, dlate, 40000, 2, 0);
  CK(cudaDeviceSynchronize());
  printf("late.kernel_bad=%zu\n", Bad(late, 40000, [](size_t i) { return 2 * (i + 1); }));
  CK(cudaMemcpy(dev, late, 40000 * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(got.data(), dev, 40000 * 4, cudaMemcpyDeviceToHost));
  printf("late.copy_bad=%zu\n", Bad(got.data(), 40000, [](size_t i) { return 2 * (i + 1); }));

  e2e::Step("cudaMallocHost, then a memset of it through its host address (XLA's autotuner)");
  unsigned* scalar = nullptr;
  CK(cudaMallocHost(reinterpret_cast<void**>(&scalar), 4096));
  for (size_t i = 0; i < 1024; ++i) scalar[i] = 0xffffffffu;
  CK(cudaMemset(scalar, 0, 8));
  CK(cudaDeviceSynchronize());
  printf("memset_pinned.zeroed=%d,%d,kept=%d\n", scalar[0] == 0, scalar[1] == 0,
         scalar[2] == 0xffffffffu);
  Affine(scalar + 4, scalar + 4, 4, 1, 3);  // a kernel reaches it through the same address
  CK(cudaDeviceSynchronize());
  printf("memset_pinned.kernel=%u\n", scalar[4]);
  CK(cudaFreeHost(scalar));

  e2e::Step("cudaMallocHost handed straight to a kernel (never a device pointer asked for)");
  unsigned* direct = nullptr;
  CK(cudaMallocHost(reinterpret_cast<void**>(&direct), 4096 * 4));
  for (size_t i = 0; i < 4096; ++i) direct[i] = static_cast<unsigned>(i);
  Affine(direct, direct, 4096, 3, 1);
  CK(cudaDeviceSynchronize());
  printf("direct_kernel.bad=%zu\n", Bad(direct, 4096, [](size_t i) { return 3 * i + 1; }));
  CK(cudaFreeHost(direct));

  e2e::Step("several buffers on one stream; a host function reads the results");
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned *b1 = nullptr, *b2 = nullptr, *b3 = nullptr;
  const size_t m = 30000;
  CK(cudaHostAlloc(reinterpret_cast<void**>(&b1), m * 4, cudaHostAllocMapped));
  CK(cudaHostAlloc(reinterpret_cast<void**>(&b2), m * 4,
                   cudaHostAllocMapped | cudaHostAllocPortable));
  CK(cudaHostAlloc(reinterpret_cast<void**>(&b3), m * 4, cudaHostAllocMapped));
  for (size_t i = 0; i < m; ++i) b1[i] = static_cast<unsigned>(i);
  Affine(b1, b2, m, 2, 1, s);  // kernels given the host pointers themselves (UVA)
  Affine(b2, b3, m, 2, 1, s);  // b3 = 4i + 3
  CallbackCheck check;
  check.p = b3;
  check.n = m;
  CK(cudaLaunchHostFunc(s, CheckInCallback, &check));
  CK(cudaStreamSynchronize(s));
  printf("callback.bad=%lld\n", check.bad.load());

  e2e::Step("an event query that says done");
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  Affine(b3, b3, m, 1, 1, s);
  CK(cudaEventRecord(ev, s));
  cudaError_t q;
  while ((q = cudaEventQuery(ev)) == cudaErrorNotReady) {
  }
  CK(q);
  printf("event_query.bad=%zu\n", Bad(b3, m, [](size_t i) { return 4 * i + 4; }));

  e2e::Step("a blocking copy after a kernel on the legacy stream");
  Affine(b3, b3, m, 1, 1);
  CK(cudaMemcpy(got.data(), dev, 64, cudaMemcpyDeviceToHost));
  printf("blocking_copy.bad=%zu\n", Bad(b3, m, [](size_t i) { return 4 * i + 5; }));

  e2e::Step("cudaFreeHost of one buffer while another stays in use");
  CK(cudaFreeHost(b1));
  CK(cudaFreeHost(a));
  Affine(b2, b3, m, 1, 0, s);
  CK(cudaStreamSynchronize(s));
  printf("after_free.bad=%zu\n", Bad(b3, m, [](size_t i) { return 2 * i + 1; }));

  CK(cudaEventDestroy(ev));
  CK(cudaStreamDestroy(s));
  CK(cudaFreeHost(b2));
  CK(cudaFreeHost(b3));
  CK(cudaFreeHost(late));
  CK(cudaFree(dev));
  printf("under_flyt=%d\n", e2e::UnderFlyt() ? 1 : 0);
  e2e::Pass();
  return 0;
}
