// ucx:// one-sided access (transport/ucx_rma.h): a client exposes buffers, the worker's
// side of the connection reads and writes them at odd offsets and sizes, with and without
// a registration of its own local buffer; keys are checked before UCX parses them (fixed
// hostile cases, random bytes, every single-byte change of a real key); unknown and
// dropped keys fail cleanly; a client process killed while the server reads from it is
// noticed in time and leaves the server's side usable for nothing but an error.
// ctest runs it with UCX_TLS=tcp and sm,self. `ucx_rma_test --rma-peer URL` is the client
// process of the last case.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "transport/transport.h"
#include "transport/ucx_rma.h"
#include "transport/ucx_transport.h"
#include "ucx_pair.h"

namespace flyt::transport {
namespace {

using namespace std::chrono_literals;

// One length-prefixed blob over a connection (as Flyt's frames carry addresses and keys).
Status SendBlob(Connection* c, const std::vector<uint8_t>& b) {
  uint32_t n = static_cast<uint32_t>(b.size());
  iovec iov[2] = {{&n, sizeof(n)}, {const_cast<uint8_t*>(b.data()), b.size()}};
  return c->Send(iov, 2);
}
Status ReceiveBlob(Connection* c, std::vector<uint8_t>* b) {
  uint32_t n = 0;
  Status st = c->Receive(&n, sizeof(n));
  if (!st.ok()) return st;
  if (n > (1u << 20)) return Status::Error("blob too large");
  b->resize(n);
  return c->Receive(b->data(), n);
}

// The worker's side connects to the client's memory through the address the client sent.
void ConnectMemory(Pair* p) {
  RemoteMemory* c = p->client->Rma();
  ASSERT_NE(c, nullptr);
  std::vector<uint8_t> addr, got;
  Status st = c->LocalAddress(&addr);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE(SendBlob(p->client.get(), addr).ok());
  ASSERT_TRUE(ReceiveBlob(p->worker.get(), &got).ok());
  ASSERT_EQ(got, addr);
  RemoteMemory* s = p->worker->Rma();
  ASSERT_NE(s, nullptr);
  st = s->Connect(got.data(), got.size());
  ASSERT_TRUE(st.ok()) << st.message();
}

// Exposes [base, base+len) on the client, imports its key on the worker's side.
uint64_t ExposeAndImport(Pair* p, void* base, size_t len, std::vector<uint8_t>* key = nullptr) {
  std::vector<uint8_t> k;
  uint64_t handle = 0, id = 0;
  Status st = p->client->Rma()->Expose(base, len, &k, &handle);
  EXPECT_TRUE(st.ok()) << st.message();
  st = p->worker->Rma()->ImportKey(k.data(), k.size(), &id);
  EXPECT_TRUE(st.ok()) << st.message();
  if (key != nullptr) *key = k;
  return id;
}

uint64_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(UcxRma, ReadsAndWritesExposedMemoryAtAnyOffset) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair(&p));
  ASSERT_NO_FATAL_FAILURE(ConnectMemory(&p));
  const size_t n = (size_t{3} << 20) + 17;
  std::vector<uint8_t> client = Pattern(n, 1);
  const uint64_t id = ExposeAndImport(&p, client.data(), n);
  RemoteMemory* s = p.worker->Rma();
  // The worker's buffers: one registered once, one not.
  std::vector<uint8_t> reg(n + 64), plain(n + 64);
  uint64_t local = 0;
  Status st = s->RegisterLocal(reg.data(), reg.size(), false, &local);
  ASSERT_TRUE(st.ok()) << st.message();

  st = s->Read(reg.data(), n, Addr(client.data()), id, false);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(0, std::memcmp(reg.data(), client.data(), n));
  EXPECT_TRUE(s->Read(reg.data(), 0, Addr(client.data()), id, false).ok());

