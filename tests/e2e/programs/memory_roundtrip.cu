// memory_roundtrip: every copy kind (H2D/D2H/D2D/H2H, sync and async, pageable, pinned via
// cudaMallocHost/cudaHostAlloc/cudaHostRegister, cudaMemcpyDefault), memsets (1D, async,
// 2D, 3D), pitched 2D/3D copies, symbol copies, at sizes 1 B, odd sizes and 64 MiB, with
// unaligned device offsets. Every check is byte-exact. Texture and surface objects, made
// through the driver API and through cudart: each object's Get*Desc calls give back what it
// was made with (no kernel samples them: the sim runs none), a texture made without a
// resource view has none (CUDA_ERROR_INVALID_VALUE, as cuda.h says), printed as tex.* and
// cudart.* lines. Prints "memory_roundtrip: PASS".
#include <algorithm>
#include <vector>

#include "e2e_driver.h"

// Referenced by a kernel that is never launched, so that nvcc keeps and registers it.
__device__ unsigned char g_sym[4099];
__constant__ unsigned int c_sym[257];
__global__ void touch_symbols(unsigned char* out) {
  if (out) out[0] = g_sym[0] + static_cast<unsigned char>(c_sym[0]);
}

namespace {

constexpr size_t kMiB = 1 << 20;
const size_t kSizes[] = {1, 3, 4097, kMiB + 1, 64 * kMiB};

enum class HostKind { kPageable, kMallocHost, kHostAlloc, kHostRegister };

const char* HostKindName(HostKind k) {
  switch (k) {
    case HostKind::kPageable:
      return "pageable";
    case HostKind::kMallocHost:
      return "cudaMallocHost";
    case HostKind::kHostAlloc:
      return "cudaHostAlloc";
    case HostKind::kHostRegister:
      return "cudaHostRegister";
  }
  return "?";
}

// A host buffer of one kind; frees itself.
struct HostBuf {
  HostKind kind;
  size_t n;
  unsigned char* p = nullptr;
  HostBuf(HostKind k, size_t size) : kind(k), n(size) {
    switch (kind) {
      case HostKind::kPageable:
        p = static_cast<unsigned char*>(malloc(n));
        EXPECT(p != nullptr, "malloc(%zu)", n);
        break;
      case HostKind::kMallocHost:
        CK(cudaMallocHost(reinterpret_cast<void**>(&p), n));
        break;
      case HostKind::kHostAlloc:
        CK(cudaHostAlloc(reinterpret_cast<void**>(&p), n, cudaHostAllocPortable));
        break;
      case HostKind::kHostRegister:
        p = static_cast<unsigned char*>(malloc(n));
        EXPECT(p != nullptr, "malloc(%zu)", n);
        CK(cudaHostRegister(p, n, cudaHostRegisterDefault));
        break;
    }
  }
  ~HostBuf() {
    switch (kind) {
      case HostKind::kPageable:
        free(p);
        break;
      case HostKind::kMallocHost:
      case HostKind::kHostAlloc:
        CK(cudaFreeHost(p));
        break;
      case HostKind::kHostRegister:
        CK(cudaHostUnregister(p));
        free(p);
        break;
    }
  }
  HostBuf(const HostBuf&) = delete;
  HostBuf& operator=(const HostBuf&) = delete;
};

// H2D into a+1, D2D a+1 -> b+2, D2H from b+2; guard bytes around each region must keep
// the memset value. `async` uses cudaMemcpyAsync on `stream`; `use_default` uses
// cudaMemcpyDefault for every direction.
void RoundTrip(HostKind kind, size_t n, bool async, bool use_default, cudaStream_t stream,
               uint32_t seed) {
  char what[160];
  snprintf(what, sizeof(what), "roundtrip %s n=%zu %s%s", HostKindName(kind), n,
           async ? "async" : "sync", use_default ? " cudaMemcpyDefault" : "");
  e2e::Step("roundtrip");
  HostBuf src(kind, n), dst(kind, n + 4);
  e2e::Fill(src.p, n, seed);
  memset(dst.p, 0xEE, n + 4);
  unsigned char *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, n + 4));
  CK(cudaMalloc(&b, n + 4));
  CK(cudaMemset(a, 0xA5, n + 4));
  CK(cudaMemset(b, 0x5A, n + 4));
  // The memsets run on the legacy stream, the copies below on a non-blocking one, which
  // does not wait for it: without this the D2D copy may land before the memset does
  // (natively too; seen through shm:// on an H200, the copy back read 0x5a).
  CK(cudaDeviceSynchronize());
  const cudaMemcpyKind h2d = use_default ? cudaMemcpyDefault : cudaMemcpyHostToDevice;
  const cudaMemcpyKind d2d = use_default ? cudaMemcpyDefault : cudaMemcpyDeviceToDevice;
  const cudaMemcpyKind d2h = use_default ? cudaMemcpyDefault : cudaMemcpyDeviceToHost;
  if (async) {
    CK(cudaMemcpyAsync(a + 1, src.p, n, h2d, stream));
    CK(cudaMemcpyAsync(b + 2, a + 1, n, d2d, stream));
    CK(cudaMemcpyAsync(dst.p + 1, b + 2, n, d2h, stream));
    CK(cudaStreamSynchronize(stream));
  } else {
    CK(cudaMemcpy(a + 1, src.p, n, h2d));
    CK(cudaMemcpy(b + 2, a + 1, n, d2d));
    CK(cudaMemcpy(dst.p + 1, b + 2, n, d2h));
  }
  EXPECT(dst.p[0] == 0xEE, "%s: host byte before the copy changed", what);
  EXPECT_SAME(dst.p + 1, src.p, n, what);
  EXPECT(e2e::FirstNot(dst.p + 1 + n, 0xEE, 3) < 0, "%s: host bytes after the copy changed", what);
  // Guard bytes on the device: b[0..1] and b[n+2..n+3] keep 0x5A.
  unsigned char guard[4] = {0, 0, 0, 0};
  CK(cudaMemcpy(guard, b, 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(guard + 2, b + n + 2, 2, cudaMemcpyDeviceToHost));
  EXPECT(e2e::FirstNot(guard, 0x5A, 4) < 0, "%s: device guard bytes changed: %02x %02x %02x %02x",
         what, guard[0], guard[1], guard[2], guard[3]);
  CK(cudaFree(a));
  CK(cudaFree(b));
}

