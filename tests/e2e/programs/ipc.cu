// ipc: CUDA IPC between two processes, as NVIDIA's simpleIPC sample does it.
//
// The parent allocates, writes a pattern, exports the allocation
// (cudaIpcGetMemHandle) and an interprocess event (cudaEventInterprocess |
// cudaEventDisableTiming, cudaIpcGetEventHandle), and starts a child: itself
// again, with the handles in hex as arguments. The child opens both, checks
// the parent's bytes, writes its own pattern (copy and memset), records and
// synchronizes the event, and closes the memory. The parent then sees the
// child's bytes. Misuse answers the driver's errors and leaves the session
// working: opening a process's own handles (201), bogus handles (1 for
// memory, 205 for events), flags without cudaIpcMemLazyEnablePeerAccess,
// exporting a non-interprocess event (400) or pool memory (1), freeing opened
// memory with cudaFree (1), closing it once too often (1), timing or
// re-exporting an opened event (400). The child leaves one open mapping for
// its process's end to close. Prints key=value lines for the harness;
// the parent's last line is "ipc: PASS". Never checks what a kernel computed.
#include <sys/wait.h>

#include <vector>

#include "e2e_common.h"

__global__ void Touch(unsigned char* p, size_t n) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) p[i] = p[i];  // leaves the bytes as they are
}