  std::mt19937 rng(5);
  for (int i = 0; i < 60; ++i) {
    const size_t off = i == 0 ? n - 1 : rng() % n;
    const size_t len = i == 0 ? 1 : 1 + rng() % (n - off);
    const size_t at = rng() % 64;
    std::vector<uint8_t>& buf = (i % 2 == 0) ? reg : plain;
    std::fill(buf.begin(), buf.end(), 0xee);
    st = s->Read(buf.data() + at, len, Addr(client.data() + off), id, false);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(0, std::memcmp(buf.data() + at, client.data() + off, len)) << off << "+" << len;
    // And back, with other bytes.
    auto fresh = Pattern(len, 100 + i);
    std::memcpy(buf.data() + at, fresh.data(), len);
    st = s->Write(buf.data() + at, len, Addr(client.data() + off), id, false);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(0, std::memcmp(client.data() + off, fresh.data(), len)) << off << "+" << len;
  }
  s->UnregisterLocal(local);
  // What carries them, as the server's log says it.
  const std::string d = s->Describe();
  EXPECT_NE(d.find(" over "), std::string::npos) << d;
  // The tagged byte stream still works beside it (a send completes once the peer takes
  // part: the receive runs meanwhile).
  std::vector<uint8_t> got(1000);
  auto receiver =
      std::async(std::launch::async, [&] { return p.worker->Receive(got.data(), got.size()); });
  ASSERT_TRUE(SendBytes(p.client.get(), Pattern(1000, 3)).ok());
  ASSERT_TRUE(receiver.get().ok());
  EXPECT_EQ(got, Pattern(1000, 3));
}

// Not run by ctest: the transport's read and write rate of 8 MiB pieces into registered
// local memory (ucx_rma_test --gtest_also_run_disabled_tests --gtest_filter=*Throughput).
TEST(UcxRma, DISABLED_Throughput) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair(&p));
  ASSERT_NO_FATAL_FAILURE(ConnectMemory(&p));
  const size_t n = size_t{64} << 20;
  std::vector<uint8_t> client(n, 1), local(size_t{8} << 20);
  const uint64_t id = ExposeAndImport(&p, client.data(), n);
  RemoteMemory* s = p.worker->Rma();
  uint64_t h = 0;
  ASSERT_TRUE(s->RegisterLocal(local.data(), local.size(), false, &h).ok());
  for (int w = 0; w < 2; ++w) {
    for (int r = 0; r < 3; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (size_t off = 0; off < n; off += local.size()) {
        Status st =
            w == 0 ? s->Read(local.data(), local.size(), Addr(client.data() + off), id, false)
                   : s->Write(local.data(), local.size(), Addr(client.data() + off), id, false);
        ASSERT_TRUE(st.ok()) << st.message();
      }
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("RESULT rma_%s_gbps %.3g GB/s\n", w == 0 ? "read" : "write", n / sec / 1e9);
    }
  }
}

TEST(UcxRma, ReportsWhetherUcxReachesGpuMemory) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair(&p));
  RemoteMemory* s = p.worker->Rma();
  ASSERT_NE(s, nullptr);
  const std::string d = s->Describe();
  EXPECT_NE(d.find("UCX "), std::string::npos) << d;
  // Debian's and Ubuntu's UCX have no CUDA modules: said plainly.
  if (!s->DeviceMemory()) {
    EXPECT_NE(d.find("no CUDA support"), std::string::npos) << d;
  }
}

