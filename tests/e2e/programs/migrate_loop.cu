// migrate_loop: a program that keeps allocating, copying, launching and
// freeing while its GPU state is moved under it (flyt-server migrate,
// checkpoint/restore). Each step allocates a buffer of an odd size, fills it,
// copies it device-to-device into a buffer kept from the start, runs a kernel
// that changes a device counter, records and synchronizes events on a stream
// of its own priority, frees some earlier buffers and reads everything back.
// Every value is checked against what the host computed, and the step prints
// a checksum, so a moved run's output equals an undisturbed run's.
//
//   migrate_loop STEPS PAUSE_MS [EXTRA_MIB] [pinned]
//
// EXTRA_MIB: that much more device memory, filled at the start (one value
// per MiB) and checked at the end (a sample of every MiB), to measure how a
// move's pause grows with the memory in use. `pinned`: every upload and
// read-back goes through one pinned buffer (cudaMallocHost, as PyTorch's
// pin_memory), asynchronously on the stream; over shm:// the server maps it.
// `pinned-mapped`: the same, after asking for the buffer's device pointer.
// `two-servers` (FLYT_SERVER "A,B"): the loop runs on device 1 (server B)
// while a mirror of the kept buffer lives on device 0 (server A), copied there
// server to server and read back every step.
//
// Prints "step N sum=S" per step, then "migrate_loop: PASS".
#include <unistd.h>

#include <cstring>
#include <vector>

#include "e2e_common.h"

// On a GPU: counter[0] -= 1, counter[1] += 1. The sim backend does the same
// for kernels of this name (server/sim_backend.cc), so results are checked in CI.
__global__ void flyt_sim_countdown(unsigned long long /*unused handle*/, int* counter) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    counter[0] -= 1;
    counter[1] += 1;
  }
}

