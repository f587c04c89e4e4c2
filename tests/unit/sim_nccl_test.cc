// Tests of the sim backend's NCCL (server/sim_nccl.cc): ranks in threads of
// this process and in forked processes meet at a hub over TCP and reduce
// ordinary host memory (what the sim's device memory is).
//
// Owns: nothing but these tests.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <thread>
#include <vector>

#include "server/nccl_api.h"

namespace flyt::server {
namespace {

constexpr int kInt32 = 2, kFloat32 = 7, kBf16 = 9;
constexpr int kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4;

uint16_t ToBf16(float f) {  // round to nearest even, as the sim
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}
float FromBf16(uint16_t h) {
  uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}

// Runs fn(rank) on n threads and joins them.
void OnRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

class SimNccl : public ::testing::Test {
 protected:
  void SetUp() override { LoadSimNccl(&api_); }
  void TearDown() override {
    for (NcclComm c : comms_) EXPECT_EQ(api_.ncclCommDestroy(c), nccl::kSuccess);
  }
  // n ranks of one id, initialised on n threads.
  void MakeComms(int n) {
    nccl::UniqueId id;
    ASSERT_EQ(api_.ncclGetUniqueId(&id), nccl::kSuccess);
    comms_.assign(n, nullptr);
    std::vector<int> rcs(n, -1);
    OnRanks(n, [&](int r) { rcs[r] = api_.ncclCommInitRankConfig(&comms_[r], n, id, r, nullptr); });
    for (int r = 0; r < n; ++r) ASSERT_EQ(rcs[r], nccl::kSuccess) << r;
  }
  NcclApi api_;
  std::vector<NcclComm> comms_;
};

TEST_F(SimNccl, VersionAndQueries) {
  int v = 0;
  ASSERT_EQ(api_.ncclGetVersion(&v), nccl::kSuccess);
  EXPECT_EQ(v, 22809);
  EXPECT_EQ(api_.ncclCommShrink, nullptr);
  MakeComms(2);
  int n = 0, rank = -1, dev = -1;
  EXPECT_EQ(api_.ncclCommCount(comms_[1], &n), nccl::kSuccess);
  EXPECT_EQ(api_.ncclCommUserRank(comms_[1], &rank), nccl::kSuccess);
  EXPECT_EQ(api_.ncclCommCuDevice(comms_[1], &dev), nccl::kSuccess);
  EXPECT_EQ(n, 2);
  EXPECT_EQ(rank, 1);
  EXPECT_EQ(dev, 0);  // no sim context current: device 0
  void* h = nullptr;
  char buf[64];
  EXPECT_EQ(api_.ncclCommRegister(comms_[0], buf, sizeof buf, &h), nccl::kSuccess);
  EXPECT_NE(h, nullptr);
  EXPECT_EQ(api_.ncclCommDeregister(comms_[0], h), nccl::kSuccess);
  EXPECT_EQ(api_.ncclCommDeregister(comms_[0], h), nccl::kInvalidArgument);
  int err = -1;
  EXPECT_EQ(api_.ncclCommGetAsyncError(comms_[0], &err), nccl::kSuccess);
  EXPECT_EQ(err, nccl::kSuccess);
  EXPECT_EQ(api_.ncclCommFinalize(comms_[0]), nccl::kSuccess);
  std::thread([&] { EXPECT_STREQ(api_.ncclGetLastError(nullptr), ""); }).join();
}

// Every op for float, int32 and bfloat16, odd counts, three ranks.
TEST_F(SimNccl, AllReduceEveryOpAndType) {
  constexpr int n = 3;
  MakeComms(n);
  for (size_t count : {size_t{1}, size_t{1000003}}) {
    for (int type : {kFloat32, kInt32, kBf16}) {
      const size_t es = type == kBf16 ? 2 : 4;
      for (int op : {kSum, kProd, kMax, kMin, kAvg}) {
        auto value = [](int r, size_t i) { return static_cast<int>((i * 7 + r) % 5) + r + 1; };
        std::vector<std::vector<uint8_t>> send(n, std::vector<uint8_t>(count * es));
        std::vector<std::vector<uint8_t>> recv(n, std::vector<uint8_t>(count * es, 0xee));
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) {
            int v = value(r, i);
            if (type == kInt32) std::memcpy(&send[r][i * 4], &v, 4);
            if (type == kFloat32) {
              float f = static_cast<float>(v) * 0.5f;
              std::memcpy(&send[r][i * 4], &f, 4);
            }
            if (type == kBf16) {
              uint16_t h = ToBf16(static_cast<float>(v));
              std::memcpy(&send[r][i * 2], &h, 2);
            }
          }
        std::vector<int> rcs(n, -1);
        OnRanks(n, [&](int r) {
          rcs[r] = api_.ncclAllReduce(send[r].data(), recv[r].data(), count, type, op, comms_[r],
                                      nullptr);
        });
        for (int r = 0; r < n; ++r) ASSERT_EQ(rcs[r], nccl::kSuccess);
        for (size_t i = 0; i < count; ++i) {
          auto combine = [op](auto a, auto b) {
            switch (op) {
              case kProd:
                return a * b;
              case kMax:
                return a > b ? a : b;
              case kMin:
                return a < b ? a : b;
              default:
                return a + b;
            }
          };
          std::vector<uint8_t> want(es);
          if (type == kInt32) {
            int acc = value(0, i);
            for (int r = 1; r < n; ++r) acc = combine(acc, value(r, i));
            if (op == kAvg) acc /= n;
            std::memcpy(want.data(), &acc, 4);
          } else {
            const float scale = type == kFloat32 ? 0.5f : 1.0f;
            float acc = static_cast<float>(value(0, i)) * scale;
            for (int r = 1; r < n; ++r) acc = combine(acc, static_cast<float>(value(r, i)) * scale);
            if (op == kAvg) acc /= static_cast<float>(n);
            if (type == kFloat32) {
              std::memcpy(want.data(), &acc, 4);
            } else {
              uint16_t h = ToBf16(acc);
              std::memcpy(want.data(), &h, 2);
            }
          }
          for (int r = 0; r < n; ++r)
            ASSERT_EQ(std::memcmp(&recv[r][i * es], want.data(), es), 0)
                << "type " << type << " op " << op << " count " << count << " rank " << r
                << " element " << i;
        }
      }
    }
  }
  // A bfloat16 average that is not exact: rounded once from float.
  EXPECT_EQ(FromBf16(ToBf16(7.0f / 3.0f)), FromBf16(ToBf16(2.333333f)));
}

TEST_F(SimNccl, BroadcastReduceGatherScatterAlltoAll) {
  constexpr int n = 4;
  constexpr size_t m = 5;
  MakeComms(n);
  // Broadcast from root 2, in place.
  std::vector<std::vector<int>> buf(n, std::vector<int>(m, -1));
  for (size_t i = 0; i < m; ++i) buf[2][i] = 100 + static_cast<int>(i);
  OnRanks(n, [&](int r) {
    EXPECT_EQ(api_.ncclBroadcast(buf[r].data(), buf[r].data(), m, kInt32, 2, comms_[r], nullptr),
              nccl::kSuccess);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(buf[r], buf[2]) << r;
  // Reduce (sum) to root 1: only the root's buffer changes.
  std::vector<std::vector<int>> out(n, std::vector<int>(m, -7));
  OnRanks(n, [&](int r) {
    std::vector<int> mine(m, r + 1);
    EXPECT_EQ(api_.ncclReduce(mine.data(), out[r].data(), m, kInt32, kSum, 1, comms_[r], nullptr),
              nccl::kSuccess);
  });
  EXPECT_EQ(out[1], std::vector<int>(m, 1 + 2 + 3 + 4));
  EXPECT_EQ(out[0], std::vector<int>(m, -7));
  // All-gather.
  std::vector<std::vector<int>> all(n, std::vector<int>(m * n));
  OnRanks(n, [&](int r) {
    std::vector<int> mine(m);
    for (size_t i = 0; i < m; ++i) mine[i] = r * 10 + static_cast<int>(i);
    EXPECT_EQ(api_.ncclAllGather(mine.data(), all[r].data(), m, kInt32, comms_[r], nullptr),
              nccl::kSuccess);
  });
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < m; ++i) EXPECT_EQ(all[r][j * m + i], j * 10 + static_cast<int>(i));
  // Reduce-scatter (max): rank r gets the max of segment r.
  std::vector<std::vector<int>> seg(n, std::vector<int>(m));
  OnRanks(n, [&](int r) {
    std::vector<int> mine(m * n);
    for (size_t k = 0; k < m * n; ++k) mine[k] = static_cast<int>(k) * (r == 3 ? 2 : 1);
    EXPECT_EQ(
        api_.ncclReduceScatter(mine.data(), seg[r].data(), m, kInt32, kMax, comms_[r], nullptr),
        nccl::kSuccess);
  });
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < m; ++i) EXPECT_EQ(seg[r][i], static_cast<int>(r * m + i) * 2);
  // All-to-all: block j of rank r goes to rank j as its block r.
  std::vector<std::vector<int>> got(n, std::vector<int>(m * n));
  OnRanks(n, [&](int r) {
    std::vector<int> mine(m * n);
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < m; ++i) mine[j * m + i] = r * 1000 + j * 10 + static_cast<int>(i);
    EXPECT_EQ(api_.ncclAlltoAll(mine.data(), got[r].data(), m, kInt32, comms_[r], nullptr),
              nccl::kSuccess);
  });
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < m; ++i)
        EXPECT_EQ(got[r][j * m + i], j * 1000 + r * 10 + static_cast<int>(i));
}

