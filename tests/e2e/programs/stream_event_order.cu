// stream_event_order: stream priorities, in-stream ordering of async copies and memsets,
// cudaLaunchHostFunc / cudaStreamAddCallback order and data visibility, cross-stream order
// through cudaStreamWaitEvent, event record/synchronize/query/elapsed time, cudaStreamQuery
// on a stream held by a blocked host function, and cudaDeviceSynchronize waiting for host
// functions. Kernels are launched only as stream work; their results are never checked.
// Prints "stream_event_order: PASS".
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <cuda_profiler_api.h>

#include "e2e_common.h"

__global__ void noop_kernel(int x) {
  if (x == 0x7fffffff && threadIdx.x == 1023) __trap();
}

namespace {

std::mutex g_mu;
std::vector<int> g_order;          // ids of host functions / callbacks, in the order run
std::atomic<int> g_bad_status{0};  // callbacks that saw an error status
std::atomic<int> g_counter{0};

void RecordId(int id) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_order.push_back(id);
}

std::vector<int> TakeOrder() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<int> out;
  out.swap(g_order);
  return out;
}

std::string Join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

void HostFuncRecord(void* arg) { RecordId(static_cast<int>(reinterpret_cast<intptr_t>(arg))); }

void CUDART_CB StreamCallbackRecord(cudaStream_t, cudaError_t status, void* arg) {
  if (status != cudaSuccess) g_bad_status++;
  RecordId(static_cast<int>(reinterpret_cast<intptr_t>(arg)));
}

// A host function that checks the bytes a preceding D2H copy in its stream delivered.
struct DataCheck {
  const unsigned char* got;
  const unsigned char* want;
  size_t n;
  int id;
  std::atomic<int> result{-1};  // -1 never ran, 0 data wrong, 1 data right
};
void HostFuncCheckData(void* arg) {
  DataCheck* c = static_cast<DataCheck*>(arg);
  c->result = memcmp(c->got, c->want, c->n) == 0 ? 1 : 0;
  RecordId(c->id);
}