TEST(UcxRma, UnknownAndDroppedKeysFail) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair(&p));
  RemoteMemory* s = p.worker->Rma();
  std::vector<uint8_t> client(4096), local(4096);
  std::vector<uint8_t> key;
  uint64_t handle = 0, id = 0;
  ASSERT_TRUE(p.client->Rma()->Expose(client.data(), client.size(), &key, &handle).ok());
  // Before the client's address: refused.
  Status st = s->ImportKey(key.data(), key.size(), &id);
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(s->Read(local.data(), 8, Addr(client.data()), 1, false).ok());
  ASSERT_NO_FATAL_FAILURE(ConnectMemory(&p));
  std::vector<uint8_t> addr;
  ASSERT_TRUE(p.client->Rma()->LocalAddress(&addr).ok());
  EXPECT_FALSE(s->Connect(addr.data(), addr.size()).ok()) << "a second Connect";
  st = s->ImportKey(key.data(), key.size(), &id);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_FALSE(s->Read(local.data(), 8, Addr(client.data()), id + 1, false).ok());
  EXPECT_TRUE(s->Read(local.data(), 8, Addr(client.data()), id, false).ok());
  s->DropKey(id);
  s->DropKey(id);  // twice: nothing
  st = s->Read(local.data(), 8, Addr(client.data()), id, false);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no key"), std::string::npos) << st.message();
  // The client side neither reads nor connects; the server side exposes nothing.
  EXPECT_FALSE(p.client->Rma()->Read(local.data(), 8, Addr(client.data()), id, false).ok());
  EXPECT_FALSE(s->Expose(local.data(), 8, &key, &handle).ok());
  p.client->Rma()->Withdraw(handle);
  p.client->Rma()->Withdraw(handle);  // twice: nothing
}

TEST(UcxRma, HostileKeysAreRefusedBeforeUcxParsesThem) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair(&p));
  ASSERT_NO_FATAL_FAILURE(ConnectMemory(&p));
  std::vector<uint8_t> client(1 << 16);
  std::vector<uint8_t> real;
  ExposeAndImport(&p, client.data(), client.size(), &real);
  ASSERT_TRUE(ValidatePackedRkey(real.data(), real.size()).ok());
  RemoteMemory* s = p.worker->Rma();
  auto refused = [&](std::vector<uint8_t> k, const char* what) {
    uint64_t id = 0;
    Status st = s->ImportKey(k.data(), k.size(), &id);
    EXPECT_FALSE(st.ok()) << what;
    EXPECT_NE(st.message().find("ucx rma"), std::string::npos) << st.message();
  };
  refused({}, "empty");
  refused(std::vector<uint8_t>(8, 0xff), "shorter than its header");
  refused(std::vector<uint8_t>(kMaxPackedRkey + 1, 0), "too large");
  std::vector<uint8_t> k(9, 0);
  refused(k, "no memory domain");
  k = real;
  k[8] = UCS_MEMORY_TYPE_CUDA;
  refused(k, "GPU memory");
  k = real;
  k.push_back(0);
  refused(k, "a stray byte");
  k = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 200, 1, 2, 3};
  refused(k, "domain lengths past the end");
  EXPECT_FALSE(ValidatePackedRkey(nullptr, 20).ok());
  // Random bytes: the check decides, nothing crashes.
  std::mt19937 rng(17);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> r = Pattern(rng() % 64, static_cast<uint32_t>(i));
    if (ValidatePackedRkey(r.data(), r.size()).ok()) ++accepted;
  }
  EXPECT_LT(accepted, 200);
  // Every one-byte change of a real key: refused, or a key UCX takes or refuses; reading
  // through any key taken stays inside this process either way.
  std::vector<uint8_t> local(64);
  for (size_t i = 0; i < real.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      k = real;
      k[i] ^= static_cast<uint8_t>(1u << bit);
      uint64_t id = 0;
      if (!s->ImportKey(k.data(), k.size(), &id).ok()) continue;
      (void)s->Read(local.data(), local.size(), Addr(client.data()), id, false);
      s->DropKey(id);
      if (!s->Read(local.data(), 1, Addr(client.data()), id, false).ok() &&
          !s->Write(local.data(), 1, Addr(client.data()), id, false).ok()) {
        continue;
      }
    }
  }
}

// --- a client process killed while the server reads from it

