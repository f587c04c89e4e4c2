// vmm_expandable: CUDA virtual memory management the way PyTorch's
// expandable segments use it (cuMemAddressReserve / cuMemCreate / cuMemMap /
// cuMemSetAccess through driver entry points), with kernels on the mapped
// memory: a reservation with room to grow; a first chunk mapped, written by a
// kernel and checked; the segment grown in place (the next chunk mapped right
// after the first) and one kernel run over both; a third chunk and a
// grid-stride reduction over all three; copies and memsets across chunk
// boundaries and from cudaMalloc memory; the same physical chunk mapped at a
// second address (writes through one seen through the other); pointer
// attributes; cuMemRetainAllocationHandle and properties; unmap, release,
// free, and a fresh reservation afterwards. Sizes are multiples of the
// granularity the driver reports (never printed).
#include <cuda.h>

#include <vector>

#include "common.h"

typedef CUresult(CUDAAPI* PFN_Granularity)(size_t*, const CUmemAllocationProp*,
                                           CUmemAllocationGranularity_flags);
typedef CUresult(CUDAAPI* PFN_Reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                                       unsigned long long);
typedef CUresult(CUDAAPI* PFN_AddressFree)(CUdeviceptr, size_t);
typedef CUresult(CUDAAPI* PFN_Create)(CUmemGenericAllocationHandle*, size_t,
                                      const CUmemAllocationProp*, unsigned long long);
typedef CUresult(CUDAAPI* PFN_Release)(CUmemGenericAllocationHandle);
typedef CUresult(CUDAAPI* PFN_Map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                                   unsigned long long);
typedef CUresult(CUDAAPI* PFN_Unmap)(CUdeviceptr, size_t);
typedef CUresult(CUDAAPI* PFN_SetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
typedef CUresult(CUDAAPI* PFN_GetAccess)(unsigned long long*, const CUmemLocation*, CUdeviceptr);
typedef CUresult(CUDAAPI* PFN_Properties)(CUmemAllocationProp*, CUmemGenericAllocationHandle);
typedef CUresult(CUDAAPI* PFN_Retain)(CUmemGenericAllocationHandle*, void*);

template <typename F>
static F get(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q));
  EXPECT(q == cudaDriverEntryPointSuccess && fn, "entry point %s", name);
  return reinterpret_cast<F>(fn);
}

__global__ void fill(unsigned* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = seed ^ static_cast<unsigned>(i * 2654435761u);
}
__global__ void bump(unsigned* p, size_t n, unsigned by) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] += by + static_cast<unsigned>(i & 0xff);
}
__global__ void sum(const unsigned* p, size_t n, unsigned long long* out) {
  unsigned long long acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    acc += p[i];
  atomicAdd(out, acc);
}

static unsigned Fill(unsigned seed, size_t i) {
  return seed ^ static_cast<unsigned>(i * 2654435761u);
}

struct Vmm {
  PFN_Granularity granularity = get<PFN_Granularity>("cuMemGetAllocationGranularity");
  PFN_Reserve reserve = get<PFN_Reserve>("cuMemAddressReserve");
  PFN_AddressFree address_free = get<PFN_AddressFree>("cuMemAddressFree");
  PFN_Create create = get<PFN_Create>("cuMemCreate");
  PFN_Release release = get<PFN_Release>("cuMemRelease");
  PFN_Map map = get<PFN_Map>("cuMemMap");
  PFN_Unmap unmap = get<PFN_Unmap>("cuMemUnmap");
  PFN_SetAccess set_access = get<PFN_SetAccess>("cuMemSetAccess");
  PFN_GetAccess get_access = get<PFN_GetAccess>("cuMemGetAccess");
  PFN_Properties properties = get<PFN_Properties>("cuMemGetAllocationPropertiesFromHandle");
  PFN_Retain retain = get<PFN_Retain>("cuMemRetainAllocationHandle");
};

static void ReadWrite(const Vmm& v, CUdeviceptr p, size_t n, int dev) {
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = dev;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU_CHECK(v.set_access(p, n, &d, 1));
}