TEST_F(SimNccl, SendRecvRingInsideAGroup) {
  constexpr int n = 4;
  constexpr size_t m = 1001;
  MakeComms(n);
  std::vector<std::vector<float>> in(n, std::vector<float>(m)), out(n, std::vector<float>(m));
  OnRanks(n, [&](int r) {
    for (size_t i = 0; i < m; ++i) in[r][i] = static_cast<float>(r * 10000 + i);
    EXPECT_EQ(api_.ncclGroupStart(), nccl::kSuccess);
    EXPECT_EQ(api_.ncclSend(in[r].data(), m, kFloat32, (r + 1) % n, comms_[r], nullptr),
              nccl::kSuccess);
    EXPECT_EQ(api_.ncclRecv(out[r].data(), m, kFloat32, (r + n - 1) % n, comms_[r], nullptr),
              nccl::kSuccess);
    EXPECT_EQ(api_.ncclGroupEnd(), nccl::kSuccess);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r], in[(r + n - 1) % n]) << r;
  // A count that differs between the send and its recv: both fail.
  std::vector<int> rcs(2, -1);
  OnRanks(2, [&](int r) {
    rcs[r] = r == 0 ? api_.ncclSend(in[0].data(), 3, kFloat32, 1, comms_[0], nullptr)
                    : api_.ncclRecv(out[1].data(), 4, kFloat32, 0, comms_[1], nullptr);
  });
  EXPECT_EQ(rcs[0], nccl::kInvalidUsage);
  EXPECT_EQ(rcs[1], nccl::kInvalidUsage);
}

