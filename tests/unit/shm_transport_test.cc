// Tests for the shm:// transport: addresses, round trips of every size (larger
// than the ring too), Receive split at odd sizes, many messages, a peer killed
// with SIGKILL (the other side fails promptly, nothing is left in /dev/shm),
// hostile handshakes and ring headers (only that connection fails).
// No timing assertions: CI has two noisy cores.
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transport/shm_ring.h"
#include "transport/shm_transport.h"
#include "transport/transport.h"

namespace flyt::transport {
namespace {

constexpr size_t kRing = 64 << 10;  // FLYT_SHM_RING_BYTES for these tests

std::string TempPath(const char* tag) {
  return "/tmp/flyt-shm-test-" + std::to_string(getpid()) + "-" + tag + ".sock";
}

std::set<std::string> DevShm() {
  std::set<std::string> names;
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) names.insert(e->d_name);
  closedir(d);
  return names;
}

// Entries of /dev/shm that appeared since `before` and belong to these
// processes (POSIX segments are named /flyt-<pid>-...). Other tests running at
// the same time create and remove their own, so only ours count.
std::set<std::string> LeftBy(const std::set<std::string>& before,
                             std::initializer_list<pid_t> pids) {
  std::set<std::string> left;
  for (const auto& name : DevShm()) {
    if (before.count(name)) continue;
    for (pid_t pid : pids) {
      if (name.rfind("flyt-" + std::to_string(pid) + "-", 0) == 0) left.insert(name);
    }
  }
  return left;
}

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1103515245u + 12345u;
    b = static_cast<uint8_t>(x >> 16);
  }
  return v;
}

Status SendAll(Connection* c, const std::vector<uint8_t>& v) {
  iovec iov{const_cast<uint8_t*>(v.data()), v.size()};
  return c->Send(&iov, 1);
}

// A listener and one connected pair (server side, client side).
struct Pair {
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> server, client;
};

void MakePair(const std::string& path, Pair* p) {
  Address a;
  ASSERT_TRUE(ParseAddress("shm://" + path, &a).ok());
  Status st = Listen(a, &p->listener);
  ASSERT_TRUE(st.ok()) << st.message();
  std::thread acceptor([&] {
    Status s = p->listener->Accept(&p->server);
    EXPECT_TRUE(s.ok()) << s.message();
  });
  st = Dial(a, Liveness{}, &p->client);
  acceptor.join();
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_NE(p->server, nullptr);
}

class ShmTransportTest : public ::testing::Test {
 protected:
  void SetUp() override { setenv("FLYT_SHM_RING_BYTES", std::to_string(kRing).c_str(), 1); }
};

TEST(ShmAddressTest, ParsesAndRoundTrips) {
  Address a;
  ASSERT_TRUE(ParseAddress("shm:///tmp/x.sock", &a).ok());
  EXPECT_EQ(a.kind, Address::Kind::kShm);
  EXPECT_EQ(a.path, "/tmp/x.sock");
  EXPECT_EQ(a.ToString(), "shm:///tmp/x.sock");
  Address b;
  ASSERT_TRUE(ParseAddress(a.ToString(), &b).ok());
  EXPECT_EQ(b.kind, Address::Kind::kShm);
  EXPECT_EQ(b.path, a.path);
  ASSERT_TRUE(ParseAddress("shm:rel.sock", &a).ok());
  EXPECT_EQ(a.path, "rel.sock");
  EXPECT_FALSE(ParseAddress("shm://", &a).ok());
  EXPECT_FALSE(ParseAddress("shm:///" + std::string(200, 'x'), &a).ok());
}

TEST(ShmAddressTest, RingBytesFromEnv) {
  setenv("FLYT_SHM_RING_BYTES", "100000", 1);
  EXPECT_EQ(ShmRingBytesFromEnv(), 131072u);
  setenv("FLYT_SHM_RING_BYTES", "1", 1);
  EXPECT_EQ(ShmRingBytesFromEnv(), 65536u);
  setenv("FLYT_SHM_RING_BYTES", "junk", 1);
  EXPECT_EQ(ShmRingBytesFromEnv(), size_t{8} << 20);
  unsetenv("FLYT_SHM_RING_BYTES");
  EXPECT_EQ(ShmRingBytesFromEnv(), size_t{8} << 20);
}

