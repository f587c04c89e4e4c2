// stream_memops: stream memory operations as MPI libraries and multi-stream pipelines use
// them: cuStreamWriteValue32/64 on one stream releases cuStreamWaitValue32/64 on another
// (EQ, GEQ with wrap-around, AND, NOR), the work queued after the wait sees the flag,
// and bad arguments (a misaligned address, unknown flags, NO_MEMORY_BARRIER, which the
// driver refuses on Hopper) are refused at the call.
//
// Prints key=value lines and "stream_memops: PASS". Entry points through
// cudaGetDriverEntryPointByVersion, as cuda-python and the runtime's users get them.
#include <cuda.h>  // driver types only; the program does not link libcuda

#include "e2e_driver.h"

namespace {

struct Driver {
  decltype(&::cuStreamWriteValue32_v2) write32;
  decltype(&::cuStreamWaitValue32_v2) wait32;
  decltype(&::cuStreamWriteValue64_v2) write64;
  decltype(&::cuStreamWaitValue64_v2) wait64;
  decltype(&::cuStreamBatchMemOp_v2) batch;
};
Driver g_cu;

}  // namespace

int main() {
  e2e::Init("stream_memops");
  CK(cudaSetDevice(0));
  e2e::ResolveDriver("cuGetErrorName", &e2e::g_error_name);
  e2e::ResolveDriver("cuStreamWriteValue32", &g_cu.write32);
  e2e::ResolveDriver("cuStreamWaitValue32", &g_cu.wait32);
  e2e::ResolveDriver("cuStreamWriteValue64", &g_cu.write64);
  e2e::ResolveDriver("cuStreamWaitValue64", &g_cu.wait64);
  e2e::ResolveDriver("cuStreamBatchMemOp", &g_cu.batch);
  int mem_ops64 = 0, nor = 0;
  CK(cudaDeviceGetAttribute(
      &mem_ops64, static_cast<cudaDeviceAttr>(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS),
      0));
  CK(cudaDeviceGetAttribute(
      &nor, static_cast<cudaDeviceAttr>(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR), 0));
  printf("attr.64_bit_mem_ops=%d\nattr.wait_value_nor=%d\n", mem_ops64, nor);

  e2e::Step("32-bit: a write on one stream releases a wait on another");
  uint64_t* flags = nullptr;  // [0]: 32-bit flag (and a misaligned neighbour), [1]: 64-bit
  unsigned char* data = nullptr;
  CK(cudaMalloc(&flags, 4 * sizeof(uint64_t)));
  CK(cudaMemset(flags, 0, 4 * sizeof(uint64_t)));
  CK(cudaMalloc(&data, 4096));
  CK(cudaMemset(data, 0, 4096));
  // cudaMemset of device memory may return before it ran, on the legacy stream, which the
  // non-blocking streams below do not wait for: without this the zeroing could land after
  // the first write and the wait for it would never end.
  CK(cudaDeviceSynchronize());
  cudaStream_t writer, waiter;
  CK(cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&waiter, cudaStreamNonBlocking));
  const CUdeviceptr f32 = reinterpret_cast<CUdeviceptr>(flags);
  const CUdeviceptr f64 = reinterpret_cast<CUdeviceptr>(flags + 1);
  CU(g_cu.write32(reinterpret_cast<CUstream>(writer), f32, 7, 0));
  CU(g_cu.wait32(reinterpret_cast<CUstream>(waiter), f32, 7, CU_STREAM_WAIT_VALUE_EQ));
  CK(cudaMemsetAsync(data, 1, 4096, waiter));
  CK(cudaStreamSynchronize(waiter));
  unsigned char first = 0;
  CK(cudaMemcpy(&first, data, 1, cudaMemcpyDeviceToHost));
  printf("eq.after_wait=%d\n", first);

  e2e::Step("32-bit: GEQ across wrap-around, AND, NOR");
  CU(g_cu.write32(reinterpret_cast<CUstream>(writer), f32, 0x00000002u, 0));
  CK(cudaStreamSynchronize(writer));
  // (int32_t)(2 - 0xfffffffe) = 4 >= 0: met although 2 < 0xfffffffe unsigned
  CU(g_cu.wait32(reinterpret_cast<CUstream>(waiter), f32, 0xfffffffeu, CU_STREAM_WAIT_VALUE_GEQ));
  CU(g_cu.wait32(reinterpret_cast<CUstream>(waiter), f32, 0x3u, CU_STREAM_WAIT_VALUE_AND));
  if (nor) CU(g_cu.wait32(reinterpret_cast<CUstream>(waiter), f32, 0x1u, CU_STREAM_WAIT_VALUE_NOR));
  CK(cudaStreamSynchronize(waiter));
  uint32_t now32 = 0;
  CK(cudaMemcpy(&now32, flags, sizeof(now32), cudaMemcpyDeviceToHost));
  printf("value32=%u\n", now32);

  e2e::Step("64-bit");
  if (mem_ops64) {
    const cuuint64_t big = (1ull << 40) + 5;
    CU(g_cu.write64(reinterpret_cast<CUstream>(writer), f64, big, 0));
    CU(g_cu.wait64(reinterpret_cast<CUstream>(waiter), f64, big - 1, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cudaMemsetAsync(data, 2, 4096, waiter));
    CK(cudaStreamSynchronize(waiter));
    CK(cudaMemcpy(&first, data, 1, cudaMemcpyDeviceToHost));
    uint64_t now64 = 0;
    CK(cudaMemcpy(&now64, flags + 1, sizeof(now64), cudaMemcpyDeviceToHost));
    printf("value64=%llu\nge64.after_wait=%d\n", static_cast<unsigned long long>(now64), first);
  }

  e2e::Step("a batch: write, wait, barrier, flush");
  {
    CUstreamBatchMemOpParams ops[4] = {};
    ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    ops[0].writeValue.address = f32 + 16;  // flags[2]: unused so far
    ops[0].writeValue.value = 41;
    ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    ops[1].waitValue.address = f32 + 16;
    ops[1].waitValue.value = 40;
    ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    ops[2].memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
    ops[2].memoryBarrier.flags = CU_STREAM_MEMORY_BARRIER_TYPE_GPU;
    ops[3].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
    ops[3].writeValue.address = f32 + 24;  // flags[3]
    ops[3].writeValue.value64 = 1ull << 33;
    CU(g_cu.batch(reinterpret_cast<CUstream>(waiter), 4, ops, 0));
    CK(cudaStreamSynchronize(waiter));
    uint64_t slots[4] = {};
    CK(cudaMemcpy(slots, flags, sizeof(slots), cudaMemcpyDeviceToHost));
    printf("batch.value32=%u\nbatch.value64=%llu\n", static_cast<uint32_t>(slots[2]),
           static_cast<unsigned long long>(slots[3]));
    CUstreamBatchMemOpParams bogus{};
    bogus.operation = static_cast<CUstreamBatchMemOpType>(77);
    CUresult r = g_cu.batch(reinterpret_cast<CUstream>(waiter), 1, &bogus, 0);
    printf("batch.unknown_op=%s\n", e2e::CuName(r));
  }

  e2e::Step("bad arguments");
  // Driver 580 on an H200 refuses NO_MEMORY_BARRIER (32 and 64 bits).
  CUresult nb = g_cu.write32(reinterpret_cast<CUstream>(writer), f32, 2,
                             CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER);
  printf("write32_no_barrier=%s\n", e2e::CuName(nb));
  if (mem_ops64) {
    nb = g_cu.write64(reinterpret_cast<CUstream>(writer), f64, 1,
                      CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER);
    printf("write64_no_barrier=%s\n", e2e::CuName(nb));
  }
  CUresult r = g_cu.write32(reinterpret_cast<CUstream>(writer), f32 + 2, 1, 0);
  printf("misaligned_write=%s\n", e2e::CuName(r));
  r = g_cu.write32(reinterpret_cast<CUstream>(writer), f32, 1, 0x40);
  printf("bad_write_flags=%s\n", e2e::CuName(r));
  r = g_cu.wait32(reinterpret_cast<CUstream>(waiter), f32, 1, 0x7);
  printf("bad_wait_flags=%s\n", e2e::CuName(r));
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(writer));
  CK(cudaStreamSynchronize(waiter));

  CK(cudaStreamDestroy(writer));
  CK(cudaStreamDestroy(waiter));
  CK(cudaFree(flags));
  CK(cudaFree(data));
  e2e::Pass();
  return 0;
}