namespace {

constexpr size_t kBytes = (1 << 20) + 4096;  // not a multiple of 2 MiB
constexpr size_t kTail = 16;                 // the child memsets the last bytes
constexpr unsigned char kTailValue = 0x5a;
constexpr uint32_t kParentSeed = 0x1bc;
constexpr uint32_t kChildSeed = 0x2cd;

void FromHex(const char* s, void* out, size_t n) {
  EXPECT(strlen(s) == 2 * n, "a handle argument of %zu hex digits, want %zu", strlen(s), 2 * n);
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  auto* b = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < n; ++i) {
    int hi = digit(s[2 * i]), lo = digit(s[2 * i + 1]);
    EXPECT(hi >= 0 && lo >= 0, "not hex: %s", s);
    b[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
}

// Expects `call` to fail with exactly `want` and prints key=<code>.
#define EXPECT_ERROR(key, call, want)                                                          \
  do {                                                                                         \
    cudaError_t got_ = (call);                                                                 \
    printf("%s=%d\n", key, static_cast<int>(got_));                                            \
    EXPECT(got_ == (want), "%s returned %d (%s), want %d (%s)", #call, static_cast<int>(got_), \
           cudaGetErrorName(got_), static_cast<int>(want), cudaGetErrorName(want));            \
  } while (0)

// An allocation and a copy round trip: the session still works.
void StillWorks(const char* when) {
  e2e::Step(when);
  void* d = nullptr;
  CK(cudaMalloc(&d, 4096));
  std::vector<unsigned char> in(4096), out(4096);
  e2e::Fill(in.data(), in.size(), 77);
  CK(cudaMemcpy(d, in.data(), in.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(out.data(), d, out.size(), cudaMemcpyDeviceToHost));
  EXPECT_SAME(out.data(), in.data(), in.size(), when);
  CK(cudaFree(d));
}

std::vector<unsigned char> ChildPattern() {
  std::vector<unsigned char> want(kBytes);
  e2e::Fill(want.data(), want.size(), kChildSeed);
  memset(want.data() + kBytes - kTail, kTailValue, kTail);
  return want;
}

int Child(const char* mem_hex, const char* event_hex) {
  e2e::Init("ipc-child");
  cudaIpcMemHandle_t mh;
  cudaIpcEventHandle_t eh;
  FromHex(mem_hex, &mh, sizeof(mh));
  FromHex(event_hex, &eh, sizeof(eh));
  CK(cudaSetDevice(0));

  e2e::Step("child: open the parent's memory (twice: one mapping, counted)");
  unsigned char* p = nullptr;
  CK(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&p), mh, cudaIpcMemLazyEnablePeerAccess));
  EXPECT(p != nullptr, "a null pointer");
  unsigned char* again = nullptr;
  CK(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&again), mh, cudaIpcMemLazyEnablePeerAccess));
  EXPECT(again == p, "the second open gave %p, the first %p", again, p);
  cudaPointerAttributes attr{};
  CK(cudaPointerGetAttributes(&attr, p));
  EXPECT(attr.type == cudaMemoryTypeDevice, "pointer type %d", static_cast<int>(attr.type));

  e2e::Step("child: the parent's bytes");
  std::vector<unsigned char> want(kBytes), got(kBytes);
  e2e::Fill(want.data(), want.size(), kParentSeed);
  CK(cudaMemcpy(got.data(), p, kBytes, cudaMemcpyDeviceToHost));
  EXPECT_SAME(got.data(), want.data(), kBytes, "the parent's pattern, read in the child");
  CK(cudaMemcpy(got.data(), p + 4096, 4096, cudaMemcpyDeviceToHost));
  EXPECT_SAME(got.data(), want.data() + 4096, 4096, "an interior range of it");
  printf("child.read=ok\n");

  e2e::Step("child: a kernel on the opened memory");
  Touch<<<static_cast<unsigned>((kBytes + 255) / 256), 256>>>(p, kBytes);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  e2e::Step("child: write its own pattern, then record the parent's event");
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<unsigned char> mine = ChildPattern();
  CK(cudaMemcpyAsync(p, mine.data(), kBytes - kTail, cudaMemcpyHostToDevice, stream));
  CK(cudaMemsetAsync(p + kBytes - kTail, kTailValue, kTail, stream));
  cudaEvent_t ev;
  CK(cudaIpcOpenEventHandle(&ev, eh));
  CK(cudaEventRecord(ev, stream));
  CK(cudaEventSynchronize(ev));
  CK(cudaEventQuery(ev));
  CK(cudaStreamWaitEvent(stream, ev, 0));
  CK(cudaStreamSynchronize(stream));
  printf("child.write=ok\n");

  e2e::Step("child: misuse of opened memory and events");
  float ms = 0;
  EXPECT_ERROR("child.event_elapsed", cudaEventElapsedTime(&ms, ev, ev),
               cudaErrorInvalidResourceHandle);
  cudaIpcEventHandle_t reexport;
  EXPECT_ERROR("child.event_reexport", cudaIpcGetEventHandle(&reexport, ev),
               cudaErrorInvalidResourceHandle);
  cudaIpcMemHandle_t bogus;
  memset(&bogus, 0, sizeof(bogus));
  void* q = nullptr;
  EXPECT_ERROR("child.bogus_open", cudaIpcOpenMemHandle(&q, bogus, cudaIpcMemLazyEnablePeerAccess),
               cudaErrorInvalidValue);
  EXPECT_ERROR("child.free_opened", cudaFree(p), cudaErrorInvalidValue);
  StillWorks("child: the session after misuse");

  e2e::Step("child: close (once per open)");
  CK(cudaEventDestroy(ev));
  CK(cudaStreamDestroy(stream));
  CK(cudaIpcCloseMemHandle(p));
  CK(cudaIpcCloseMemHandle(p));
  EXPECT_ERROR("child.close_again", cudaIpcCloseMemHandle(p), cudaErrorInvalidValue);
  StillWorks("child: the session after closing");

  e2e::Step("child: open again and leave it open (closed when the process ends)");
  CK(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&p), mh, cudaIpcMemLazyEnablePeerAccess));
  CK(cudaMemcpy(got.data(), p, 4096, cudaMemcpyDeviceToHost));
  EXPECT_SAME(got.data(), mine.data(), 4096, "the child's pattern, read after reopening");
  printf("child.left_open=1\n");
  printf("child.done=ok\n");
  fflush(stdout);
  return 0;
}