TEST_F(ShmTransportTest, RoundTripsOfManySizes) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair(TempPath("sizes"), &p));
  const size_t sizes[] = {1, 7, 8, 100, 4096, kRing - 8, kRing, kRing + 1, 3 * kRing + 17, 5 << 20};
  uint32_t seed = 1;
  for (size_t n : sizes) {
    auto msg = Pattern(n, seed++);
    // Client -> server -> client (the server echoes), in parallel so large
    // messages stream through the small ring.
    std::thread echo([&] {
      std::vector<uint8_t> got(n);
      Status s = p.server->Receive(got.data(), n);
      ASSERT_TRUE(s.ok()) << s.message();
      s = SendAll(p.server.get(), got);
      ASSERT_TRUE(s.ok()) << s.message();
    });
    Status st = SendAll(p.client.get(), msg);
    ASSERT_TRUE(st.ok()) << st.message();
    std::vector<uint8_t> back(n);
    st = p.client->Receive(back.data(), n);
    echo.join();
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(back, msg) << "size " << n;
  }
}

TEST_F(ShmTransportTest, GatheredSendAndOddReceiveSplits) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair(TempPath("split"), &p));
  // Messages of assorted sizes, some gathered from several iovecs; the reader
  // takes the stream in chunks that ignore message boundaries.
  std::vector<uint8_t> stream;
  std::thread writer([&] {
    for (uint32_t i = 0; i < 200; ++i) {
      auto a = Pattern(i * 37 % 5000, i);
      auto b = Pattern(i % 3 == 0 ? kRing + i : 24, i + 1000);
      iovec iov[3] = {{a.data(), a.size()}, {nullptr, 0}, {b.data(), b.size()}};
      Status s = p.client->Send(iov, 3);
      ASSERT_TRUE(s.ok()) << s.message();
    }
  });
  for (uint32_t i = 0; i < 200; ++i) {
    auto a = Pattern(i * 37 % 5000, i);
    auto b = Pattern(i % 3 == 0 ? kRing + i : 24, i + 1000);
    stream.insert(stream.end(), a.begin(), a.end());
    stream.insert(stream.end(), b.begin(), b.end());
  }
  std::vector<uint8_t> got(stream.size());
  const size_t splits[] = {1, 3, 8, 13, 4099, 65537, 2, 100000};
  size_t off = 0;
  for (size_t k = 0; off < got.size(); ++k) {
    size_t n = std::min(splits[k % 8], got.size() - off);
    Status s = p.server->Receive(got.data() + off, n);
    ASSERT_TRUE(s.ok()) << s.message() << " at " << off;
    off += n;
  }
  writer.join();
  EXPECT_EQ(got, stream);
}

TEST_F(ShmTransportTest, ManySmallMessagesBothWays) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair(TempPath("many"), &p));
  constexpr int kCount = 20000;
  std::thread server([&] {
    for (int i = 0; i < kCount; ++i) {
      uint32_t v = 0;
      Status s = p.server->Receive(&v, sizeof(v));
      ASSERT_TRUE(s.ok()) << s.message();
      v += 1;
      iovec iov{&v, sizeof(v)};
      s = p.server->Send(&iov, 1);
      ASSERT_TRUE(s.ok()) << s.message();
    }
  });
  for (int i = 0; i < kCount; ++i) {
    uint32_t v = static_cast<uint32_t>(i) * 2;
    iovec iov{&v, sizeof(v)};
    Status s = p.client->Send(&iov, 1);
    ASSERT_TRUE(s.ok()) << s.message();
    s = p.client->Receive(&v, sizeof(v));
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(v, static_cast<uint32_t>(i) * 2 + 1);
  }
  server.join();
}

TEST_F(ShmTransportTest, ShutdownWakesABlockedReceiveAndThePeer) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair(TempPath("shutdown"), &p));
  std::thread t([&] {
    uint8_t b;
    Status s = p.client->Receive(&b, 1);
    EXPECT_FALSE(s.ok());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  p.client->Shutdown();
  t.join();
  uint8_t b;
  Status s = p.server->Receive(&b, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("went away"), std::string::npos) << s.message();
}

TEST_F(ShmTransportTest, ReceiveTimeout) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair(TempPath("timeout"), &p));
  p.client->SetReceiveTimeout(100);
  uint8_t b;
  Status s = p.client->Receive(&b, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("timed out"), std::string::npos) << s.message();
  // Nothing moved, so the connection still works.
  iovec iov{&b, 1};
  b = 42;
  ASSERT_TRUE(p.server->Send(&iov, 1).ok());
  b = 0;
  ASSERT_TRUE(p.client->Receive(&b, 1).ok());
  EXPECT_EQ(b, 42);
}

