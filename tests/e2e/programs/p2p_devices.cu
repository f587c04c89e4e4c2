// p2p_devices: two GPUs of one server used by one process, the way NVIDIA's
// simpleP2P and p2pBandwidthLatencyTest samples use them: enumerate, ask peer
// capability both ways and the P2P attributes, enable peer access both ways,
// copy with cudaMemcpyPeer / cudaMemcpyPeerAsync both directions at odd sizes
// and offsets, copy between the devices with cudaMemcpyDefault, per-device
// streams and events with cudaSetDevice switching between them, pointer
// attributes naming each allocation's device, memory info per device, and the
// driver's errors: peer access enabled twice, disabled when not enabled, with
// the device itself, an ordinal past the last. Without peer capability (two
// GPUs without P2P, or `flyt-server --sim-no-peer`) enabling answers
// cudaErrorPeerAccessUnsupported and peer copies still work (through the host).
// No kernel runs (the sim runs none); data moves by copies only.
//
// With fewer than two GPUs it prints "skip=..." and passes, natively and
// through Flyt alike. Prints "key=value" lines, then "p2p_devices: PASS".
//
// `p2p_devices quota BYTES` (a server with --memory-quota BYTES): the quota
// holds per GPU: three quarters of it on each device both succeed, half more
// on device 0 is out of memory, and cudaMemGetInfo shows each device's own use.
// `p2p_devices second`: only makes device 1 current and initialises it, then
// prints the runtime's answer (second_device=NAME).
// `p2p_devices hold FILE`: memory on both devices, prints "holding" and keeps
// calling CUDA until FILE exists (a move of the session is asked meanwhile).
#include <sys/stat.h>

#include <vector>

#include "e2e_common.h"

namespace {

// Copies `n` bytes at offset `off` from device `from` to device `to` with
// cudaMemcpyPeer (or its async form on a stream of `to`), and checks them.
void PeerRoundTrip(int from, int to, char* src, char* dst, size_t off, size_t n, bool async,
                   cudaStream_t stream, uint32_t seed) {
  std::vector<unsigned char> in(n), out(n, 0);
  e2e::Fill(in.data(), n, seed);
  CK(cudaSetDevice(from));
  CK(cudaMemcpy(src + off, in.data(), n, cudaMemcpyHostToDevice));
  CK(cudaSetDevice(to));
  if (async) {
    CK(cudaMemcpyPeerAsync(dst + off, to, src + off, from, n, stream));
    CK(cudaStreamSynchronize(stream));
  } else {
    CK(cudaMemcpyPeer(dst + off, to, src + off, from, n));
  }
  CK(cudaMemcpy(out.data(), dst + off, n, cudaMemcpyDeviceToHost));
  EXPECT_SAME(out.data(), in.data(), n, "peer copy");
}

int PointerDevice(const void* p) {
  cudaPointerAttributes a{};
  CK(cudaPointerGetAttributes(&a, p));
  EXPECT(a.type == cudaMemoryTypeDevice, "pointer type %d, expected device", a.type);
  return a.device;
}

}  // namespace

// The memory quota holds for each GPU apart.
int QuotaMode(size_t quota) {
  e2e::Step("quota per device");
  const size_t three_quarters = quota / 4 * 3;
  void* p[2] = {nullptr, nullptr};
  size_t free_after[2] = {0, 0}, total[2] = {0, 0};
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaMalloc(&p[d], three_quarters));
    CK(cudaMemGetInfo(&free_after[d], &total[d]));
  }
  printf("quota.both_devices=ok\n");
  printf("quota.total_equal=%d\n", total[0] == quota && total[1] == quota ? 1 : 0);
  printf(
      "quota.free_each=%d\n",
      free_after[0] == quota - three_quarters && free_after[1] == quota - three_quarters ? 1 : 0);
  CK(cudaSetDevice(0));
  void* more = nullptr;
  EXPECT_ERR(cudaMalloc(&more, quota / 2), cudaErrorMemoryAllocation);
  printf("quota.over_on_device0=refused\n");
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaFree(p[d]));
  }
  e2e::Pass();
  return 0;
}