void HostToHost(size_t n, uint32_t seed) {
  e2e::Step("host to host");
  std::vector<unsigned char> src(n), dst(n, 0), dst2(n, 0);
  e2e::Fill(src.data(), n, seed);
  CK(cudaMemcpy(dst.data(), src.data(), n, cudaMemcpyHostToHost));
  EXPECT_SAME(dst.data(), src.data(), n, "cudaMemcpyHostToHost");
  CK(cudaMemcpy(dst2.data(), src.data(), n, cudaMemcpyDefault));
  EXPECT_SAME(dst2.data(), src.data(), n, "cudaMemcpyDefault host to host");
}

// Pageable async semantics: H2D returns once the source was consumed (the source may be
// overwritten at once); D2H returns only once the copy has completed.
void PageableAsyncSemantics(cudaStream_t stream) {
  e2e::Step("pageable async semantics");
  const size_t n = 3 * kMiB + 5;
  std::vector<unsigned char> src(n), want(n), got(n, 0);
  e2e::Fill(src.data(), n, 77);
  want = src;
  unsigned char* d = nullptr;
  CK(cudaMalloc(&d, n));
  CK(cudaMemcpyAsync(d, src.data(), n, cudaMemcpyHostToDevice, stream));
  memset(src.data(), 0, n);  // allowed: a pageable source is staged before the call returns
  CK(cudaMemcpyAsync(got.data(), d, n, cudaMemcpyDeviceToHost, stream));
  // No synchronisation: a D2H copy into pageable memory has completed when it returns.
  EXPECT_SAME(got.data(), want.data(), n, "pageable cudaMemcpyAsync D2H before any sync");
  CK(cudaStreamSynchronize(stream));
  CK(cudaFree(d));
}