// The peer process is killed with SIGKILL while this side waits.
TEST_F(ShmTransportTest, ClientKilledServerFailsAndNothingLeaks) {
  const auto before = DevShm();
  const std::string path = TempPath("killc");
  Address a;
  ASSERT_TRUE(ParseAddress("shm://" + path, &a).ok());
  std::unique_ptr<Listener> listener;
  ASSERT_TRUE(Listen(a, &listener).ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::unique_ptr<Connection> c;
    if (!Dial(a, Liveness{}, &c).ok()) _exit(2);
    uint32_t v = 7;
    iovec iov{&v, sizeof(v)};
    if (!c->Send(&iov, 1).ok()) _exit(3);
    for (;;) pause();
  }
  std::unique_ptr<Connection> server;
  Status st = listener->Accept(&server);
  ASSERT_TRUE(st.ok()) << st.message();
  uint32_t v = 0;
  st = server->Receive(&v, sizeof(v));
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(v, 7u);
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    kill(child, SIGKILL);
  });
  st = server->Receive(&v, sizeof(v));  // blocks until the child dies
  killer.join();
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("went away"), std::string::npos) << st.message();
  // Sending fails too (more than the ring holds, so it would block otherwise).
  std::vector<uint8_t> big(4 * kRing);
  iovec big_iov{big.data(), big.size()};
  EXPECT_FALSE(server->Send(&big_iov, 1).ok());
  server.reset();
  listener.reset();
  EXPECT_TRUE(LeftBy(before, {getpid(), child}).empty());
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "socket file left behind";
}

TEST_F(ShmTransportTest, ServerKilledClientFailsPromptly) {
  const auto before = DevShm();
  const std::string path = TempPath("kills");
  Address a;
  ASSERT_TRUE(ParseAddress("shm://" + path, &a).ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::unique_ptr<Listener> l;
    if (!Listen(a, &l).ok()) _exit(2);
    std::unique_ptr<Connection> c;
    if (!l->Accept(&c).ok()) _exit(3);
    for (;;) pause();
  }
  Liveness live;
  live.refused_retry_ms = 20000;  // the child may take a while to listen
  std::unique_ptr<Connection> client;
  Status st = Dial(a, live, &client);
  ASSERT_TRUE(st.ok()) << st.message();
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    kill(child, SIGKILL);
  });
  // Larger than the ring: the send blocks on a full ring until the peer dies.
  std::vector<uint8_t> big(4 * kRing);
  iovec iov{big.data(), big.size()};
  Status send_st = client->Send(&iov, 1);
  uint8_t b;
  st = client->Receive(&b, 1);
  killer.join();
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_FALSE(send_st.ok());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("flyt-server at shm://" + path + " went away"), std::string::npos)
      << st.message();
  client.reset();
  unlink(path.c_str());  // the killed server could not remove its socket
  EXPECT_TRUE(LeftBy(before, {getpid(), child}).empty());
}

// A raw "client": connects, takes the memfd and maps it.
struct RawClient {
  int sock = -1;
  ShmHandshake h;
  uint8_t* base = nullptr;
  ~RawClient() {
    if (base != nullptr) munmap(base, h.segment_bytes);
    if (sock >= 0) close(sock);
  }
};