// One thread initialises and drives two ranks through groups.
TEST_F(SimNccl, OneThreadDrivesTwoRanksInGroups) {
  nccl::UniqueId id;
  ASSERT_EQ(api_.ncclGetUniqueId(&id), nccl::kSuccess);
  comms_.assign(2, nullptr);
  ASSERT_EQ(api_.ncclGroupStart(), nccl::kSuccess);
  ASSERT_EQ(api_.ncclGroupStart(), nccl::kSuccess);  // nested
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(api_.ncclCommInitRankConfig(&comms_[r], 2, id, r, nullptr), nccl::kSuccess);
  ASSERT_EQ(api_.ncclGroupEnd(), nccl::kSuccess);
  // Still inside the outer group: collectives queue behind the inits.
  std::vector<double> a{1.5, 2.5, 3.5}, b{10, 20, 30}, ra(3), rb(3);
  ASSERT_EQ(api_.ncclAllReduce(a.data(), ra.data(), 3, 8, kSum, comms_[0], nullptr),
            nccl::kSuccess);
  ASSERT_EQ(api_.ncclAllReduce(b.data(), rb.data(), 3, 8, kSum, comms_[1], nullptr),
            nccl::kSuccess);
  ASSERT_EQ(api_.ncclGroupEnd(), nccl::kSuccess);
  EXPECT_EQ(ra, (std::vector<double>{11.5, 22.5, 33.5}));
  EXPECT_EQ(rb, ra);
  EXPECT_EQ(api_.ncclGroupEnd(), nccl::kInvalidUsage);  // no group open
}

