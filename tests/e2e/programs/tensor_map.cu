// tensor_map: TMA descriptors as CUTLASS, cuDNN and Triton make them, through
// driver entry points (cudaGetDriverEntryPointByVersion).
//
//   - cuTensorMapEncodeTiled for a 2-D float tensor in device memory (box
//     32 x 16), then a kernel that loads one box with cp.async.bulk.tensor
//     into shared memory and writes it out; the copy is checked on a GPU
//     (tma.copy_ok; the sim runs no kernel, so CI does not check it).
//   - The same arguments encode the same bytes (libraries encode again before
//     launches); a different box gives different bytes; the digest of a
//     descriptor of a fixed address is printed (the same driver gives the same
//     bytes natively and through Flyt; the sim's bytes are its own).
//   - cuTensorMapReplaceAddress moves a descriptor and back to the same bytes.
//   - cuTensorMapEncodeIm2col of a 4-D NHWC tensor.
//   - Errors as the driver gives them: a NULL descriptor, rank 0 and 6, an
//     address not 16-byte aligned, a stride not a multiple of 16, a box of 0
//     and of 257, an element stride of 9, NULL dimensions.
//
// Prints key=value lines and "tensor_map: PASS".
#include <cuda.h>  // driver types only; the program does not link libcuda
#include <cuda/barrier>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "e2e_driver.h"

namespace {

struct Driver {
  decltype(&::cuTensorMapEncodeTiled) tiled;
  decltype(&::cuTensorMapEncodeIm2col) im2col;
  decltype(&::cuTensorMapReplaceAddress) replace;
} g_cu;

constexpr int kCols = 256, kRows = 64;       // the tensor: 64 rows of 256 floats
constexpr int kBoxCols = 32, kBoxRows = 16;  // one TMA box

using Barrier = cuda::barrier<cuda::thread_scope_block>;

__global__ void tma_load_box(const __grid_constant__ CUtensorMap map, float* out, int col,
                             int row) {
  __shared__ alignas(128) float tile[kBoxRows][kBoxCols];
#pragma nv_diag_suppress static_var_with_dynamic_init
  __shared__ Barrier bar;
  if (threadIdx.x == 0) {
    init(&bar, blockDim.x);
    cuda::device::experimental::fence_proxy_async_shared_cta();
  }
  __syncthreads();
  Barrier::arrival_token token;
  if (threadIdx.x == 0) {
    cuda::device::experimental::cp_async_bulk_tensor_2d_global_to_shared(&tile, &map, col, row,
                                                                         bar);
    token = cuda::device::barrier_arrive_tx(bar, 1, sizeof(tile));
  } else {
    token = bar.arrive();
  }
  bar.wait(std::move(token));
  for (int i = threadIdx.x; i < kBoxRows * kBoxCols; i += blockDim.x)
    out[i] = tile[i / kBoxCols][i % kBoxCols];
}

// Under Flyt with FLYT_CALL_COUNTS=1: how many cuTensorMapEncodeTiled calls
// went to the server (flyt_client_call_counts lines: "SYNC|ASYNC count name").
long ServerEncodes() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  auto counts =
      lib != nullptr
          ? reinterpret_cast<size_t (*)(char*, size_t)>(dlsym(lib, "flyt_client_call_counts"))
          : nullptr;
  if (counts == nullptr) return -1;
  std::vector<char> text(1 << 16);
  counts(text.data(), text.size());
  long n = 0;
  char name[128];
  for (const char* line = text.data(); *line != '\0';) {
    long c = 0;
    if (sscanf(line, "%*s %ld %127s", &c, name) == 2 && strcmp(name, "cuTensorMapEncodeTiled") == 0)
      n += c;
    const char* nl = strchr(line, '\n');
    if (nl == nullptr) break;
    line = nl + 1;
  }
  return n;
}