namespace {

uint64_t Sum(const std::vector<unsigned char>& v) {
  uint64_t s = 1469598103934665603ull;
  for (unsigned char c : v) s = (s ^ c) * 1099511628211ull;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  e2e::Init("migrate_loop", 300);
  const int steps = argc > 1 ? atoi(argv[1]) : 10;
  const int pause_ms = argc > 2 ? atoi(argv[2]) : 0;
  e2e::Step("setup");
  const bool two = argc > 4 && std::strcmp(argv[4], "two-servers") == 0;
  if (two) CK(cudaSetDevice(1));
  int least = 0, greatest = 0;
  CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream;
  CK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  cudaEvent_t before, after, done;
  CK(cudaEventCreate(&before));
  CK(cudaEventCreate(&after));
  CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  const size_t kKeep = 3 << 20;  // kept from the start: every step writes a slice
  unsigned char* keep = nullptr;
  CK(cudaMalloc(&keep, kKeep));
  CK(cudaMemset(keep, 0x5a, kKeep));
  std::printf("keep_at=%p\n", static_cast<void*>(keep));  // where movable memory lives
  std::vector<unsigned char> host_keep(kKeep, 0x5a);
  unsigned char* mirror = nullptr;  // two-servers: on device 0
  if (two) {
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&mirror, kKeep));
    CK(cudaSetDevice(1));
  }
  int* counter = nullptr;
  CK(cudaMalloc(&counter, 2 * sizeof(int)));
  int start[2] = {1000000, 0};
  CK(cudaMemcpy(counter, start, sizeof(start), cudaMemcpyHostToDevice));
  const size_t extra_mib = argc > 3 ? strtoull(argv[3], nullptr, 10) : 0;
  unsigned char* extra = nullptr;
  if (extra_mib > 0) {
    CK(cudaMalloc(&extra, extra_mib << 20));
    for (size_t m = 0; m < extra_mib; ++m)
      CK(cudaMemsetAsync(extra + (m << 20), static_cast<int>(m * 7 + 1) & 0xff, 1 << 20, stream));
    CK(cudaStreamSynchronize(stream));
    std::printf("extra %zu MiB\n", extra_mib);
    std::fflush(stdout);
  }
  const bool mapped = argc > 4 && std::strcmp(argv[4], "pinned-mapped") == 0;
  const bool pinned = mapped || (argc > 4 && std::strcmp(argv[4], "pinned") == 0);
  const size_t kPin = (2 << 20) + 4099;
  unsigned char* pin = nullptr;
  if (pinned) {
    CK(cudaMallocHost(&pin, kPin));
    std::printf("pinned %zu bytes\n", kPin);
  }
  if (mapped) {  // a kernel may read it through this pointer from now on
    void* device = nullptr;
    CK(cudaHostGetDevicePointer(&device, pin, 0));
    EXPECT(device != nullptr, "a device pointer for the pinned buffer");
    std::printf("pinned device pointer asked\n");
  }
  // Through the pinned buffer when there is one: host -> pin -> device, device -> pin -> host.
  auto upload = [&](unsigned char* dev, const unsigned char* src, size_t n) {
    if (!pinned || n > kPin) {
      CK(cudaMemcpyAsync(dev, src, n, cudaMemcpyHostToDevice, stream));
      return;
    }
    CK(cudaStreamSynchronize(stream));  // the pinned buffer's last copy is done
    std::memcpy(pin, src, n);
    CK(cudaMemcpyAsync(dev, pin, n, cudaMemcpyHostToDevice, stream));
  };
  auto download = [&](unsigned char* dst, const unsigned char* dev, size_t n) {
    if (!pinned || n > kPin) {
      CK(cudaMemcpy(dst, dev, n, cudaMemcpyDeviceToHost));
      return;
    }
    CK(cudaMemcpyAsync(pin, dev, n, cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    std::memcpy(dst, pin, n);
  };
  struct Buffer {
    unsigned char* dev;
    std::vector<unsigned char> host;
  };
  std::vector<Buffer> live;
  for (int i = 0; i < steps; ++i) {
    e2e::Step("step");
    // An odd size: small ones share the driver's granules, big ones do not.
    const size_t n = (i % 3 == 0) ? (1u << 20) + 4096 * i + 13 : 777 + 131 * i;
    Buffer b{nullptr, std::vector<unsigned char>(n)};
    CK(cudaMalloc(&b.dev, n));
    e2e::Fill(b.host.data(), n, 0x1234u + i);
    upload(b.dev, b.host.data(), n);
    const size_t slice = std::min<size_t>(n, 4096);
    const size_t at = (static_cast<size_t>(i) * 65537) % (kKeep - slice);
    CK(cudaMemcpyAsync(keep + at, b.dev, slice, cudaMemcpyDeviceToDevice, stream));
    std::copy(b.host.begin(), b.host.begin() + slice, host_keep.begin() + at);
    CK(cudaEventRecord(before, stream));
    flyt_sim_countdown<<<1, 32, 0, stream>>>(0, counter);
    CK(cudaGetLastError());
    CK(cudaEventRecord(after, stream));
    CK(cudaEventRecord(done, stream));
    CK(cudaEventSynchronize(done));
    float ms = -1;
    CK(cudaEventElapsedTime(&ms, before, after));
    EXPECT(ms >= 0, "elapsed time %f", ms);
    // Without timing, as natively: the flags moved with the event.
    EXPECT(cudaEventElapsedTime(&ms, before, done) == cudaErrorInvalidResourceHandle,
           "elapsed time to an event without timing");
    EXPECT(cudaGetLastError() == cudaErrorInvalidResourceHandle, "the last error");
    live.push_back(std::move(b));
    if (live.size() > 4) {  // free one from the middle: holes in the address space
      CK(cudaFree(live[1].dev));
      live.erase(live.begin() + 1);
    }
    // Read everything back and compare.
    for (const Buffer& x : live) {
      std::vector<unsigned char> got(x.host.size());
      download(got.data(), x.dev, got.size());
      EXPECT_SAME(got.data(), x.host.data(), got.size(), "a live buffer");
    }
    std::vector<unsigned char> got_keep(kKeep);
    CK(cudaMemcpy(got_keep.data(), keep, kKeep, cudaMemcpyDeviceToHost));
    EXPECT_SAME(got_keep.data(), host_keep.data(), kKeep, "the kept buffer");
    if (two) {  // server B to server A, then read back from A
      CK(cudaMemcpy(mirror, keep, kKeep, cudaMemcpyDefault));
      std::vector<unsigned char> got_mirror(kKeep);
      CK(cudaMemcpy(got_mirror.data(), mirror, kKeep, cudaMemcpyDeviceToHost));
      EXPECT_SAME(got_mirror.data(), host_keep.data(), kKeep, "the mirror on device 0");
    }
    int c[2];
    CK(cudaMemcpy(c, counter, sizeof(c), cudaMemcpyDeviceToHost));
    EXPECT(c[0] == 1000000 - (i + 1) && c[1] == i + 1, "counter %d %d after step %d", c[0], c[1],
           i);
    if (pinned) {  // the GPU writes the pinned buffer through its host address (UVA)
      CK(cudaStreamSynchronize(stream));
      CK(cudaMemsetAsync(pin + kPin - 64, (i * 7 + 1) & 0xff, 64, stream));
      CK(cudaStreamSynchronize(stream));
      EXPECT(e2e::FirstNot(pin + kPin - 64, static_cast<unsigned char>((i * 7 + 1) & 0xff), 64) < 0,
             "a memset of the pinned buffer at step %d", i);
    }
    std::printf("step %d sum=%llu counter=%d\n", i, static_cast<unsigned long long>(Sum(got_keep)),
                c[1]);
    std::fflush(stdout);
    if (pause_ms > 0) usleep(pause_ms * 1000);
  }
  e2e::Step("extra");
  for (size_t m = 0; m < extra_mib; ++m) {
    unsigned char sample[64];
    CK(cudaMemcpy(sample, extra + (m << 20) + ((m * 4099) % ((1 << 20) - 64)), sizeof(sample),
                  cudaMemcpyDeviceToHost));
    EXPECT(e2e::FirstNot(sample, static_cast<unsigned char>((m * 7 + 1) & 0xff), 64) < 0,
           "extra memory MiB %zu", m);
  }
  if (extra != nullptr) CK(cudaFree(extra));
  e2e::Step("teardown");
  for (const Buffer& x : live) CK(cudaFree(x.dev));
  CK(cudaFree(keep));
  CK(cudaFree(counter));
  if (pin != nullptr) CK(cudaFreeHost(pin));
  if (mirror != nullptr) CK(cudaFree(mirror));
  CK(cudaEventDestroy(before));
  CK(cudaEventDestroy(after));
  CK(cudaEventDestroy(done));
  CK(cudaStreamDestroy(stream));
  CK(cudaStreamQuery(0));
  e2e::Pass();
}