TEST_F(SimNccl, SplitByColorOrderedByKey) {
  constexpr int n = 5;
  MakeComms(n);
  std::vector<NcclComm> split(n, reinterpret_cast<NcclComm>(1));
  std::vector<int> rcs(n, -1);
  OnRanks(n, [&](int r) {
    int color = r == 4 ? -1 : r % 2;
    rcs[r] = api_.ncclCommSplit(comms_[r], color, -r, &split[r], nullptr);
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(rcs[r], nccl::kSuccess) << r;
  EXPECT_EQ(split[4], nullptr);
  // Color 0: old ranks 0 and 2, keys 0 and -2: old 2 is the new rank 0.
  const int want_rank[4] = {1, 1, 0, 0};
  for (int r = 0; r < 4; ++r) {
    int count = 0, rank = -1;
    ASSERT_EQ(api_.ncclCommCount(split[r], &count), nccl::kSuccess);
    ASSERT_EQ(api_.ncclCommUserRank(split[r], &rank), nccl::kSuccess);
    EXPECT_EQ(count, 2);
    EXPECT_EQ(rank, want_rank[r]) << r;
  }
  std::vector<int> sums(4);
  OnRanks(4, [&](int r) {
    int mine = r + 1;
    EXPECT_EQ(api_.ncclAllReduce(&mine, &sums[r], 1, kInt32, kSum, split[r], nullptr),
              nccl::kSuccess);
  });
  EXPECT_EQ(sums, (std::vector<int>{1 + 3, 2 + 4, 1 + 3, 2 + 4}));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(api_.ncclCommDestroy(split[r]), nccl::kSuccess);
}

TEST_F(SimNccl, PreMulSumHostAndDeviceScalars) {
  constexpr int n = 3;
  MakeComms(n);
  std::vector<float> out(n * 2);
  std::vector<int> device_scalar(n);
  std::vector<int> iout(n);
  OnRanks(n, [&](int r) {
    float scalar = static_cast<float>(r + 1);
    int op = -1;
    ASSERT_EQ(api_.ncclRedOpCreatePreMulSum(&op, &scalar, kFloat32, nccl::kScalarHostImmediate,
                                            comms_[r]),
              nccl::kSuccess);
    EXPECT_GE(op, 5);
    scalar = 100;  // host-immediate: read at creation
    float x[2] = {1.0f, 0.5f};
    EXPECT_EQ(api_.ncclAllReduce(x, &out[r * 2], 2, kFloat32, op, comms_[r], nullptr),
              nccl::kSuccess);
    // A float op does not reduce int32.
    EXPECT_EQ(api_.ncclAllReduce(x, x, 1, kInt32, op, comms_[r], nullptr), nccl::kInvalidArgument);
    EXPECT_EQ(api_.ncclRedOpDestroy(op, comms_[r]), nccl::kSuccess);
    EXPECT_EQ(api_.ncclRedOpDestroy(op, comms_[r]), nccl::kInvalidArgument);
    // Device residence: the scalar is read at the collective.
    int iop = -1;
    ASSERT_EQ(api_.ncclRedOpCreatePreMulSum(&iop, &device_scalar[r], kInt32, nccl::kScalarDevice,
                                            comms_[r]),
              nccl::kSuccess);
    device_scalar[r] = 10 * (r + 1);
    int y = 2;
    EXPECT_EQ(api_.ncclAllReduce(&y, &iout[r], 1, kInt32, iop, comms_[r], nullptr), nccl::kSuccess);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(out[r * 2], 6.0f);
    EXPECT_EQ(out[r * 2 + 1], 3.0f);
    EXPECT_EQ(iout[r], 2 * (10 + 20 + 30));
  }
}

TEST_F(SimNccl, ArgumentErrors) {
  MakeComms(1);
  NcclComm c = comms_[0];
  int x[4] = {};
  EXPECT_EQ(api_.ncclAllReduce(x, x, 4, 12, kSum, c, nullptr), nccl::kInvalidArgument);
  EXPECT_STRNE(api_.ncclGetLastError(c), "");
  EXPECT_EQ(api_.ncclAllReduce(x, x, 4, -1, kSum, c, nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(api_.ncclAllReduce(x, x, 4, kInt32, 42, c, nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(api_.ncclAllReduce(x, x, 4, kInt32, kSum, nullptr, nullptr), nccl::kInvalidArgument);
  int not_a_comm = 0;
  EXPECT_EQ(api_.ncclAllReduce(x, x, 4, kInt32, kSum, &not_a_comm, nullptr),
            nccl::kInvalidArgument);
  EXPECT_EQ(api_.ncclAllReduce(nullptr, x, 4, kInt32, kSum, c, nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(api_.ncclAllReduce(x, nullptr, 4, kInt32, kSum, c, nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(api_.ncclAllReduce(x, x, size_t{1} << 40, kInt32, kSum, c, nullptr),
            nccl::kInvalidArgument);
  EXPECT_EQ(api_.ncclAllReduce(x, x, SIZE_MAX, kInt32, kSum, c, nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(api_.ncclBroadcast(x, x, 4, kInt32, 1, c, nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(api_.ncclSend(x, 4, kInt32, 1, c, nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(api_.ncclCommCount(nullptr, x), nccl::kInvalidArgument);
  // Count 0 with null buffers is fine; the communicator still works.
  EXPECT_EQ(api_.ncclAllReduce(nullptr, nullptr, 0, kInt32, kSum, c, nullptr), nccl::kSuccess);
  x[0] = 5;
  EXPECT_EQ(api_.ncclAllReduce(x, x + 1, 1, kInt32, kSum, c, nullptr), nccl::kSuccess);
  EXPECT_EQ(x[1], 5);

  nccl::UniqueId id;
  ASSERT_EQ(api_.ncclGetUniqueId(&id), nccl::kSuccess);
  NcclComm bad = nullptr;
  EXPECT_EQ(api_.ncclCommInitRankConfig(&bad, 2, id, 2, nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(api_.ncclCommInitRankConfig(&bad, 2, id, -1, nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(api_.ncclCommInitRankConfig(&bad, 0, id, 0, nullptr), nccl::kInvalidArgument);
  nccl::UniqueId zero{};
  EXPECT_EQ(api_.ncclCommInitRankConfig(&bad, 1, zero, 0, nullptr), nccl::kInvalidArgument);
  // The right port with the wrong nonce: the hub refuses it.
  nccl::UniqueId forged = id;
  forged.internal[8] ^= 1;
  EXPECT_EQ(api_.ncclCommInitRankConfig(&bad, 1, forged, 0, nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(bad, nullptr);
  EXPECT_EQ(api_.ncclCommDestroy(nullptr), nccl::kSuccess);
  EXPECT_EQ(api_.ncclCommDestroy(&not_a_comm), nccl::kInvalidArgument);
}

// Garbage to the hub (a huge length, a truncated join, an unknown message)
// closes that connection only: the id still works.
TEST_F(SimNccl, HubSurvivesMalformedMessages) {
  nccl::UniqueId id;
  ASSERT_EQ(api_.ncclGetUniqueId(&id), nccl::kSuccess);
  uint32_t port = 0;
  std::memcpy(&port, id.internal + 4, sizeof port);
  auto blast = [port](const std::vector<uint8_t>& bytes) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
    char c;
    EXPECT_LE(recv(fd, &c, 1, 0), 0);  // the hub closes it
    close(fd);
  };
  blast({0xff, 0xff, 0xff, 0xff, 1, 2, 3});
  blast({3, 0, 0, 0, 1, 0, 0});
  blast({9, 0, 0, 0, 77, 1, 0, 0, 0, 0, 0, 0, 0});
  blast({9, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0});  // a collective before any join
  comms_.assign(1, nullptr);
  ASSERT_EQ(api_.ncclCommInitRankConfig(&comms_[0], 1, id, 0, nullptr), nccl::kSuccess);
  int x = 7, y = 0;
  EXPECT_EQ(api_.ncclAllReduce(&x, &y, 1, kInt32, kSum, comms_[0], nullptr), nccl::kSuccess);
  EXPECT_EQ(y, 7);
}

TEST_F(SimNccl, DuplicateRankAndInitTimeout) {
  ASSERT_EQ(setenv("FLYT_SIM_NCCL_TIMEOUT_MS", "300", 1), 0);
  nccl::UniqueId id;
  ASSERT_EQ(api_.ncclGetUniqueId(&id), nccl::kSuccess);
  std::vector<int> rcs(2, -1);
  std::vector<NcclComm> c(2, nullptr);
  auto start = std::chrono::steady_clock::now();
  OnRanks(2, [&](int r) { rcs[r] = api_.ncclCommInitRankConfig(&c[r], 2, id, 0, nullptr); });
  ASSERT_EQ(unsetenv("FLYT_SIM_NCCL_TIMEOUT_MS"), 0);
  EXPECT_EQ((std::multiset<int>{rcs[0], rcs[1]}),
            (std::multiset<int>{nccl::kInvalidUsage, nccl::kSystemError}));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(SimNccl, MismatchedCollectivesFailOnEveryRank) {
  MakeComms(2);
  std::vector<int> rcs(2, -1);
  int x[8] = {}, y[8] = {};
  OnRanks(2, [&](int r) {
    rcs[r] = api_.ncclAllReduce(x, y, r == 0 ? 4 : 5, kInt32, kSum, comms_[r], nullptr);
  });
  EXPECT_EQ(rcs[0], nccl::kInvalidUsage);
  EXPECT_EQ(rcs[1], nccl::kInvalidUsage);
  OnRanks(2, [&](int r) {
    rcs[r] = r == 0 ? api_.ncclAllReduce(x, y, 4, kInt32, kSum, comms_[r], nullptr)
                    : api_.ncclAllGather(x, y, 4, kInt32, comms_[r], nullptr);
  });
  EXPECT_EQ(rcs[0], nccl::kInvalidUsage);
  EXPECT_EQ(rcs[1], nccl::kInvalidUsage);
}

// A rank aborted while its peer waits in a collective: the peer fails.
TEST_F(SimNccl, AbortedPeerFailsPendingCollective) {
  MakeComms(2);
  int x = 1, y = 0;
  int rc = -1;
  std::thread waiter([&] { rc = api_.ncclAllReduce(&x, &y, 1, kInt32, kSum, comms_[0], nullptr); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(api_.ncclCommAbort(comms_[1]), nccl::kSuccess);
  waiter.join();
  EXPECT_EQ(rc, nccl::kRemoteError);
  int err = 0;
  EXPECT_EQ(api_.ncclCommGetAsyncError(comms_[0], &err), nccl::kSuccess);
  EXPECT_EQ(err, nccl::kRemoteError);
  EXPECT_EQ(api_.ncclAllReduce(&x, &y, 1, kInt32, kSum, comms_[0], nullptr), nccl::kRemoteError);
  comms_.pop_back();
}

// Two processes: rank 1 in a forked child that all-reduces, broadcasts, then
// exits while rank 0 is in a collective it never joins.
TEST_F(SimNccl, RanksInTwoProcessesAndAPeerThatExits) {
  nccl::UniqueId id;
  ASSERT_EQ(api_.ncclGetUniqueId(&id), nccl::kSuccess);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    NcclApi api;
    LoadSimNccl(&api);
    NcclComm c = nullptr;
    if (api.ncclCommInitRankConfig(&c, 2, id, 1, nullptr) != nccl::kSuccess) _exit(2);
    std::vector<float> v(777, 2.0f), out(777);
    if (api.ncclAllReduce(v.data(), out.data(), v.size(), kFloat32, kSum, c, nullptr) !=
        nccl::kSuccess)
      _exit(3);
    for (float f : out)
      if (f != 3.0f) _exit(4);
    int b = 0;
    if (api.ncclBroadcast(&b, &b, 1, kInt32, 0, c, nullptr) != nccl::kSuccess || b != 42) _exit(5);
    _exit(0);  // without a word, while rank 0 all-reduces again
  }
  NcclComm c = nullptr;
  ASSERT_EQ(api_.ncclCommInitRankConfig(&c, 2, id, 0, nullptr), nccl::kSuccess);
  std::vector<float> v(777, 1.0f), out(777);
  EXPECT_EQ(api_.ncclAllReduce(v.data(), out.data(), v.size(), kFloat32, kSum, c, nullptr),
            nccl::kSuccess);
  EXPECT_EQ(out, std::vector<float>(777, 3.0f));
  int b = 42;
  EXPECT_EQ(api_.ncclBroadcast(&b, &b, 1, kInt32, 0, c, nullptr), nccl::kSuccess);
  EXPECT_EQ(api_.ncclAllReduce(v.data(), out.data(), v.size(), kFloat32, kSum, c, nullptr),
            nccl::kRemoteError);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(api_.ncclCommDestroy(c), nccl::kSuccess);
}

TEST_F(SimNccl, InitAll) {
  comms_.assign(3, nullptr);
  const int devices[3] = {2, 0, 1};
  ASSERT_EQ(api_.ncclCommInitAll(comms_.data(), 3, devices), nccl::kSuccess);
  for (int r = 0; r < 3; ++r) {
    int rank = -1, dev = -1;
    EXPECT_EQ(api_.ncclCommUserRank(comms_[r], &rank), nccl::kSuccess);
    EXPECT_EQ(api_.ncclCommCuDevice(comms_[r], &dev), nccl::kSuccess);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(dev, devices[r]);
  }
  std::vector<int64_t> x{1, 2, 3}, out(9);
  ASSERT_EQ(api_.ncclGroupStart(), nccl::kSuccess);
  for (int r = 0; r < 3; ++r)
    ASSERT_EQ(api_.ncclAllReduce(&x[r], &out[r * 3], 1, 4, kProd, comms_[r], nullptr),
              nccl::kSuccess);
  ASSERT_EQ(api_.ncclGroupEnd(), nccl::kSuccess);
  EXPECT_EQ(out[0], 6);
  EXPECT_EQ(out[3], 6);
  EXPECT_EQ(out[6], 6);
  std::vector<NcclComm> defaults(2, nullptr);
  ASSERT_EQ(api_.ncclCommInitAll(defaults.data(), 2, nullptr), nccl::kSuccess);
  int dev = -1;
  EXPECT_EQ(api_.ncclCommCuDevice(defaults[1], &dev), nccl::kSuccess);
  EXPECT_EQ(dev, 1);
  for (NcclComm c : defaults) EXPECT_EQ(api_.ncclCommDestroy(c), nccl::kSuccess);
  EXPECT_EQ(api_.ncclCommInitAll(defaults.data(), 0, nullptr), nccl::kInvalidArgument);
}

}  // namespace
}  // namespace flyt::server