int RunPeer(const std::string& url) {
  Address a;
  if (!ParseAddress(url, &a).ok()) return 2;
  std::unique_ptr<Connection> c;
  if (!Dial(a, Liveness{}, &c).ok()) return 3;
  c->SetReceiveTimeout(20000);
  if (!SendBytes(c.get(), Pattern(100, 1)).ok()) return 4;
  std::vector<uint8_t> got(100);
  if (!c->Receive(got.data(), got.size()).ok()) return 5;  // the switch happens meanwhile
  static std::vector<uint8_t> big(size_t{64} << 20, 0x5a);
  std::vector<uint8_t> addr, key;
  uint64_t handle = 0;
  RemoteMemory* r = c->Rma();
  if (r == nullptr || !r->LocalAddress(&addr).ok() ||
      !r->Expose(big.data(), big.size(), &key, &handle).ok())
    return 6;
  uint64_t where = Addr(big.data());
  std::vector<uint8_t> at(sizeof(where));
  std::memcpy(at.data(), &where, sizeof(where));
  if (!SendBlob(c.get(), addr).ok() || !SendBlob(c.get(), key).ok() || !SendBlob(c.get(), at).ok())
    return 7;
  for (;;) pause();  // killed by the test
}

TEST(UcxRma, ClientKilledDuringTransfersIsNoticed) {
  std::string url;
  auto listener = ListenLoopback(&url);
  char exe[4096];
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(len, 0);
  exe[len] = '\0';
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::execl(exe, exe, "--rma-peer", url.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  struct Reap {
    pid_t pid;
    ~Reap() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{child};
  std::unique_ptr<Connection> main, worker;
  Status st = listener->Accept(&main);
  ASSERT_TRUE(st.ok()) << st.message();
  main->SetReceiveTimeout(20000);
  std::vector<uint8_t> got(100);
  ASSERT_TRUE(main->Receive(got.data(), got.size()).ok());
  ASSERT_TRUE(SendBytes(main.get(), Pattern(100, 2)).ok());
  DetachedConnection d;
  ASSERT_TRUE(main->Detach(&d).ok());
  main.reset();
  st = Reattach(std::move(d), &worker);
  ASSERT_TRUE(st.ok()) << st.message();
  worker->SetReceiveTimeout(20000);
  std::vector<uint8_t> addr, key, at;
  ASSERT_TRUE(ReceiveBlob(worker.get(), &addr).ok());
  ASSERT_TRUE(ReceiveBlob(worker.get(), &key).ok());
  ASSERT_TRUE(ReceiveBlob(worker.get(), &at).ok());
  uint64_t remote = 0;
  ASSERT_EQ(at.size(), sizeof(remote));
  std::memcpy(&remote, at.data(), sizeof(remote));
  RemoteMemory* s = worker->Rma();
  ASSERT_TRUE(s->Connect(addr.data(), addr.size()).ok());
  uint64_t id = 0;
  st = s->ImportKey(key.data(), key.size(), &id);
  ASSERT_TRUE(st.ok()) << st.message();
  std::vector<uint8_t> local(size_t{8} << 20);
  st = s->Read(local.data(), local.size(), remote, id, false);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(local[12345], 0x5a);
  // Reads in a loop; the client dies in the middle of them.
  std::atomic<bool> killed{false};
  auto reader = std::async(std::launch::async, [&] {
    for (int i = 0;; ++i) {
      Status r = s->Read(local.data(), local.size(), remote + (i % 8) * local.size(), id, false);
      if (!r.ok()) return std::make_pair(r, killed.load());
    }
  });
  std::this_thread::sleep_for(200ms);
  const auto t0 = std::chrono::steady_clock::now();
  killed.store(true);
  ::kill(child, SIGKILL);
  ASSERT_EQ(reader.wait_for(15s), std::future_status::ready) << "a read never ended";
  auto [why, after_kill] = reader.get();
  EXPECT_TRUE(after_kill) << why.message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 12s);
  // Every later call fails at once; the connection says the client is gone.
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_FALSE(s->Read(local.data(), 8, remote, id, false).ok());
  EXPECT_FALSE(s->Write(local.data(), 8, remote, id, false).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t1, 1s);
  uint8_t b;
  EXPECT_FALSE(worker->Receive(&b, 1).ok());
  worker.reset();  // and goes without hanging
}

}  // namespace

int RunPeerMain(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--rma-peer") return RunPeer(argv[2]);
  return -1;
}

}  // namespace flyt::transport

int main(int argc, char** argv) {
  const int peer = flyt::transport::RunPeerMain(argc, argv);
  if (peer >= 0) return peer;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