uint64_t Digest(const CUtensorMap& m) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* b = reinterpret_cast<const uint8_t*>(&m);
  for (size_t i = 0; i < sizeof m; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

CUresult Tiled(CUtensorMap* map, void* address, cuuint32_t rank, const cuuint64_t* dims,
               const cuuint64_t* strides, const cuuint32_t* box, const cuuint32_t* elem) {
  return g_cu.tiled(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, rank, address, dims, strides, box, elem,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                    CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace

int main() {
  e2e::Init("tensor_map");
  CK(cudaFree(nullptr));
  e2e::ResolveDriver("cuGetErrorName", &e2e::g_error_name);
  e2e::ResolveDriver("cuTensorMapEncodeTiled", &g_cu.tiled);
  e2e::ResolveDriver("cuTensorMapEncodeIm2col", &g_cu.im2col);
  e2e::ResolveDriver("cuTensorMapReplaceAddress", &g_cu.replace);

  e2e::Step("encode");
  std::vector<float> host(kCols * kRows);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  float* dev = nullptr;
  float* out = nullptr;
  CK(cudaMalloc(&dev, host.size() * sizeof(float)));
  CK(cudaMalloc(&out, kBoxRows * kBoxCols * sizeof(float)));
  CK(cudaMemcpy(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  const cuuint64_t dims[2] = {kCols, kRows};
  const cuuint64_t strides[1] = {kCols * sizeof(float)};
  const cuuint32_t box[2] = {kBoxCols, kBoxRows};
  const cuuint32_t elem[2] = {1, 1};
  CUtensorMap map{}, again{};
  CU(Tiled(&map, dev, 2, dims, strides, box, elem));
  CU(Tiled(&again, dev, 2, dims, strides, box, elem));
  printf("encode.same_bytes=%d\n", std::memcmp(&map, &again, sizeof map) == 0 ? 1 : 0);
  if (e2e::UnderFlyt() && getenv("FLYT_CALL_COUNTS") != nullptr)  // the second one: from the cache
    printf("flyt.server_encodes=%ld\n", ServerEncodes());
  const cuuint32_t other_box[2] = {kBoxCols, kBoxRows / 2};
  CUtensorMap other{};
  CU(Tiled(&other, dev, 2, dims, strides, other_box, elem));
  printf("encode.box_changes_bytes=%d\n", std::memcmp(&map, &other, sizeof map) != 0 ? 1 : 0);
  CUtensorMap fixed{};
  auto* fixed_address = reinterpret_cast<void*>(uintptr_t{0x7f0000100000});
  CU(Tiled(&fixed, fixed_address, 2, dims, strides, box, elem));
  printf("encode.fixed_digest=%016llx\n", static_cast<unsigned long long>(Digest(fixed)));

  e2e::Step("replace address");
  CUtensorMap moved = map;
  CU(g_cu.replace(&moved, out));
  printf("replace.changes_bytes=%d\n", std::memcmp(&moved, &map, sizeof map) != 0 ? 1 : 0);
  CU(g_cu.replace(&moved, dev));
  printf("replace.back_same_bytes=%d\n", std::memcmp(&moved, &map, sizeof map) == 0 ? 1 : 0);

  e2e::Step("tma load");
  const int col = 64, row = 16;
  tma_load_box<<<1, 128>>>(map, out, col, row);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> got(kBoxRows * kBoxCols);
  CK(cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  int copy_ok = 1;
  for (int r = 0; r < kBoxRows; ++r)
    for (int c = 0; c < kBoxCols; ++c)
      copy_ok &= got[r * kBoxCols + c] == host[(row + r) * kCols + col + c];
  printf("tma.copy_ok=%d\n", copy_ok);

  e2e::Step("im2col");
  const cuuint64_t nhwc[4] = {64, 16, 16, 2};  // C, W, H, N
  const cuuint64_t nhwc_strides[3] = {64 * 4, 64 * 16 * 4, 64 * 16 * 16 * 4};
  const int lower[2] = {-1, -1}, upper[2] = {-1, -1};
  const cuuint32_t elem4[4] = {1, 1, 1, 1};
  CUtensorMap conv{};
  CUresult rc =
      g_cu.im2col(&conv, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, dev, nhwc, nhwc_strides, lower, upper,
                  32, 64, elem4, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                  CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  printf("im2col=%s\n", e2e::CuName(rc));

  e2e::Step("errors");
  CUtensorMap bad{};
  const cuuint64_t dims6[6] = {16, 16, 16, 16, 16, 16};
  const cuuint64_t strides6[5] = {64, 1024, 16384, 262144, 4194304};
  const cuuint32_t box6[6] = {4, 4, 4, 4, 4, 4}, elem6[6] = {1, 1, 1, 1, 1, 1};
  const cuuint64_t odd_stride[1] = {kCols * sizeof(float) + 4};
  const cuuint32_t zero_box[2] = {0, kBoxRows}, big_box[2] = {kBoxCols, 257};
  const cuuint32_t big_elem[2] = {9, 1};
  struct {
    const char* what;
    CUresult rc;
  } errors[] = {
      {"null_map", Tiled(nullptr, dev, 2, dims, strides, box, elem)},
      {"rank0", Tiled(&bad, dev, 0, dims, strides, box, elem)},
      {"rank6", Tiled(&bad, dev, 6, dims6, strides6, box6, elem6)},
      {"misaligned", Tiled(&bad, reinterpret_cast<char*>(dev) + 4, 2, dims, strides, box, elem)},
      {"odd_stride", Tiled(&bad, dev, 2, dims, odd_stride, box, elem)},
      {"zero_box", Tiled(&bad, dev, 2, dims, strides, zero_box, elem)},
      {"big_box", Tiled(&bad, dev, 2, dims, strides, big_box, elem)},
      {"big_element_stride", Tiled(&bad, dev, 2, dims, strides, box, big_elem)},
      {"null_dims", Tiled(&bad, dev, 2, nullptr, strides, box, elem)},
  };
  for (const auto& e : errors) printf("error.%s=%s\n", e.what, e2e::CuName(e.rc));
  CK(cudaFree(dev));
  CK(cudaFree(out));
  e2e::Pass();
  return 0;
}