std::string HexOf(const void* p, size_t n) { return e2e::Hex(p, n); }

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && strcmp(argv[1], "child") == 0) return Child(argv[2], argv[3]);
  e2e::Init("ipc");

  e2e::Step("parent: allocate and write");
  CK(cudaSetDevice(0));
  int ipc_events = 0;
  CK(cudaDeviceGetAttribute(&ipc_events, cudaDevAttrIpcEventSupport, 0));
  EXPECT(ipc_events == 1, "cudaDevAttrIpcEventSupport %d", ipc_events);
  unsigned char* d = nullptr;
  CK(cudaMalloc(&d, kBytes));
  std::vector<unsigned char> pattern(kBytes);
  e2e::Fill(pattern.data(), pattern.size(), kParentSeed);
  CK(cudaMemcpy(d, pattern.data(), kBytes, cudaMemcpyHostToDevice));

  e2e::Step("parent: export the memory and an interprocess event");
  cudaIpcMemHandle_t mh;
  CK(cudaIpcGetMemHandle(&mh, d));
  cudaIpcMemHandle_t same;
  CK(cudaIpcGetMemHandle(&same, d));
  EXPECT(memcmp(&mh, &same, sizeof(mh)) == 0, "two exports of one allocation differ");
  cudaIpcMemHandle_t interior;
  CK(cudaIpcGetMemHandle(&interior, d + 4096));  // any address inside names the allocation
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
  cudaIpcEventHandle_t eh;
  CK(cudaIpcGetEventHandle(&eh, ev));

  e2e::Step("parent: misuse");
  void* q = nullptr;
  // A process may not open its own handles (CUDA_ERROR_INVALID_CONTEXT).
  EXPECT_ERROR("own_open", cudaIpcOpenMemHandle(&q, mh, cudaIpcMemLazyEnablePeerAccess),
               cudaErrorDeviceUninitialized);
  cudaEvent_t own_ev;
  EXPECT_ERROR("own_event_open", cudaIpcOpenEventHandle(&own_ev, eh), cudaErrorDeviceUninitialized);
  cudaIpcMemHandle_t bogus;
  memset(&bogus, 0, sizeof(bogus));
  EXPECT_ERROR("bogus_open", cudaIpcOpenMemHandle(&q, bogus, cudaIpcMemLazyEnablePeerAccess),
               cudaErrorInvalidValue);
  memset(&bogus, 0xab, sizeof(bogus));
  EXPECT_ERROR("garbage_open", cudaIpcOpenMemHandle(&q, bogus, cudaIpcMemLazyEnablePeerAccess),
               cudaErrorInvalidValue);
  cudaIpcEventHandle_t bogus_event;
  memset(&bogus_event, 0, sizeof(bogus_event));
  EXPECT_ERROR("bogus_event_open", cudaIpcOpenEventHandle(&own_ev, bogus_event),
               cudaErrorMapBufferObjectFailed);
  cudaEvent_t plain;
  CK(cudaEventCreateWithFlags(&plain, cudaEventDisableTiming));
  cudaIpcEventHandle_t plain_handle;
  EXPECT_ERROR("plain_event_export", cudaIpcGetEventHandle(&plain_handle, plain),
               cudaErrorInvalidResourceHandle);
  CK(cudaEventDestroy(plain));
  void* pooled = nullptr;
  CK(cudaMallocAsync(&pooled, 4096, 0));
  CK(cudaStreamSynchronize(0));
  cudaIpcMemHandle_t pooled_handle;
  EXPECT_ERROR("pool_export", cudaIpcGetMemHandle(&pooled_handle, pooled), cudaErrorInvalidValue);
  CK(cudaFreeAsync(pooled, 0));
  CK(cudaStreamSynchronize(0));
  StillWorks("parent: the session after misuse");

  e2e::Step("parent: run the child");
  std::string mem_hex = HexOf(&mh, sizeof(mh)), event_hex = HexOf(&eh, sizeof(eh));
  fflush(stdout);
  pid_t child = fork();
  EXPECT(child >= 0, "fork failed");
  if (child == 0) {
    char self[] = "/proc/self/exe";
    char mode[] = "child";
    char* args[] = {argv[0], mode, mem_hex.data(), event_hex.data(), nullptr};
    execv(self, args);
    _exit(127);
  }
  int status = 0;
  EXPECT(waitpid(child, &status, 0) == child, "waitpid failed");
  printf("child_status=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status 0x%x)", status);

  e2e::Step("parent: the child's event and bytes");
  CK(cudaEventSynchronize(ev));
  CK(cudaEventQuery(ev));
  std::vector<unsigned char> got(kBytes);
  CK(cudaMemcpy(got.data(), d, kBytes, cudaMemcpyDeviceToHost));
  std::vector<unsigned char> want = ChildPattern();
  EXPECT_SAME(got.data(), want.data(), kBytes, "the child's pattern, read in the parent");
  printf("parent.read=ok\n");

  e2e::Step("parent: clean up");
  CK(cudaEventDestroy(ev));
  CK(cudaFree(d));
  StillWorks("parent: the session at the end");
  e2e::Pass();
  return 0;
}
