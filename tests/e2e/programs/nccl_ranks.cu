// NCCL through Flyt as multi-process and multi-GPU programs use it (issue 19):
//
//   nccl_ranks ranks N    N processes, one rank each on device rank % count (forked before
//                         any CUDA call; rank 0's unique id reaches the others over pipes):
//                         every collective on a stream of the app's, odd sizes, several types
//                         and ops, a send/recv ring in a group, a PreMulSum op, a split by
//                         color with reversed keys, argument errors, then destroy.
//   nccl_ranks single N   one process, ncclCommInitAll over devices 0..N-1 and an all-reduce
//                         on each in one group.
//
// Every result is checked against what NCCL computes natively (integers and small
// integral floats: exact in every order of summation). Prints "key=value" lines the
// harness reads (version, rank<r>.count).
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "e2e_common.h"
#include "e2e_nccl.h"

namespace {

template <typename T>
T* DeviceCopy(const std::vector<T>& host) {
  T* d = nullptr;
  CK(cudaMalloc(&d, host.size() * sizeof(T) + 1));
  CK(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
std::vector<T> HostCopy(const T* d, size_t n) {
  std::vector<T> host(n);
  CK(cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

uint16_t Bf16(float f) {  // exact for the small integers used here
  uint32_t bits = 0;
  memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

void RunRank(int rank, int n, const ncclUniqueId& id) {
  char step[64];
  int devices = 0;
  CK(cudaGetDeviceCount(&devices));
  const int device = rank % devices;
  CK(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  e2e::Step("init");
  ncclComm_t comm = nullptr;
  NK(ncclCommInitRank(&comm, n, id, rank));
  int count = 0, me = -1, cudev = -1;
  NK(ncclCommCount(comm, &count));
  NK(ncclCommUserRank(comm, &me));
  NK(ncclCommCuDevice(comm, &cudev));
  EXPECT(count == n && me == rank && cudev == device, "count %d rank %d device %d", count, me,
         cudev);
  printf("rank%d.count=%d\n", rank, count);

  e2e::Step("all-reduce float sum");
  const size_t big = 1000003;
  {
    std::vector<float> h(big);
    for (size_t i = 0; i < big; ++i) h[i] = static_cast<float>((rank + 1) * (i % 13));
    float* d = DeviceCopy(h);
    NK(ncclAllReduce(d, d, big, ncclFloat32, ncclSum, comm, s));  // in place
    CK(cudaStreamSynchronize(s));
    std::vector<float> got = HostCopy(d, big);
    const float tri = static_cast<float>(n * (n + 1) / 2);
    for (size_t i = 0; i < big; ++i)
      EXPECT(got[i] == tri * static_cast<float>(i % 13), "element %zu: %g", i, got[i]);
    CK(cudaFree(d));
  }
  e2e::Step("all-reduce int32 max, min, prod; float avg; bfloat16 sum");
  {
    const size_t m = 4097;
    std::vector<int32_t> h(m), p(m);
    for (size_t i = 0; i < m; ++i) {
      h[i] = rank * 1000 + static_cast<int32_t>(i % 100);
      p[i] = rank + 2;
    }
    int32_t* d = DeviceCopy(h);
    int32_t* out = DeviceCopy(h);
    int32_t* dp = DeviceCopy(p);
    NK(ncclAllReduce(d, out, m, ncclInt32, ncclMax, comm, s));
    CK(cudaStreamSynchronize(s));
    std::vector<int32_t> got = HostCopy(out, m);
    for (size_t i = 0; i < m; ++i)
      EXPECT(got[i] == (n - 1) * 1000 + static_cast<int32_t>(i % 100), "max %zu: %d", i, got[i]);
    NK(ncclAllReduce(d, out, m, ncclInt32, ncclMin, comm, s));
    CK(cudaStreamSynchronize(s));
    got = HostCopy(out, m);
    for (size_t i = 0; i < m; ++i)
      EXPECT(got[i] == static_cast<int32_t>(i % 100), "min %zu: %d", i, got[i]);
    NK(ncclAllReduce(dp, dp, m, ncclInt32, ncclProd, comm, s));
    CK(cudaStreamSynchronize(s));
    got = HostCopy(dp, m);
    int32_t prod = 1;
    for (int r = 0; r < n; ++r) prod *= r + 2;
    EXPECT(got[0] == prod && got[m - 1] == prod, "prod %d %d, want %d", got[0], got[m - 1], prod);
    CK(cudaFree(d));
    CK(cudaFree(out));
    CK(cudaFree(dp));

    std::vector<float> f(m, static_cast<float>((rank + 1) * 2));
    float* df = DeviceCopy(f);
    NK(ncclAllReduce(df, df, m, ncclFloat32, ncclAvg, comm, s));
    CK(cudaStreamSynchronize(s));
    std::vector<float> avg = HostCopy(df, m);
    EXPECT(avg[0] == static_cast<float>(n + 1) && avg[m - 1] == avg[0], "avg %g", avg[0]);
    CK(cudaFree(df));

    std::vector<uint16_t> b(m, Bf16(1.0f));
    uint16_t* db = DeviceCopy(b);
    NK(ncclAllReduce(db, db, m, ncclBfloat16, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    std::vector<uint16_t> bg = HostCopy(db, m);
    EXPECT(bg[0] == Bf16(static_cast<float>(n)) && bg[m - 1] == bg[0], "bf16 0x%04x", bg[0]);
    CK(cudaFree(db));
  }
  e2e::Step("broadcast, reduce");
  {
    const size_t m = 65539;
    std::vector<uint8_t> h(m, 0), want(m);
    e2e::Fill(want.data(), m, 77);
    if (rank == n - 1) h = want;
    uint8_t* d = DeviceCopy(h);
    NK(ncclBroadcast(d, d, m, ncclUint8, n - 1, comm, s));
    CK(cudaStreamSynchronize(s));
    std::vector<uint8_t> got = HostCopy(d, m);
    EXPECT_SAME(got.data(), want.data(), m, "broadcast");
    CK(cudaFree(d));

    std::vector<int64_t> v(1001, static_cast<int64_t>(rank) << 33);
    int64_t* dv = DeviceCopy(v);
    int64_t* dr = DeviceCopy(v);
    NK(ncclReduce(dv, dr, v.size(), ncclInt64, ncclSum, 0, comm, s));
    CK(cudaStreamSynchronize(s));
    if (rank == 0) {
      std::vector<int64_t> r = HostCopy(dr, v.size());
      const int64_t want_sum = (static_cast<int64_t>(n) * (n - 1) / 2) << 33;
      EXPECT(r[0] == want_sum && r[1000] == want_sum, "reduce %lld", static_cast<long long>(r[0]));
    }
    CK(cudaFree(dv));
    CK(cudaFree(dr));
  }
  e2e::Step("all-gather, reduce-scatter");
  {
    const size_t m = 1001;
    std::vector<int32_t> h(m);
    for (size_t i = 0; i < m; ++i) h[i] = rank * 10000 + static_cast<int32_t>(i);
    int32_t* d = DeviceCopy(h);
    int32_t* all = DeviceCopy(std::vector<int32_t>(m * n, -1));
    NK(ncclAllGather(d, all, m, ncclInt32, comm, s));
    CK(cudaStreamSynchronize(s));
    std::vector<int32_t> got = HostCopy(all, m * n);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < m; i += 97)
        EXPECT(got[r * m + i] == r * 10000 + static_cast<int32_t>(i), "gather %d.%zu: %d", r, i,
               got[r * m + i]);
    CK(cudaFree(d));
    CK(cudaFree(all));

    const size_t part = 517;
    std::vector<float> f(part * n, static_cast<float>(rank + 1));
    float* df = DeviceCopy(f);
    float* dout = DeviceCopy(std::vector<float>(part, 0.0f));
    NK(ncclReduceScatter(df, dout, part, ncclFloat32, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    std::vector<float> rs = HostCopy(dout, part);
    EXPECT(rs[0] == static_cast<float>(n * (n + 1) / 2) && rs[part - 1] == rs[0], "scatter %g",
           rs[0]);
    CK(cudaFree(df));
    CK(cudaFree(dout));
  }
  e2e::Step("send/recv ring in a group");
  {
    const size_t m = 4099;
    std::vector<uint8_t> h(m), want(m);
    e2e::Fill(h.data(), m, 100 + rank);
    e2e::Fill(want.data(), m, 100 + (rank + n - 1) % n);
    uint8_t* d = DeviceCopy(h);
    uint8_t* r = DeviceCopy(std::vector<uint8_t>(m, 0));
    NK(ncclGroupStart());
    NK(ncclSend(d, m, ncclUint8, (rank + 1) % n, comm, s));
    NK(ncclRecv(r, m, ncclUint8, (rank + n - 1) % n, comm, s));
    NK(ncclGroupEnd());
    CK(cudaStreamSynchronize(s));
    std::vector<uint8_t> got = HostCopy(r, m);
    EXPECT_SAME(got.data(), want.data(), m, "ring");
    CK(cudaFree(d));
    CK(cudaFree(r));
  }
  e2e::Step("PreMulSum");
  {
    float half = 0.5f;
    ncclRedOp_t op;
    NK(ncclRedOpCreatePreMulSum(&op, &half, ncclFloat32, ncclScalarHostImmediate, comm));
    half = 4.0f;  // taken by value at creation
    std::vector<float> f(33, static_cast<float>((rank + 1) * 2));
    float* df = DeviceCopy(f);
    NK(ncclAllReduce(df, df, f.size(), ncclFloat32, op, comm, s));
    CK(cudaStreamSynchronize(s));
    std::vector<float> got = HostCopy(df, f.size());
    EXPECT(got[0] == static_cast<float>(n * (n + 1) / 2), "premulsum %g", got[0]);
    NK(ncclRedOpDestroy(op, comm));
    CK(cudaFree(df));
  }
  e2e::Step("split");
  {
    ncclComm_t sub = nullptr;
    NK(ncclCommSplit(comm, rank % 2, -rank, &sub, nullptr));
    EXPECT(sub != nullptr, "no communicator");
    int sub_count = 0, sub_rank = -1;
    NK(ncclCommCount(sub, &sub_count));
    NK(ncclCommUserRank(sub, &sub_rank));
    int same = 0, higher = 0, parity_sum = 0;
    for (int r = rank % 2; r < n; r += 2) {
      ++same;
      parity_sum += r;
      if (r > rank) ++higher;
    }
    EXPECT(sub_count == same && sub_rank == higher, "split count %d rank %d, want %d %d", sub_count,
           sub_rank, same, higher);
    std::vector<int32_t> v(7, rank);
    int32_t* dv = DeviceCopy(v);
    NK(ncclAllReduce(dv, dv, v.size(), ncclInt32, ncclSum, sub, s));
    CK(cudaStreamSynchronize(s));
    std::vector<int32_t> got = HostCopy(dv, v.size());
    EXPECT(got[6] == parity_sum, "split sum %d, want %d", got[6], parity_sum);
    CK(cudaFree(dv));
    NK(ncclCommDestroy(sub));
  }
  e2e::Step("argument errors");
  {
    float* d = nullptr;
    CK(cudaMalloc(&d, 64));
    ncclResult_t r = ncclAllReduce(d, d, 4, static_cast<ncclDataType_t>(99), ncclSum, comm, s);
    EXPECT(r == ncclInvalidArgument, "a bad datatype gave %d", r);
    r = ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, nullptr, s);
    EXPECT(r == ncclInvalidArgument, "a null communicator gave %d", r);
    ncclResult_t async = ncclInternalError;
    NK(ncclCommGetAsyncError(comm, &async));
    EXPECT(async == ncclSuccess, "async error %d", async);
    // The communicator goes on working after refused calls, as a blocking one does.
    std::vector<int32_t> v(5, rank + 1);
    int32_t* dv = DeviceCopy(v);
    NK(ncclAllReduce(dv, dv, v.size(), ncclInt32, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    std::vector<int32_t> got = HostCopy(dv, v.size());
    EXPECT(got[4] == n * (n + 1) / 2, "after the errors: %d", got[4]);
    CK(cudaFree(dv));
    CK(cudaFree(d));
  }
  snprintf(step, sizeof step, "destroy (rank %d)", rank);
  e2e::Step(step);
  NK(ncclCommDestroy(comm));
  CK(cudaStreamDestroy(s));
}

void RunSingle(int n) {
  e2e::Step("ncclCommInitAll");
  std::vector<ncclComm_t> comms(n);
  NK(ncclCommInitAll(comms.data(), n, nullptr));
  std::vector<float*> bufs(n);
  const size_t m = 100003;
  for (int d = 0; d < n; ++d) {
    CK(cudaSetDevice(d));
    int dev = -1, rank = -1;
    NK(ncclCommCuDevice(comms[d], &dev));
    NK(ncclCommUserRank(comms[d], &rank));
    EXPECT(dev == d && rank == d, "comm %d: device %d rank %d", d, dev, rank);
    bufs[d] = DeviceCopy(std::vector<float>(m, static_cast<float>(d + 1)));
  }
  e2e::Step("one group, all devices");
  NK(ncclGroupStart());
  for (int d = 0; d < n; ++d) {
    CK(cudaSetDevice(d));
    NK(ncclAllReduce(bufs[d], bufs[d], m, ncclFloat32, ncclSum, comms[d], nullptr));
  }
  NK(ncclGroupEnd());
  for (int d = 0; d < n; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaDeviceSynchronize());
    std::vector<float> got = HostCopy(bufs[d], m);
    EXPECT(got[0] == static_cast<float>(n * (n + 1) / 2) && got[m - 1] == got[0], "device %d: %g",
           d, got[0]);
    CK(cudaFree(bufs[d]));
    NK(ncclCommDestroy(comms[d]));
  }
}

}  // namespace

int main(int argc, char** argv) {
  e2e::Init("nccl_ranks", 120);
  const char* mode = argc > 1 ? argv[1] : "ranks";
  const int n = argc > 2 ? atoi(argv[2]) : 2;
  EXPECT(n >= 1 && n <= 16, "rank count %d", n);
  if (strcmp(mode, "single") == 0) {
    int version = 0;
    NK(ncclGetVersion(&version));
    printf("version=%d\n", version);
    RunSingle(n);
    e2e::Pass();
    return 0;
  }
  // Children first, before any CUDA call; each waits for the id on its pipe.
  std::vector<int> pipes(n, -1);
  std::vector<pid_t> kids;
  for (int r = 1; r < n; ++r) {
    int fd[2];
    EXPECT(pipe(fd) == 0, "pipe");
    pid_t pid = fork();
    EXPECT(pid >= 0, "fork");
    if (pid == 0) {
      close(fd[1]);
      ncclUniqueId id;
      size_t got = 0;
      while (got < sizeof id) {
        ssize_t k = read(fd[0], reinterpret_cast<char*>(&id) + got, sizeof id - got);
        if (k <= 0) _exit(4);  // rank 0 died before it sent the id
        got += static_cast<size_t>(k);
      }
      RunRank(r, n, id);
      fflush(stdout);
      _exit(0);
    }
    close(fd[0]);
    pipes[r] = fd[1];
    kids.push_back(pid);
  }
  int version = 0;
  NK(ncclGetVersion(&version));
  printf("version=%d\n", version);
  ncclUniqueId id;
  NK(ncclGetUniqueId(&id));
  for (int r = 1; r < n; ++r) {
    EXPECT(write(pipes[r], &id, sizeof id) == static_cast<ssize_t>(sizeof id), "write id");
    close(pipes[r]);
  }
  RunRank(0, n, id);
  for (pid_t pid : kids) {
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid, "waitpid");
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank process %d ended with status 0x%x",
           static_cast<int>(pid), status);
  }
  e2e::Pass();
  return 0;
}