int main(int argc, char** argv) {
  e2e::Init("p2p_devices");

  e2e::Step("enumerate");
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  if (count < 2) {
    printf("skip=needs 2 GPUs, found %d\n", count);
    e2e::Pass();
    return 0;
  }
  if (argc > 2 && strcmp(argv[1], "quota") == 0) return QuotaMode(strtoull(argv[2], nullptr, 10));
  if (argc > 2 && strcmp(argv[1], "hold") == 0) {
    e2e::Step("hold");
    void* p[2] = {nullptr, nullptr};
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaMalloc(&p[d], 1 << 20));
    }
    printf("holding\n");
    fflush(stdout);
    struct stat st;
    for (int i = 0; i < 3000 && stat(argv[2], &st) != 0; ++i) {
      CK(cudaStreamQuery(0));
      usleep(20000);
    }
    EXPECT(stat(argv[2], &st) == 0, "nobody released the hold");
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaFree(p[d]));
    }
    e2e::Pass();
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "second") == 0) {
    e2e::Step("second device");
    CK(cudaSetDevice(0));
    CK(cudaFree(nullptr));  // device 0's context first, as most apps
    CK(cudaSetDevice(1));
    cudaError_t err = cudaFree(nullptr);  // device 1's primary context
    printf("second_device=%s\n", cudaGetErrorName(err));
    e2e::Pass();
    return 0;
  }
  printf("device_count=%d\n", count);
  for (int d = 0; d < 2; ++d) {
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, d));
    printf("device%d.unified_addressing=%d\n", d, prop.unifiedAddressing);
  }
  {
    cudaDeviceProp p0{}, p1{};
    CK(cudaGetDeviceProperties(&p0, 0));
    CK(cudaGetDeviceProperties(&p1, 1));
    const bool same_uuid = memcmp(p0.uuid.bytes, p1.uuid.bytes, sizeof(p0.uuid.bytes)) == 0;
    const bool same_pci = p0.pciDomainID == p1.pciDomainID && p0.pciBusID == p1.pciBusID &&
                          p0.pciDeviceID == p1.pciDeviceID;
    printf("distinct_uuid=%d\n", same_uuid ? 0 : 1);
    printf("distinct_pci=%d\n", same_pci ? 0 : 1);
    char bus0[32] = {}, bus1[32] = {};
    CK(cudaDeviceGetPCIBusId(bus0, sizeof(bus0), 0));
    CK(cudaDeviceGetPCIBusId(bus1, sizeof(bus1), 1));
    int back = -1;
    CK(cudaDeviceGetByPCIBusId(&back, bus1));
    printf("by_pci_bus_id=%d\n", back);
  }

  e2e::Step("canAccessPeer");
  int can01 = -1, can10 = -1, can00 = -1;
  CK(cudaDeviceCanAccessPeer(&can01, 0, 1));
  CK(cudaDeviceCanAccessPeer(&can10, 1, 0));
  CK(cudaDeviceCanAccessPeer(&can00, 0, 0));
  printf("can_access.0_1=%d\n", can01);
  printf("can_access.1_0=%d\n", can10);
  printf("can_access.self=%d\n", can00);
  EXPECT(can01 == can10, "peer capability differs by direction: %d %d", can01, can10);
  EXPECT_ERR(cudaDeviceCanAccessPeer(&can00, 0, count), cudaErrorInvalidDevice);

  e2e::Step("p2p attributes");
  int access = -1, rank = -1;
  CK(cudaDeviceGetP2PAttribute(&access, cudaDevP2PAttrAccessSupported, 0, 1));
  CK(cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, 0, 1));
  printf("p2p_attr.access_supported=%d\n", access);
  printf("p2p_attr.performance_rank=%d\n", rank);
  EXPECT(access == can01, "access supported %d, canAccessPeer %d", access, can01);
  EXPECT_ERR(cudaDeviceGetP2PAttribute(&access, cudaDevP2PAttrAccessSupported, 0, 0),
             cudaErrorInvalidDevice);
  {
    const cudaAtomicOperation ops[2] = {cudaAtomicOperationIntegerAdd, cudaAtomicOperationFloatAdd};
    unsigned caps[2] = {99, 99};
    CK(cudaDeviceGetP2PAtomicCapabilities(caps, ops, 2, 0, 1));
    printf("p2p_atomic_caps.int_add=%u\n", caps[0]);
    printf("p2p_atomic_caps.float_add=%u\n", caps[1]);
  }

  e2e::Step("allocate on both");
  const size_t kBytes = (3u << 20) + 4099;  // odd: not a multiple of any chunk
  char* buf[2] = {nullptr, nullptr};
  cudaStream_t stream[2] = {nullptr, nullptr};
  cudaEvent_t done[2] = {nullptr, nullptr};
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaMalloc(&buf[d], kBytes));
    CK(cudaStreamCreateWithFlags(&stream[d], cudaStreamNonBlocking));
    CK(cudaEventCreate(&done[d]));
    CK(cudaMemset(buf[d], 0, kBytes));
  }
  EXPECT(buf[0] != buf[1], "the two devices' allocations share an address");
  printf("pointer_device.0=%d\n", PointerDevice(buf[0]));
  printf("pointer_device.1=%d\n", PointerDevice(buf[1]));
  {
    int cur = -1;
    CK(cudaGetDevice(&cur));
    printf("current_after_switch=%d\n", cur);
  }

  e2e::Step("enable peer access");
  if (can01) {
    CK(cudaSetDevice(0));
    CK(cudaDeviceEnablePeerAccess(1, 0));
    EXPECT_ERR(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessAlreadyEnabled);
    CK(cudaSetDevice(1));
    CK(cudaDeviceEnablePeerAccess(0, 0));
    printf("enable.both_ways=1\n");
  } else {
    CK(cudaSetDevice(0));
    EXPECT_ERR(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessUnsupported);
    printf("enable.both_ways=0\n");
  }
  CK(cudaSetDevice(0));
  EXPECT_ERR(cudaDeviceEnablePeerAccess(0, 0), cudaErrorInvalidDevice);
  printf("enable.self=refused\n");

  e2e::Step("peer copies");
  const size_t sizes[] = {1, 7, 4099, (1u << 20) + 3, kBytes - 5};
  uint32_t seed = 11;
  for (size_t n : sizes) {
    const size_t off = n < kBytes - 5 ? 5 : 0;
    PeerRoundTrip(0, 1, buf[0], buf[1], off, n, false, stream[1], seed++);
    PeerRoundTrip(1, 0, buf[1], buf[0], off, n, false, stream[0], seed++);
    PeerRoundTrip(0, 1, buf[0], buf[1], off, n, true, stream[1], seed++);
    PeerRoundTrip(1, 0, buf[1], buf[0], off, n, true, stream[0], seed++);
  }
  printf("peer_copies=%zu\n", sizeof(sizes) / sizeof(sizes[0]) * 4);

  e2e::Step("cudaMemcpyDefault between devices");
  {
    std::vector<unsigned char> in(kBytes), out(kBytes, 0);
    e2e::Fill(in.data(), kBytes, 99);
    CK(cudaSetDevice(0));
    CK(cudaMemcpy(buf[0], in.data(), kBytes, cudaMemcpyDefault));
    CK(cudaMemcpy(buf[1], buf[0], kBytes, cudaMemcpyDefault));
    CK(cudaSetDevice(1));
    CK(cudaMemcpy(out.data(), buf[1], kBytes, cudaMemcpyDefault));
    EXPECT_SAME(out.data(), in.data(), kBytes, "cudaMemcpyDefault 0 -> 1");
    std::fill(out.begin(), out.end(), 0);
    CK(cudaMemcpyAsync(buf[0] + 1, buf[1] + 2, kBytes - 3, cudaMemcpyDefault, stream[1]));
    CK(cudaStreamSynchronize(stream[1]));
    CK(cudaMemcpy(out.data(), buf[0] + 1, kBytes - 3, cudaMemcpyDefault));
    EXPECT_SAME(out.data(), in.data() + 2, kBytes - 3, "cudaMemcpyDefault 1 -> 0, async");
    printf("memcpy_default=ok\n");
  }

  e2e::Step("per-device streams and events");
  {
    std::vector<unsigned char> in(4096), out(4096, 0);
    e2e::Fill(in.data(), in.size(), 5);
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaMemcpyAsync(buf[d], in.data(), in.size(), cudaMemcpyHostToDevice, stream[d]));
      CK(cudaEventRecord(done[d], stream[d]));
    }
    // Device 1's stream waits for device 0's event, then copies peer to peer.
    CK(cudaSetDevice(1));
    CK(cudaStreamWaitEvent(stream[1], done[0], 0));
    CK(cudaMemcpyPeerAsync(buf[1] + 4096, 1, buf[0], 0, in.size(), stream[1]));
    CK(cudaEventRecord(done[1], stream[1]));
    CK(cudaEventSynchronize(done[1]));
    CK(cudaEventQuery(done[1]));
    CK(cudaMemcpy(out.data(), buf[1] + 4096, out.size(), cudaMemcpyDeviceToHost));
    EXPECT_SAME(out.data(), in.data(), in.size(), "copy after a cross-device event wait");
    int stream_dev = -1;
    CK(cudaSetDevice(0));
    CK(cudaStreamGetDevice(stream[1], &stream_dev));
    printf("stream1_device=%d\n", stream_dev);
    CK(cudaDeviceSynchronize());
    CK(cudaSetDevice(1));
    CK(cudaDeviceSynchronize());
    printf("streams_events=ok\n");
  }

  e2e::Step("memory info per device");
  {
    size_t free0 = 0, total0 = 0, free1 = 0, total1 = 0;
    CK(cudaSetDevice(0));
    CK(cudaMemGetInfo(&free0, &total0));
    CK(cudaSetDevice(1));
    CK(cudaMemGetInfo(&free1, &total1));
    EXPECT(total0 > 0 && total1 > 0, "totals %zu %zu", total0, total1);
    EXPECT(free0 <= total0 && free1 <= total1, "free above total");
  }

  e2e::Step("disable peer access");
  if (can01) {
    CK(cudaSetDevice(0));
    CK(cudaDeviceDisablePeerAccess(1));
    EXPECT_ERR(cudaDeviceDisablePeerAccess(1), cudaErrorPeerAccessNotEnabled);
    CK(cudaSetDevice(1));
    CK(cudaDeviceDisablePeerAccess(0));
    // Peer copies work without peer access too (the driver stages them).
    PeerRoundTrip(0, 1, buf[0], buf[1], 3, 4097, false, stream[1], 77);
  } else {
    CK(cudaSetDevice(0));
    EXPECT_ERR(cudaDeviceDisablePeerAccess(1), cudaErrorPeerAccessNotEnabled);
  }
  printf("disable.not_enabled=refused\n");

  e2e::Step("free");
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaEventDestroy(done[d]));
    CK(cudaStreamDestroy(stream[d]));
    CK(cudaFree(buf[d]));
  }
  e2e::Pass();
  return 0;
}