// A host function that blocks its stream until `release` is set (or 20 s pass).
struct Gate {
  std::atomic<bool> release{false};
  std::atomic<bool> entered{false};
  std::atomic<bool> timed_out{false};
};
void HostFuncGate(void* arg) {
  Gate* g = static_cast<Gate*>(arg);
  g->entered = true;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!g->release.load()) {
    if (std::chrono::steady_clock::now() > deadline) {
      g->timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void HostFuncCount(void*) { g_counter++; }

unsigned char* PinnedFilled(size_t n, uint32_t seed) {
  unsigned char* p = nullptr;
  CK(cudaMallocHost(reinterpret_cast<void**>(&p), n));
  if (seed)
    e2e::Fill(p, n, seed);
  else
    memset(p, 0, n);
  return p;
}

}  // namespace

int main() {
  e2e::Init("stream_event_order", 120);

  e2e::Step("stream priorities");
  int least = 0, greatest = 0;
  CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  printf("priority_range least=%d greatest=%d\n", least, greatest);
  EXPECT(greatest <= least, "greatest priority %d is numerically above least %d", greatest, least);
  const int prios[4] = {least, greatest, (least + greatest) / 2, least};
  const unsigned flags[4] = {cudaStreamNonBlocking, cudaStreamNonBlocking, cudaStreamDefault,
                             cudaStreamNonBlocking};
  cudaStream_t s[4];
  for (int i = 0; i < 4; ++i) {
    CK(cudaStreamCreateWithPriority(&s[i], flags[i], prios[i]));
    int got = 12345;
    unsigned got_flags = 12345;
    CK(cudaStreamGetPriority(s[i], &got));
    CK(cudaStreamGetFlags(s[i], &got_flags));
    EXPECT(got == prios[i], "stream %d priority %d, created with %d", i, got, prios[i]);
    EXPECT(got_flags == flags[i], "stream %d flags %u, created with %u", i, got_flags, flags[i]);
  }

  const size_t n = 1 << 20;
  unsigned char *d0 = nullptr, *d1 = nullptr;
  CK(cudaMalloc(&d0, n));
  CK(cudaMalloc(&d1, n));

  e2e::Step("in-stream order of copies and memsets");
  {
    unsigned char* a = PinnedFilled(n, 11);
    unsigned char* b = PinnedFilled(n, 0);
    unsigned char* c = PinnedFilled(n, 12);
    unsigned char* dd = PinnedFilled(n, 0);
    unsigned char* e = PinnedFilled(n, 0);
    CK(cudaMemcpyAsync(d0, a, n, cudaMemcpyHostToDevice, s[0]));
    CK(cudaMemcpyAsync(b, d0, n, cudaMemcpyDeviceToHost, s[0]));
    noop_kernel<<<1, 32, 0, s[0]>>>(1);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(d0, c, n, cudaMemcpyHostToDevice, s[0]));
    CK(cudaMemcpyAsync(dd, d0, n, cudaMemcpyDeviceToHost, s[0]));
    CK(cudaMemsetAsync(d0, 0x77, n, s[0]));
    CK(cudaMemcpyAsync(e, d0, n, cudaMemcpyDeviceToHost, s[0]));
    CK(cudaStreamSynchronize(s[0]));
    EXPECT_SAME(b, a, n, "first read-back (before the second write)");
    EXPECT_SAME(dd, c, n, "second read-back (after the second write)");
    EXPECT(e2e::FirstNot(e, 0x77, n) < 0, "read-back after cudaMemsetAsync, byte %lld",
           e2e::FirstNot(e, 0x77, n));
    CK(cudaStreamQuery(s[0]));  // idle after a synchronize
    for (unsigned char* p : {a, b, c, dd, e}) CK(cudaFreeHost(p));
  }

  e2e::Step("host functions and callbacks in stream order");
  {
    unsigned char* x = PinnedFilled(n, 21);
    unsigned char* y = PinnedFilled(n, 0);
    DataCheck check;
    check.got = y;
    check.want = x;
    check.n = n;
    check.id = 1;
    TakeOrder();
    CK(cudaMemcpyAsync(d1, x, n, cudaMemcpyHostToDevice, s[1]));
    CK(cudaMemcpyAsync(y, d1, n, cudaMemcpyDeviceToHost, s[1]));
    CK(cudaLaunchHostFunc(s[1], HostFuncCheckData, &check));
    CK(cudaStreamAddCallback(s[1], StreamCallbackRecord, reinterpret_cast<void*>(2), 0));
    noop_kernel<<<2, 64, 0, s[1]>>>(2);
    CK(cudaGetLastError());
    CK(cudaLaunchHostFunc(s[1], HostFuncRecord, reinterpret_cast<void*>(3)));
    CK(cudaStreamAddCallback(s[1], StreamCallbackRecord, reinterpret_cast<void*>(4), 0));
    CK(cudaLaunchHostFunc(s[1], HostFuncRecord, reinterpret_cast<void*>(5)));
    CK(cudaStreamSynchronize(s[1]));
    // cudaStreamSynchronize returns only after the stream's host functions have run.
    std::vector<int> order = TakeOrder();
    printf("callback_order=%s\n", Join(order).c_str());
    EXPECT(order == std::vector<int>({1, 2, 3, 4, 5}),
           "host functions/callbacks ran as [%s], want [1,2,3,4,5]", Join(order).c_str());
    EXPECT(check.result == 1, "a host function after a D2H copy in its stream saw %s (result %d)",
           check.result == 0 ? "stale data" : "nothing: it never ran", check.result.load());
    EXPECT(g_bad_status == 0, "%d stream callbacks got an error status", g_bad_status.load());
    CK(cudaFreeHost(x));
    CK(cudaFreeHost(y));
  }

  e2e::Step("cross-stream order through cudaStreamWaitEvent");
  {
    cudaEvent_t ev;
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    unsigned char* p = PinnedFilled(n, 31);
    unsigned char* q = PinnedFilled(n, 0);
    TakeOrder();
    // Stream 2 writes d1 and runs host function 10; stream 3 waits for that, then reads d1
    // and runs host function 11.
    CK(cudaMemcpyAsync(d1, p, n, cudaMemcpyHostToDevice, s[2]));
    CK(cudaLaunchHostFunc(s[2], HostFuncRecord, reinterpret_cast<void*>(10)));
    CK(cudaEventRecord(ev, s[2]));
    CK(cudaStreamWaitEvent(s[3], ev, 0));
    CK(cudaMemcpyAsync(q, d1, n, cudaMemcpyDeviceToHost, s[3]));
    CK(cudaLaunchHostFunc(s[3], HostFuncRecord, reinterpret_cast<void*>(11)));
    CK(cudaStreamSynchronize(s[3]));
    EXPECT_SAME(q, p, n, "read on stream 3 after waiting for stream 2's write");
    CK(cudaStreamSynchronize(s[2]));
    std::vector<int> order = TakeOrder();
    printf("cross_stream_order=%s\n", Join(order).c_str());
    EXPECT(order == std::vector<int>({10, 11}), "cross-stream host functions ran as [%s]",
           Join(order).c_str());
    // Waiting on an event that was never recorded is a no-op.
    cudaEvent_t never;
    CK(cudaEventCreate(&never));
    CK(cudaStreamWaitEvent(s[0], never, 0));
    CK(cudaStreamSynchronize(s[0]));
    CK(cudaEventQuery(never));  // an unrecorded event counts as complete
    CK(cudaEventDestroy(never));
    CK(cudaEventDestroy(ev));
    CK(cudaFreeHost(p));
    CK(cudaFreeHost(q));
  }

  e2e::Step("events: record, synchronize, query, elapsed time");
  {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreateWithFlags(&e1, cudaEventDefault));
    unsigned char* src = PinnedFilled(n, 41);
    unsigned char* dst = PinnedFilled(n, 0);
    CK(cudaEventRecord(e0, s[0]));
    CK(cudaMemcpyAsync(d0, src, n, cudaMemcpyHostToDevice, s[0]));
    noop_kernel<<<dim3(4, 2, 1), dim3(32, 2, 1), 0, s[0]>>>(3);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(dst, d0, n, cudaMemcpyDeviceToHost, s[0]));
    CK(cudaEventRecord(e1, s[0]));
    CK(cudaEventSynchronize(e1));
    // The copy before e1 has completed once e1 has.
    EXPECT_SAME(dst, src, n, "D2H copy recorded before an event, after cudaEventSynchronize");
    CK(cudaEventQuery(e1));
    CK(cudaEventQuery(e0));
    float ms = -1.0f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("elapsed_ms_nonnegative=%d\n", ms >= 0.0f ? 1 : 0);
    EXPECT(ms >= 0.0f, "cudaEventElapsedTime gave %f ms", static_cast<double>(ms));

    // Completion seen through cudaStreamQuery also means the copy's bytes have arrived.
    memset(dst, 0, n);
    e2e::Fill(src, n, 42);
    CK(cudaMemcpyAsync(d1, src, n, cudaMemcpyHostToDevice, s[1]));
    CK(cudaMemcpyAsync(dst, d1, n, cudaMemcpyDeviceToHost, s[1]));
    cudaError_t q = cudaErrorNotReady;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while ((q = cudaStreamQuery(s[1])) == cudaErrorNotReady &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    EXPECT(q == cudaSuccess, "cudaStreamQuery polling ended with %d (%s)", static_cast<int>(q),
           cudaGetErrorName(q));
    EXPECT_SAME(dst, src, n, "D2H copy after cudaStreamQuery reported the stream idle");
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFreeHost(src));
    CK(cudaFreeHost(dst));
  }

  e2e::Step("cudaStreamQuery / cudaEventQuery while a host function holds the stream");
  {
    Gate gate;
    cudaEvent_t after;
    CK(cudaEventCreate(&after));
    CK(cudaLaunchHostFunc(s[2], HostFuncGate, &gate));
    CK(cudaEventRecord(after, s[2]));
    CK(cudaMemsetAsync(d0, 0x12, 4096, s[2]));
    cudaError_t sq = cudaStreamQuery(s[2]);
    cudaError_t eq = cudaEventQuery(after);
    gate.release = true;
    printf("held_stream_query=%s held_event_query=%s\n", cudaGetErrorName(sq),
           cudaGetErrorName(eq));
    CK(cudaStreamSynchronize(s[2]));
    EXPECT(!gate.timed_out,
           "the gate host function waited 20 s: cudaStreamQuery or "
           "cudaEventQuery blocked on the host function instead of answering");
    EXPECT(sq == cudaErrorNotReady, "cudaStreamQuery on a held stream gave %d (%s)",
           static_cast<int>(sq), cudaGetErrorName(sq));
    EXPECT(eq == cudaErrorNotReady, "cudaEventQuery behind a held stream gave %d (%s)",
           static_cast<int>(eq), cudaGetErrorName(eq));
    cudaGetLastError();  // cudaErrorNotReady is not sticky, but clear it anyway
    CK(cudaStreamQuery(s[2]));
    CK(cudaEventQuery(after));
    CK(cudaEventDestroy(after));
  }

  e2e::Step("cudaDeviceSynchronize waits for host functions on every stream");
  {
    g_counter = 0;
    for (int i = 0; i < 12; ++i) {
      CK(cudaLaunchHostFunc(s[i % 4], HostFuncCount, nullptr));
      if (i % 3 == 0) {
        noop_kernel<<<1, 1, 0, s[i % 4]>>>(i);
        CK(cudaGetLastError());
      }
    }
    CK(cudaLaunchHostFunc(nullptr, HostFuncCount, nullptr));  // legacy default stream
    CK(cudaDeviceSynchronize());
    EXPECT(g_counter == 13, "%d of 13 host functions had run after cudaDeviceSynchronize",
           g_counter.load());
  }

  e2e::Step("teardown");
  for (int i = 0; i < 4; ++i) {
    CK(cudaStreamQuery(s[i]));
    CK(cudaStreamDestroy(s[i]));
  }
  e2e::Step("stream attributes and profiler control");
  {
    // An L2 access policy window, as apps that pin hot data in L2 set it.
    int max_window = 0;
    CK(cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, 0));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaStreamAttrValue v;
    memset(&v, 0, sizeof(v));
    v.accessPolicyWindow.base_ptr = d0;
    v.accessPolicyWindow.num_bytes =
        max_window > 0 && max_window < (1 << 20) ? max_window : 1 << 20;
    v.accessPolicyWindow.hitRatio = 0.5f;
    v.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    CK(cudaStreamSetAttribute(st, cudaStreamAttributeAccessPolicyWindow, &v));
    cudaStreamAttrValue got;
    memset(&got, 0, sizeof(got));
    CK(cudaStreamGetAttribute(st, cudaStreamAttributeAccessPolicyWindow, &got));
    EXPECT(got.accessPolicyWindow.base_ptr == d0 &&
               got.accessPolicyWindow.num_bytes == v.accessPolicyWindow.num_bytes &&
               got.accessPolicyWindow.hitRatio == 0.5f &&
               got.accessPolicyWindow.hitProp == cudaAccessPropertyPersisting &&
               got.accessPolicyWindow.missProp == cudaAccessPropertyStreaming,
           "the access policy window did not read back as set");
    cudaStreamAttrValue bad = v;
    bad.accessPolicyWindow.hitRatio = 2.0f;  // out of [0, 1]
    EXPECT(cudaStreamSetAttribute(st, cudaStreamAttributeAccessPolicyWindow, &bad) ==
               cudaErrorInvalidValue,
           "a hit ratio of 2 was accepted");
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue, "the last error is not the refusal");
    CK(cudaGetLastError());  // and it is not sticky
    CK(cudaStreamSynchronize(st));
    CK(cudaStreamDestroy(st));
    CK(cudaProfilerStart());
    CK(cudaProfilerStop());
    printf("stream_attributes=ok profiler=ok\n");
  }
  CK(cudaFree(d0));
  CK(cudaFree(d1));
  CK(cudaGetLastError());
  e2e::Pass();
  return 0;
}