void ZeroSizes() {
  e2e::Step("zero-byte copies and memsets");
  unsigned char* d = nullptr;
  unsigned char h = 0x42;
  CK(cudaMalloc(&d, 16));
  CK(cudaMemcpy(d, &h, 0, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(&h, d, 0, cudaMemcpyDeviceToHost));
  CK(cudaMemset(d, 0, 0));
  EXPECT(h == 0x42, "a 0-byte copy changed the host byte");
  CK(cudaFree(d));
  CK(cudaFree(nullptr));
}

void Memsets(cudaStream_t stream) {
  e2e::Step("memsets");
  const size_t sizes[] = {1, 7, 4099, 64 * kMiB};
  for (size_t n : sizes) {
    unsigned char* d = nullptr;
    CK(cudaMalloc(&d, n + 2));
    std::vector<unsigned char> h(n + 2, 0);
    CK(cudaMemset(d, 0x11, n + 2));
    CK(cudaMemset(d + 1, 0xC3, n));
    CK(cudaMemcpy(h.data(), d, n + 2, cudaMemcpyDeviceToHost));
    EXPECT(h[0] == 0x11 && h[n + 1] == 0x11, "cudaMemset n=%zu wrote outside its range", n);
    EXPECT(e2e::FirstNot(h.data() + 1, 0xC3, n) < 0, "cudaMemset n=%zu: byte %lld wrong", n,
           e2e::FirstNot(h.data() + 1, 0xC3, n));
    CK(cudaMemsetAsync(d + 1, 0x3C, n, stream));
    CK(cudaMemcpyAsync(h.data(), d, n + 2, cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    EXPECT(h[0] == 0x11 && h[n + 1] == 0x11, "cudaMemsetAsync n=%zu wrote outside its range", n);
    EXPECT(e2e::FirstNot(h.data() + 1, 0x3C, n) < 0, "cudaMemsetAsync n=%zu: byte %lld wrong", n,
           e2e::FirstNot(h.data() + 1, 0x3C, n));
    CK(cudaFree(d));
  }
}

void Pitched2D(cudaStream_t stream) {
  e2e::Step("cudaMallocPitch / cudaMemcpy2D / cudaMemset2D");
  const size_t width = 333, height = 37;  // bytes per row, rows
  unsigned char *d = nullptr, *d2 = nullptr;
  size_t pitch = 0, pitch2 = 0;
  CK(cudaMallocPitch(reinterpret_cast<void**>(&d), &pitch, width, height));
  CK(cudaMallocPitch(reinterpret_cast<void**>(&d2), &pitch2, width, height));
  printf("pitch=%zu\n", pitch);
  EXPECT(pitch >= width, "pitch %zu < width %zu", pitch, width);
  EXPECT(pitch2 >= width, "pitch %zu < width %zu", pitch2, width);

  // cudaMemset2D touches width bytes per row only.
  std::vector<unsigned char> all(pitch * height);
  CK(cudaMemset(d, 0x11, pitch * height));
  CK(cudaMemset2D(d, pitch, 0x22, width, height));
  CK(cudaMemcpy(all.data(), d, pitch * height, cudaMemcpyDeviceToHost));
  for (size_t r = 0; r < height; ++r) {
    EXPECT(e2e::FirstNot(&all[r * pitch], 0x22, width) < 0, "memset2D row %zu", r);
    EXPECT(e2e::FirstNot(&all[r * pitch + width], 0x11, pitch - width) < 0,
           "memset2D wrote into the padding of row %zu", r);
  }
  CK(cudaMemset2DAsync(d, pitch, 0x33, width, height, stream));
  CK(cudaMemcpyAsync(all.data(), d, pitch * height, cudaMemcpyDeviceToHost, stream));
  CK(cudaStreamSynchronize(stream));
  for (size_t r = 0; r < height; ++r) {
    EXPECT(e2e::FirstNot(&all[r * pitch], 0x33, width) < 0, "memset2DAsync row %zu", r);
    EXPECT(e2e::FirstNot(&all[r * pitch + width], 0x11, pitch - width) < 0,
           "memset2DAsync wrote into the padding of row %zu", r);
  }

  // H2D from a host layout with its own pitch, D2D into a second pitched allocation, then
  // D2H into a third host layout.
  const size_t hpitch = width + 13, hpitch2 = width + 5;
  std::vector<unsigned char> hsrc(hpitch * height), hdst(hpitch2 * height, 0xEE);
  e2e::Fill(hsrc.data(), hsrc.size(), 2024);
  CK(cudaMemcpy2D(d, pitch, hsrc.data(), hpitch, width, height, cudaMemcpyHostToDevice));
  CK(cudaMemcpy2D(d2, pitch2, d, pitch, width, height, cudaMemcpyDeviceToDevice));
  CK(cudaMemcpy2D(hdst.data(), hpitch2, d2, pitch2, width, height, cudaMemcpyDeviceToHost));
  for (size_t r = 0; r < height; ++r) {
    char what[64];
    snprintf(what, sizeof(what), "cudaMemcpy2D row %zu", r);
    EXPECT_SAME(&hdst[r * hpitch2], &hsrc[r * hpitch], width, what);
    EXPECT(e2e::FirstNot(&hdst[r * hpitch2 + width], 0xEE, hpitch2 - width) < 0,
           "cudaMemcpy2D D2H wrote into host padding of row %zu", r);
  }

  // A sub-rectangle, async: rows 3..12, columns 10..109 of d2 -> host.
  const size_t sub_w = 100, sub_h = 10, col = 10, row = 3;
  std::vector<unsigned char> hsub(sub_w * sub_h, 0);
  CK(cudaMemcpy2DAsync(hsub.data(), sub_w, d2 + row * pitch2 + col, pitch2, sub_w, sub_h,
                       cudaMemcpyDeviceToHost, stream));
  CK(cudaStreamSynchronize(stream));
  for (size_t r = 0; r < sub_h; ++r) {
    char what[64];
    snprintf(what, sizeof(what), "cudaMemcpy2DAsync sub-rectangle row %zu", r);
    EXPECT_SAME(&hsub[r * sub_w], &hsrc[(row + r) * hpitch + col], sub_w, what);
  }
  CK(cudaFree(d));
  CK(cudaFree(d2));
}

void Pitched3D() {
  e2e::Step("cudaMalloc3D / cudaMemcpy3D / cudaMemset3D");
  const size_t w = 71, h = 9, depth = 5;  // w in bytes
  cudaExtent ext = make_cudaExtent(w, h, depth);
  cudaPitchedPtr dp;
  memset(&dp, 0, sizeof(dp));
  CK(cudaMalloc3D(&dp, ext));
  printf("pitch3d=%zu\n", dp.pitch);
  EXPECT(dp.pitch >= w, "3D pitch %zu < width %zu", dp.pitch, w);
  const size_t slice = dp.pitch * h;

  CK(cudaMemset(dp.ptr, 0x44, slice * depth));
  CK(cudaMemset3D(dp, 0x55, ext));
  std::vector<unsigned char> all(slice * depth);
  CK(cudaMemcpy(all.data(), dp.ptr, slice * depth, cudaMemcpyDeviceToHost));
  for (size_t z = 0; z < depth; ++z)
    for (size_t y = 0; y < h; ++y) {
      const unsigned char* rowp = &all[z * slice + y * dp.pitch];
      EXPECT(e2e::FirstNot(rowp, 0x55, w) < 0, "memset3D z=%zu y=%zu", z, y);
      EXPECT(e2e::FirstNot(rowp + w, 0x44, dp.pitch - w) < 0,
             "memset3D wrote into padding at z=%zu y=%zu", z, y);
    }

  const size_t hp = w + 3;  // host pitch
  std::vector<unsigned char> hsrc(hp * h * depth), hdst(hp * h * depth, 0xEE);
  e2e::Fill(hsrc.data(), hsrc.size(), 3003);

  cudaMemcpy3DParms up;
  memset(&up, 0, sizeof(up));
  up.srcPtr = make_cudaPitchedPtr(hsrc.data(), hp, w, h);
  up.dstPtr = dp;
  up.extent = ext;
  up.kind = cudaMemcpyHostToDevice;
  CK(cudaMemcpy3D(&up));

  cudaMemcpy3DParms down;
  memset(&down, 0, sizeof(down));
  down.srcPtr = dp;
  down.dstPtr = make_cudaPitchedPtr(hdst.data(), hp, w, h);
  down.extent = ext;
  down.kind = cudaMemcpyDeviceToHost;
  CK(cudaMemcpy3D(&down));
  for (size_t z = 0; z < depth; ++z)
    for (size_t y = 0; y < h; ++y) {
      char what[64];
      snprintf(what, sizeof(what), "cudaMemcpy3D z=%zu y=%zu", z, y);
      const size_t off = (z * h + y) * hp;
      EXPECT_SAME(&hdst[off], &hsrc[off], w, what);
      EXPECT(e2e::FirstNot(&hdst[off + w], 0xEE, hp - w) < 0, "%s wrote into host padding", what);
    }

  // A sub-box with source and destination positions: box 20x4x2 at (5,2,1) on the device
  // into a packed host box.
  const size_t bw = 20, bh = 4, bd = 2, x0 = 5, y0 = 2, z0 = 1;
  std::vector<unsigned char> box(bw * bh * bd, 0);
  cudaMemcpy3DParms sub;
  memset(&sub, 0, sizeof(sub));
  sub.srcPtr = dp;
  sub.srcPos = make_cudaPos(x0, y0, z0);
  sub.dstPtr = make_cudaPitchedPtr(box.data(), bw, bw, bh);
  sub.extent = make_cudaExtent(bw, bh, bd);
  sub.kind = cudaMemcpyDeviceToHost;
  CK(cudaMemcpy3D(&sub));
  for (size_t z = 0; z < bd; ++z)
    for (size_t y = 0; y < bh; ++y) {
      char what[64];
      snprintf(what, sizeof(what), "cudaMemcpy3D sub-box z=%zu y=%zu", z, y);
      EXPECT_SAME(&box[(z * bh + y) * bw], &hsrc[((z0 + z) * h + (y0 + y)) * hp + x0], bw, what);
    }
  CK(cudaFree(dp.ptr));
}

void Symbols(cudaStream_t stream) {
  e2e::Step("symbol copies");
  size_t sym_size = 0;
  CK(cudaGetSymbolSize(&sym_size, g_sym));
  EXPECT(sym_size == sizeof(g_sym), "cudaGetSymbolSize(g_sym) = %zu", sym_size);
  unsigned char* sym_addr = nullptr;
  CK(cudaGetSymbolAddress(reinterpret_cast<void**>(&sym_addr), g_sym));
  EXPECT(sym_addr != nullptr, "cudaGetSymbolAddress(g_sym) is null");

  std::vector<unsigned char> src(sizeof(g_sym)), got(sizeof(g_sym), 0);
  e2e::Fill(src.data(), src.size(), 4099);
  CK(cudaMemcpyToSymbol(g_sym, src.data(), src.size()));
  CK(cudaMemcpyFromSymbol(got.data(), g_sym, got.size()));
  EXPECT_SAME(got.data(), src.data(), src.size(), "cudaMemcpyToSymbol/FromSymbol");
  // The symbol address is ordinary device memory.
  std::fill(got.begin(), got.end(), 0);
  CK(cudaMemcpy(got.data(), sym_addr, got.size(), cudaMemcpyDeviceToHost));
  EXPECT_SAME(got.data(), src.data(), src.size(), "cudaMemcpy from cudaGetSymbolAddress");

  // Offsets, odd sizes, async, and a device-to-device copy into the symbol.
  unsigned char patch[17];
  e2e::Fill(patch, sizeof(patch), 17);
  CK(cudaMemcpyToSymbolAsync(g_sym, patch, sizeof(patch), 1001, cudaMemcpyHostToDevice, stream));
  memcpy(&src[1001], patch, sizeof(patch));
  unsigned char* d = nullptr;
  CK(cudaMalloc(&d, 5));
  CK(cudaMemcpy(d, "\x01\x02\x03\x04\x05", 5, cudaMemcpyHostToDevice));
  CK(cudaMemcpyToSymbolAsync(g_sym, d, 5, 4094, cudaMemcpyDeviceToDevice, stream));
  memcpy(&src[4094], "\x01\x02\x03\x04\x05", 5);
  std::fill(got.begin(), got.end(), 0);
  CK(cudaMemcpyFromSymbolAsync(got.data(), g_sym, got.size(), 0, cudaMemcpyDeviceToHost, stream));
  CK(cudaStreamSynchronize(stream));
  EXPECT_SAME(got.data(), src.data(), src.size(), "cudaMemcpyToSymbolAsync with offsets");
  unsigned char one = 0;
  CK(cudaMemcpyFromSymbol(&one, g_sym, 1, 1001 + 16));
  EXPECT(one == patch[16], "1-byte cudaMemcpyFromSymbol at an offset: %02x vs %02x", one,
         patch[16]);
  CK(cudaFree(d));

  // __constant__ memory.
  unsigned int csrc[257], cgot[257];
  e2e::Fill(csrc, sizeof(csrc), 257);
  memset(cgot, 0, sizeof(cgot));
  CK(cudaMemcpyToSymbol(c_sym, csrc, sizeof(csrc)));
  CK(cudaMemcpyFromSymbol(cgot, c_sym, sizeof(cgot)));
  EXPECT_SAME(cgot, csrc, sizeof(csrc), "__constant__ symbol round trip");
}

// Texture and surface objects: the descriptors read back are those given.
void Textures() {
  e2e::Step("texture and surface objects");
  e2e::ResolveDriver("cuGetErrorName", &e2e::g_error_name);
  decltype(&::cuArray3DCreate_v2) array_create = nullptr;
  decltype(&::cuArrayDestroy) array_destroy = nullptr;
  decltype(&::cuTexObjectCreate) tex_create = nullptr;
  decltype(&::cuTexObjectDestroy) tex_destroy = nullptr;
  decltype(&::cuTexObjectGetResourceDesc) tex_resource = nullptr;
  decltype(&::cuTexObjectGetTextureDesc) tex_texture = nullptr;
  decltype(&::cuTexObjectGetResourceViewDesc) tex_view = nullptr;
  decltype(&::cuSurfObjectCreate) surf_create = nullptr;
  decltype(&::cuSurfObjectDestroy) surf_destroy = nullptr;
  decltype(&::cuSurfObjectGetResourceDesc) surf_resource = nullptr;
  e2e::ResolveDriver("cuArray3DCreate", &array_create);
  e2e::ResolveDriver("cuArrayDestroy", &array_destroy);
  e2e::ResolveDriver("cuTexObjectCreate", &tex_create);
  e2e::ResolveDriver("cuTexObjectDestroy", &tex_destroy);
  e2e::ResolveDriver("cuTexObjectGetResourceDesc", &tex_resource);
  e2e::ResolveDriver("cuTexObjectGetTextureDesc", &tex_texture);
  e2e::ResolveDriver("cuTexObjectGetResourceViewDesc", &tex_view);
  e2e::ResolveDriver("cuSurfObjectCreate", &surf_create);
  e2e::ResolveDriver("cuSurfObjectDestroy", &surf_destroy);
  e2e::ResolveDriver("cuSurfObjectGetResourceDesc", &surf_resource);
  auto said = [](const char* key, bool same) {
    printf("%s=%s\n", key, same ? "same" : "different");
    EXPECT(same, "%s: the descriptor read back differs from the one given", key);
  };

  // A 64x48 float array that surfaces may use; a texture of it with a resource view.
  const size_t w = 64, h = 48;
  CUDA_ARRAY3D_DESCRIPTOR ad;
  memset(&ad, 0, sizeof(ad));
  ad.Width = w;
  ad.Height = h;
  ad.Format = CU_AD_FORMAT_FLOAT;
  ad.NumChannels = 1;
  ad.Flags = CUDA_ARRAY3D_SURFACE_LDST;
  CUarray arr = nullptr;
  CU(array_create(&arr, &ad));
  CUDA_RESOURCE_DESC rd;
  memset(&rd, 0, sizeof(rd));
  rd.resType = CU_RESOURCE_TYPE_ARRAY;
  rd.res.array.hArray = arr;
  CUDA_TEXTURE_DESC td;
  memset(&td, 0, sizeof(td));
  td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = CU_TR_ADDRESS_MODE_WRAP;
  td.filterMode = CU_TR_FILTER_MODE_LINEAR;
  td.flags = CU_TRSF_NORMALIZED_COORDINATES;
  CUDA_RESOURCE_VIEW_DESC vd;
  memset(&vd, 0, sizeof(vd));
  vd.format = CU_RES_VIEW_FORMAT_FLOAT_1X32;
  vd.width = w;
  vd.height = h;
  CUtexObject tex = 0;
  CU(tex_create(&tex, &rd, &td, &vd));
  CUDA_RESOURCE_DESC got_rd;
  memset(&got_rd, 0xab, sizeof(got_rd));
  CU(tex_resource(&got_rd, tex));
  said("tex.array.resource",
       got_rd.resType == CU_RESOURCE_TYPE_ARRAY && got_rd.res.array.hArray == arr);
  CUDA_TEXTURE_DESC got_td;
  memset(&got_td, 0xab, sizeof(got_td));
  CU(tex_texture(&got_td, tex));
  said("tex.array.texture",
       got_td.addressMode[0] == CU_TR_ADDRESS_MODE_WRAP &&
           got_td.addressMode[1] == CU_TR_ADDRESS_MODE_WRAP &&
           got_td.filterMode == CU_TR_FILTER_MODE_LINEAR &&
           (got_td.flags & (CU_TRSF_NORMALIZED_COORDINATES | CU_TRSF_READ_AS_INTEGER)) ==
               CU_TRSF_NORMALIZED_COORDINATES);
  CUDA_RESOURCE_VIEW_DESC got_vd;
  memset(&got_vd, 0xab, sizeof(got_vd));
  CU(tex_view(&got_vd, tex));
  said("tex.array.view",
       got_vd.format == CU_RES_VIEW_FORMAT_FLOAT_1X32 && got_vd.width == w && got_vd.height == h);

  // A texture of linear memory (two 32-bit integers per element), without a view.
  const size_t elements = 4096, bytes = elements * 8;
  unsigned char* lin = nullptr;
  CK(cudaMalloc(&lin, bytes + 512));
  const CUdeviceptr lin_at = (reinterpret_cast<CUdeviceptr>(lin) + 511) & ~CUdeviceptr{511};
  CUDA_RESOURCE_DESC lrd;
  memset(&lrd, 0, sizeof(lrd));
  lrd.resType = CU_RESOURCE_TYPE_LINEAR;
  lrd.res.linear.devPtr = lin_at;
  lrd.res.linear.format = CU_AD_FORMAT_SIGNED_INT32;
  lrd.res.linear.numChannels = 2;
  lrd.res.linear.sizeInBytes = bytes;
  CUDA_TEXTURE_DESC ltd;
  memset(&ltd, 0, sizeof(ltd));
  ltd.addressMode[0] = CU_TR_ADDRESS_MODE_CLAMP;
  ltd.filterMode = CU_TR_FILTER_MODE_POINT;
  ltd.flags = CU_TRSF_READ_AS_INTEGER;
  CUtexObject ltex = 0;
  CU(tex_create(&ltex, &lrd, &ltd, nullptr));
  memset(&got_rd, 0xab, sizeof(got_rd));
  CU(tex_resource(&got_rd, ltex));
  said("tex.linear.resource",
       got_rd.resType == CU_RESOURCE_TYPE_LINEAR && got_rd.res.linear.devPtr == lin_at &&
           got_rd.res.linear.format == CU_AD_FORMAT_SIGNED_INT32 &&
           got_rd.res.linear.numChannels == 2 && got_rd.res.linear.sizeInBytes == bytes);
  printf("tex.linear.view=%s\n", e2e::CuName(tex_view(&got_vd, ltex)));
  printf("tex.null_out=%s\n", e2e::CuName(tex_resource(nullptr, ltex)));

  // A surface of the array.
  CUsurfObject surf = 0;
  CU(surf_create(&surf, &rd));
  memset(&got_rd, 0xab, sizeof(got_rd));
  CU(surf_resource(&got_rd, surf));
  said("surf.resource", got_rd.resType == CU_RESOURCE_TYPE_ARRAY && got_rd.res.array.hArray == arr);
  CU(surf_destroy(surf));
  CU(tex_destroy(ltex));
  CU(tex_destroy(tex));
  CU(array_destroy(arr));
  CK(cudaFree(lin));

  // Through cudart, as applications make them.
  cudaChannelFormatDesc fmt = cudaCreateChannelDesc<int>();
  cudaArray_t carr = nullptr;
  CK(cudaMallocArray(&carr, &fmt, 32, 16, cudaArraySurfaceLoadStore));
  cudaResourceDesc crd;
  memset(&crd, 0, sizeof(crd));
  crd.resType = cudaResourceTypeArray;
  crd.res.array.array = carr;
  cudaTextureDesc ctd;
  memset(&ctd, 0, sizeof(ctd));
  ctd.addressMode[0] = ctd.addressMode[1] = cudaAddressModeClamp;
  ctd.filterMode = cudaFilterModePoint;
  ctd.readMode = cudaReadModeElementType;
  cudaTextureObject_t ctex = 0;
  CK(cudaCreateTextureObject(&ctex, &crd, &ctd, nullptr));
  cudaResourceDesc got_crd;
  memset(&got_crd, 0xab, sizeof(got_crd));
  CK(cudaGetTextureObjectResourceDesc(&got_crd, ctex));
  cudaTextureDesc got_ctd;
  memset(&got_ctd, 0xab, sizeof(got_ctd));
  CK(cudaGetTextureObjectTextureDesc(&got_ctd, ctex));
  said("cudart.texture",
       got_crd.resType == cudaResourceTypeArray && got_crd.res.array.array == carr &&
           got_ctd.addressMode[0] == cudaAddressModeClamp &&
           got_ctd.addressMode[1] == cudaAddressModeClamp &&
           got_ctd.filterMode == cudaFilterModePoint &&
           got_ctd.readMode == cudaReadModeElementType && got_ctd.normalizedCoords == 0);
  cudaSurfaceObject_t csurf = 0;
  CK(cudaCreateSurfaceObject(&csurf, &crd));
  memset(&got_crd, 0xab, sizeof(got_crd));
  CK(cudaGetSurfaceObjectResourceDesc(&got_crd, csurf));
  said("cudart.surface",
       got_crd.resType == cudaResourceTypeArray && got_crd.res.array.array == carr);
  CK(cudaDestroySurfaceObject(csurf));
  CK(cudaDestroyTextureObject(ctex));
  CK(cudaFreeArray(carr));
}

}  // namespace

int main() {
  e2e::Init("memory_roundtrip", 180);
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  uint32_t seed = 1;
  for (size_t n : kSizes) {
    const bool big = n >= 64 * kMiB;
    // Every host kind, sync and async, explicit kinds.
    for (HostKind k : {HostKind::kPageable, HostKind::kMallocHost, HostKind::kHostAlloc,
                       HostKind::kHostRegister}) {
      // Keep the 64 MiB pass short: one sync and one async pass per pinning method.
      const bool sync = !big || k == HostKind::kPageable;
      const bool async = !big || k == HostKind::kMallocHost || k == HostKind::kHostRegister;
      if (sync) RoundTrip(k, n, /*async=*/false, /*use_default=*/false, stream, seed++);
      if (async) RoundTrip(k, n, /*async=*/true, /*use_default=*/false, stream, seed++);
    }
    // cudaMemcpyDefault: the client must tell host from device pointers itself.
    RoundTrip(HostKind::kPageable, n, false, true, stream, seed++);
    if (!big) RoundTrip(HostKind::kMallocHost, n, true, true, stream, seed++);
    if (!big) HostToHost(n, seed++);
    printf("roundtrip_size=%zu ok\n", n);
  }
  // The legacy default stream as well.
  RoundTrip(HostKind::kMallocHost, 4097, true, false, nullptr, seed++);

  PageableAsyncSemantics(stream);
  ZeroSizes();
  Memsets(stream);
  Pitched2D(stream);
  Pitched3D();
  Symbols(stream);
  Textures();

  e2e::Step("teardown");
  CK(cudaStreamDestroy(stream));
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
  e2e::Pass();
  return 0;
}