// Checks n words at p against fill(seed) + bump(by) where bumped; returns mismatches.
static int Verify(const unsigned* p, size_t n, unsigned seed, size_t bumped_from, unsigned by,
                  const char* what) {
  std::vector<unsigned> host(n);
  CHECK(cudaMemcpy(host.data(), p, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    unsigned want = Fill(seed, i);
    if (i >= bumped_from) want += by + static_cast<unsigned>((i - bumped_from) & 0xff);
    bad += host[i] != want;
  }
  printf("%s: mismatches=%d checksum=%016llx\n", what, bad,
         static_cast<unsigned long long>(fnv1a(host.data(), n * sizeof(unsigned))));
  return bad;
}

int main() {
  const int dev = 0;
  CHECK(cudaSetDevice(dev));
  CHECK(cudaFree(nullptr));
  const Vmm v;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t gran = 0, rec = 0;
  CU_CHECK(v.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CU_CHECK(v.granularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT(gran > 0 && rec % gran == 0, "granularity");
  printf("granularity: ok\n");
  const size_t chunk = 4 * gran;  // bytes per physical chunk
  const size_t words = chunk / sizeof(unsigned);

  // Room for 8 chunks, as an expandable segment reserves far more than it maps.
  CUdeviceptr base = 0;
  CU_CHECK(v.reserve(&base, 8 * chunk, 0, 0, 0));
  EXPECT(base % gran == 0, "reservation not aligned");
  unsigned* p = reinterpret_cast<unsigned*>(base);

  // One chunk: map, grant access, a kernel writes it.
  CUmemGenericAllocationHandle h[3] = {0, 0, 0};
  CU_CHECK(v.create(&h[0], chunk, &prop, 0));
  CU_CHECK(v.map(base, chunk, 0, h[0], 0));
  CUmemLocation loc{};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = dev;
  unsigned long long flags = 99;
  CU_CHECK(v.get_access(&flags, &loc, base));
  printf("access before set=%llu\n", flags);
  ReadWrite(v, base, chunk, dev);
  CU_CHECK(v.get_access(&flags, &loc, base + chunk - 1));
  printf("access after set=%llu\n", flags);
  fill<<<264, 256>>>(p, words, 0x1234u);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  int bad = Verify(p, words, 0x1234u, words, 0, "one chunk");

  // Grow in place: the next chunk right after the first; one kernel over both.
  CU_CHECK(v.create(&h[1], chunk, &prop, 0));
  CU_CHECK(v.map(base + chunk, chunk, 0, h[1], 0));
  ReadWrite(v, base + chunk, chunk, dev);
  fill<<<264, 256>>>(p + words, words, 0x1234u ^ 0x5555u);
  bump<<<264, 256>>>(p + words / 2, words, 7u);  // straddles the boundary
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  {
    std::vector<unsigned> host(2 * words);
    CHECK(cudaMemcpy(host.data(), p, 2 * words * sizeof(unsigned), cudaMemcpyDeviceToHost));
    int b2 = 0;
    for (size_t i = 0; i < 2 * words; ++i) {
      unsigned want = i < words ? Fill(0x1234u, i) : Fill(0x1234u ^ 0x5555u, i - words);
      if (i >= words / 2 && i < words / 2 + words)
        want += 7u + static_cast<unsigned>((i - words / 2) & 0xff);
      b2 += host[i] != want;
    }
    printf("grown to two chunks: mismatches=%d checksum=%016llx\n", b2,
           static_cast<unsigned long long>(fnv1a(host.data(), host.size() * sizeof(unsigned))));
    bad += b2;
  }

  // A third chunk, access granted on all three at once, a reduction over them.
  CU_CHECK(v.create(&h[2], chunk, &prop, 0));
  CU_CHECK(v.map(base + 2 * chunk, chunk, 0, h[2], 0));
  ReadWrite(v, base, 3 * chunk, dev);
  fill<<<528, 256>>>(p, 3 * words, 0xabcdu);
  unsigned long long* total = nullptr;
  CHECK(cudaMalloc(&total, sizeof(*total)));
  CHECK(cudaMemset(total, 0, sizeof(*total)));
  sum<<<264, 256>>>(p, 3 * words, total);
  CHECK_LAUNCH();
  unsigned long long got_total = 0, want_total = 0;
  CHECK(cudaMemcpy(&got_total, total, sizeof(got_total), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < 3 * words; ++i) want_total += Fill(0xabcdu, i);
  printf("sum over three chunks: %s value=%llu\n", got_total == want_total ? "ok" : "WRONG",
         got_total);
  bad += got_total != want_total;

  // Copies and memsets across the boundaries, from and to cudaMalloc memory.
  const size_t span = chunk / 2 + 4096;  // bytes: crosses one chunk boundary
  std::vector<unsigned char> src(span), back(span);
  Rng rng(99);
  for (auto& b : src) b = static_cast<unsigned char>(rng.next());
  unsigned char* bytes = reinterpret_cast<unsigned char*>(base);
  CHECK(cudaMemcpy(bytes + chunk / 2 + 3, src.data(), span, cudaMemcpyHostToDevice));
  unsigned char* plain = nullptr;
  CHECK(cudaMalloc(&plain, span));
  CHECK(cudaMemcpy(plain, bytes + chunk / 2 + 3, span, cudaMemcpyDeviceToDevice));
  CHECK(cudaMemcpy(bytes + 2 * chunk - 77, plain, span, cudaMemcpyDefault));
  CHECK(cudaMemcpy(back.data(), bytes + 2 * chunk - 77, span, cudaMemcpyDeviceToHost));
  int copy_bad = memcmp(back.data(), src.data(), span) != 0;
  CHECK(cudaMemset(bytes + chunk - 5, 0x3c, 10));
  unsigned char edge[10];
  CHECK(cudaMemcpy(edge, bytes + chunk - 5, 10, cudaMemcpyDeviceToHost));
  for (unsigned char e : edge) copy_bad += e != 0x3c;
  printf("copies across chunks: %s checksum=%016llx\n", copy_bad ? "WRONG" : "ok",
         static_cast<unsigned long long>(fnv1a(back.data(), span)));
  bad += copy_bad;

  // The same physical chunk at a second address: one memory, two views.
  CUdeviceptr alias = 0;
  CU_CHECK(v.reserve(&alias, chunk, 0, 0, 0));
  CU_CHECK(v.map(alias, chunk, 0, h[1], 0));
  ReadWrite(v, alias, chunk, dev);
  fill<<<264, 256>>>(reinterpret_cast<unsigned*>(alias), words, 0x7777u);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  bad += Verify(p + words, words, 0x7777u, words, 0, "written through an alias");

  // Pointer attributes, the handle behind an address, properties.
  cudaPointerAttributes attr{};
  CHECK(cudaPointerGetAttributes(&attr, bytes + chunk + 100));
  printf("pointer type=%d device=%d\n", static_cast<int>(attr.type), attr.device);
  bad += attr.type != cudaMemoryTypeDevice;
  CUmemGenericAllocationHandle again = 0;
  CU_CHECK(v.retain(&again, bytes + 2 * chunk + 12345));
  printf("retained handle is the mapped one: %s\n", again == h[2] ? "yes" : "no");
  bad += again != h[2];
  CU_CHECK(v.release(again));
  CUmemAllocationProp back_prop{};
  CU_CHECK(v.properties(&back_prop, h[0]));
  printf("properties: type=%d location=%d/%d\n", static_cast<int>(back_prop.type),
         static_cast<int>(back_prop.location.type), back_prop.location.id);

  // Tear down, then a fresh segment works.
  CU_CHECK(v.unmap(alias, chunk));
  CU_CHECK(v.address_free(alias, chunk));
  for (int i = 0; i < 3; ++i) CU_CHECK(v.unmap(base + i * chunk, chunk));
  for (int i = 0; i < 3; ++i) CU_CHECK(v.release(h[i]));
  CU_CHECK(v.address_free(base, 8 * chunk));
  CUdeviceptr again_base = 0;
  CUmemGenericAllocationHandle h2 = 0;
  CU_CHECK(v.reserve(&again_base, chunk, 0, 0, 0));
  CU_CHECK(v.create(&h2, chunk, &prop, 0));
  CU_CHECK(v.map(again_base, chunk, 0, h2, 0));
  ReadWrite(v, again_base, chunk, dev);
  fill<<<264, 256>>>(reinterpret_cast<unsigned*>(again_base), words, 0x4242u);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  bad += Verify(reinterpret_cast<unsigned*>(again_base), words, 0x4242u, words, 0, "fresh segment");
  CU_CHECK(v.unmap(again_base, chunk));
  CU_CHECK(v.release(h2));
  CU_CHECK(v.address_free(again_base, chunk));
  CHECK(cudaFree(plain));
  CHECK(cudaFree(total));
  CHECK(cudaDeviceSynchronize());
  EXPECT(bad == 0, "%d checks failed", bad);
  pass("vmm_expandable");
  return 0;
}