void ConnectRaw(const std::string& path, RawClient* rc) {
  rc->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(rc->sock, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof(sa.sun_path) - 1);
  ASSERT_EQ(connect(rc->sock, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
}

// Takes the handshake and memfd the server sent on Accept, and maps it.
void TakeFd(RawClient* rc) {
  iovec iov{&rc->h, sizeof(rc->h)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ASSERT_EQ(recvmsg(rc->sock, &msg, MSG_CMSG_CLOEXEC), static_cast<ssize_t>(sizeof(rc->h)));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  ASSERT_NE(c, nullptr);
  int fd;
  std::memcpy(&fd, CMSG_DATA(c), sizeof(fd));
  void* p = mmap(nullptr, rc->h.segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  rc->base = static_cast<uint8_t*>(p);
  // The segment is sealed: a hostile client cannot shrink it under the server.
  // (Checked through the kernel, not here: ftruncate on the fd would fail.)
}

TEST_F(ShmTransportTest, HostileClientFailsOnlyItsOwnConnection) {
  const std::string path = TempPath("hostile");
  Address a;
  ASSERT_TRUE(ParseAddress("shm://" + path, &a).ok());
  std::unique_ptr<Listener> listener;
  ASSERT_TRUE(Listen(a, &listener).ok());

  // 1. A client that corrupts the ring header after the handshake.
  RawClient evil;
  ASSERT_NO_FATAL_FAILURE(ConnectRaw(path, &evil));
  std::unique_ptr<Connection> evil_conn;
  ASSERT_TRUE(listener->Accept(&evil_conn).ok());
  ASSERT_NO_FATAL_FAILURE(TakeFd(&evil));
  // c2s ring: claim 2^60 bytes were written.
  uint64_t huge = uint64_t{1} << 60;
  std::memcpy(evil.base + evil.h.c2s_offset + 64, &huge, sizeof(huge));
  uint8_t b;
  Status st = evil_conn->Receive(&b, 1);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("corrupted"), std::string::npos) << st.message();

  // 2. A client that writes garbage on the socket.
  RawClient noisy;
  ASSERT_NO_FATAL_FAILURE(ConnectRaw(path, &noisy));
  std::unique_ptr<Connection> noisy_conn;
  ASSERT_TRUE(listener->Accept(&noisy_conn).ok());
  ASSERT_EQ(write(noisy.sock, "garbage", 7), 7);
  st = noisy_conn->Receive(&b, 1);
  ASSERT_FALSE(st.ok());

  // 3. A client that connects and hangs up before the handshake.
  {
    RawClient quitter;
    ASSERT_NO_FATAL_FAILURE(ConnectRaw(path, &quitter));
  }

  // A good client on the same listener keeps working.
  std::unique_ptr<Connection> good_server, good_client;
  std::thread acceptor([&] {
    for (;;) {
      std::unique_ptr<Connection> c;
      ASSERT_TRUE(listener->Accept(&c).ok());
      uint8_t probe = 0;
      c->SetReceiveTimeout(2000);
      if (c->Receive(&probe, 1).ok() && probe == 0x5a) {
        good_server = std::move(c);
        return;
      }
    }
  });
  st = Dial(a, Liveness{}, &good_client);
  ASSERT_TRUE(st.ok()) << st.message();
  b = 0x5a;
  iovec iov{&b, 1};
  ASSERT_TRUE(good_client->Send(&iov, 1).ok());
  acceptor.join();
  ASSERT_NE(good_server, nullptr);
  auto msg = Pattern(3 * kRing, 9);
  std::thread echo([&] {
    std::vector<uint8_t> got(msg.size());
    ASSERT_TRUE(good_server->Receive(got.data(), got.size()).ok());
    ASSERT_TRUE(SendAll(good_server.get(), got).ok());
  });
  ASSERT_TRUE(SendAll(good_client.get(), msg).ok());
  std::vector<uint8_t> back(msg.size());
  ASSERT_TRUE(good_client->Receive(back.data(), back.size()).ok());
  echo.join();
  EXPECT_EQ(back, msg);
}

// A fake server that sends a hostile handshake: the client fails clearly.
TEST_F(ShmTransportTest, HostileServerHandshakeIsRejected) {
  ShmHandshake good;
  good.segment_bytes = 2 * 8192;
  good.c2s_offset = 0;
  good.c2s_capacity = 4096;
  good.s2c_offset = 8192;
  good.s2c_capacity = 4096;
  EXPECT_TRUE(ValidateShmHandshake(good).ok());
  auto bad = good;
  bad.magic = 1;
  EXPECT_FALSE(ValidateShmHandshake(bad).ok());
  bad = good;
  bad.version = 99;
  EXPECT_FALSE(ValidateShmHandshake(bad).ok());
  bad = good;
  bad.c2s_capacity = 5000;
  EXPECT_FALSE(ValidateShmHandshake(bad).ok());
  bad = good;
  bad.s2c_offset = ~uint64_t{0} - 100;
  EXPECT_FALSE(ValidateShmHandshake(bad).ok());
  bad = good;
  bad.s2c_offset = 64;
  EXPECT_FALSE(ValidateShmHandshake(bad).ok());  // overlaps
  bad = good;
  bad.segment_bytes = ~uint64_t{0};
  EXPECT_FALSE(ValidateShmHandshake(bad).ok());
  bad = good;
  bad.s2c_capacity = uint64_t{1} << 62;
  EXPECT_FALSE(ValidateShmHandshake(bad).ok());

  // Over a socket: a "server" that sends a header with a lying size and no fd.
  const std::string path = TempPath("fakesrv");
  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(lfd, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof(sa.sun_path) - 1);
  unlink(path.c_str());
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(listen(lfd, 4), 0);
  std::thread fake([&] {
    for (int i = 0; i < 2; ++i) {
      int c = accept(lfd, nullptr, nullptr);
      ASSERT_GE(c, 0);
      ShmHandshake h = good;
      if (i == 1) h.c2s_capacity = 3;
      ASSERT_EQ(write(c, &h, sizeof(h)), static_cast<ssize_t>(sizeof(h)));
      char buf[1];
      (void)read(c, buf, 1);  // until the client hangs up
      close(c);
    }
  });
  Address a;
  ASSERT_TRUE(ParseAddress("shm://" + path, &a).ok());
  std::unique_ptr<Connection> c;
  Status st = Dial(a, Liveness{}, &c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no memory descriptor"), std::string::npos) << st.message();
  st = Dial(a, Liveness{}, &c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("capacity"), std::string::npos) << st.message();
  fake.join();
  close(lfd);
  unlink(path.c_str());
}

}  // namespace
}  // namespace flyt::transport
