// Tests for what moves a client from flyt-server's main process to a worker:
// Detach/Reattach of socket and shm connections (bytes already buffered and
// descriptors already shared travel along; the peer notices nothing), the
// worker channel's messages with descriptors (and its refusal of malformed
// ones), and the tenant board shared by two mappings.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "server/tenant_board.h"
#include "server/worker_channel.h"
#include "transport/transport.h"

namespace flyt::server {
namespace {

using transport::Address;
using transport::Connection;
using transport::DetachedConnection;

std::string TempPath(const char* tag) {
  return "/tmp/flyt-handover-test-" + std::to_string(getpid()) + "-" + tag + ".sock";
}

Status SendText(Connection* c, const std::string& text) {
  iovec iov{const_cast<char*>(text.data()), text.size()};
  return c->Send(&iov, 1);
}

std::string ReceiveText(Connection* c, size_t n) {
  std::string s(n, '\0');
  return c->Receive(s.data(), n).ok() ? s : "<receive failed>";
}

struct Pair {
  std::unique_ptr<transport::Listener> listener;
  std::unique_ptr<Connection> client, server;
};

void Connect(const std::string& url, Pair* p) {
  Address a;
  ASSERT_TRUE(transport::ParseAddress(url, &a).ok());
  ASSERT_TRUE(transport::Listen(a, &p->listener).ok());
  std::thread accept([&] { ASSERT_TRUE(p->listener->Accept(&p->server).ok()); });
  ASSERT_TRUE(transport::Dial(a, transport::Liveness{}, &p->client).ok());
  accept.join();
  ASSERT_NE(p->server, nullptr);
}

// The server side reads the first message, hands the connection over, and the
// new owner reads the rest and answers on it.
void HandOver(Pair* p) {
  ASSERT_TRUE(SendText(p->client.get(), "hello").ok());
  ASSERT_TRUE(SendText(p->client.get(), "first call").ok());
  EXPECT_EQ(ReceiveText(p->server.get(), 5), "hello");
  ASSERT_TRUE(SendText(p->server.get(), "welcome").ok());
  DetachedConnection d;
  ASSERT_TRUE(p->server->Detach(&d).ok());
  p->server.reset();  // inert: neither shuts the connection down nor tells the peer
  std::unique_ptr<Connection> moved;
  ASSERT_TRUE(transport::Reattach(std::move(d), &moved).ok());
  EXPECT_EQ(ReceiveText(p->client.get(), 7), "welcome");
  EXPECT_EQ(ReceiveText(moved.get(), 10), "first call");
  ASSERT_TRUE(SendText(moved.get(), "reply").ok());
  EXPECT_EQ(ReceiveText(p->client.get(), 5), "reply");
  ASSERT_TRUE(SendText(p->client.get(), "more").ok());
  EXPECT_EQ(ReceiveText(moved.get(), 4), "more");
  p->server = std::move(moved);
}

TEST(WorkerHandover, UnixSocketKeepsBytesAlreadyBuffered) {
  Pair p;
  const std::string path = TempPath("unix");
  Connect("unix://" + path, &p);
  HandOver(&p);
  p.server.reset();  // the new owner's end: the client sees the close
  char c;
  EXPECT_FALSE(p.client->Receive(&c, 1).ok());
  unlink(path.c_str());
}

TEST(WorkerHandover, TcpSocket) {
  Pair p;
  Address a;
  ASSERT_TRUE(transport::ParseAddress("tcp://127.0.0.1:0", &a).ok());
  ASSERT_TRUE(transport::Listen(a, &p.listener).ok());
  ASSERT_TRUE(transport::ParseAddress(p.listener->Describe(), &a).ok());
  std::thread accept([&] { ASSERT_TRUE(p.listener->Accept(&p.server).ok()); });
  ASSERT_TRUE(transport::Dial(a, transport::Liveness{}, &p.client).ok());
  accept.join();
  HandOver(&p);
}

TEST(WorkerHandover, ShmKeepsRingsAndSharedDescriptors) {
  Pair p;
  const std::string path = TempPath("shm");
  Connect("shm://" + path, &p);
  // A descriptor the client shares before the hand-over arrives after it.
  const int memfd = memfd_create("handover-test", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(ftruncate(memfd, 4096), 0);
  uint64_t id = 0;
  ASSERT_TRUE(p.client->ShareFd(memfd, &id).ok());
  HandOver(&p);
  int got = -1;
  ASSERT_TRUE(p.server->TakeSharedFd(id, 5000, &got).ok());
  struct stat sa {
  }, sb{};
  ASSERT_EQ(fstat(memfd, &sa), 0);
  ASSERT_EQ(fstat(got, &sb), 0);
  EXPECT_EQ(sa.st_ino, sb.st_ino);
  close(got);
  close(memfd);
  // Large messages go through the rings of the new owner too.
  std::string big(3 << 20, 'x');
  std::thread sender([&] { EXPECT_TRUE(SendText(p.client.get(), big).ok()); });
  EXPECT_EQ(ReceiveText(p.server.get(), big.size()), big);
  sender.join();
  p.server.reset();
  char c;
  EXPECT_FALSE(p.client->Receive(&c, 1).ok());
  unlink(path.c_str());
}

TEST(WorkerChannel, ConnectionWithTicketAndDescriptors) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  DetachedConnection d;
  d.kind = DetachedConnection::Kind::kSocket;
  d.fds = {pipefd[0]};
  d.state = {1, 2, 3};
  d.peer = "tcp://peer:1";
  channel::Ticket t;
  t.session = 7;
  t.secret = 99;
  t.client_pid = 1234;
  t.share_generation = 3;
  ASSERT_TRUE(channel::SendConnection(sv[0], channel::Type::kServe, &t, &d).ok());
  channel::Message m;
  ASSERT_TRUE(channel::Receive(sv[1], &m, 5000).ok());
  EXPECT_EQ(m.type, channel::Type::kServe);
  channel::Ticket t2;
  DetachedConnection d2;
  ASSERT_TRUE(channel::ParseConnection(&m, &t2, &d2).ok());
  EXPECT_EQ(t2.session, 7u);
  EXPECT_EQ(t2.secret, 99u);
  EXPECT_EQ(t2.client_pid, 1234u);
  EXPECT_EQ(t2.share_generation, 3u);
  EXPECT_EQ(d2.peer, "tcp://peer:1");
  EXPECT_EQ(d2.state, (std::vector<uint8_t>{1, 2, 3}));
  ASSERT_EQ(d2.fds.size(), 1u);
  // The descriptor that arrived is the pipe's read end, close-on-exec.
  EXPECT_EQ(fcntl(d2.fds[0], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  ASSERT_EQ(write(pipefd[1], "z", 1), 1);
  char c = 0;
  ASSERT_EQ(read(d2.fds[0], &c, 1), 1);
  EXPECT_EQ(c, 'z');
  transport::CloseDetached(&d2);
  close(pipefd[0]);
  close(pipefd[1]);
  close(sv[0]);
  close(sv[1]);
}

TEST(WorkerChannel, MalformedMessagesAreRefusedAndTheirDescriptorsClosed) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  // Too short for a header.
  ASSERT_EQ(send(sv[0], "ab", 2, 0), 2);
  channel::Message m;
  EXPECT_FALSE(channel::Receive(sv[1], &m, 5000).ok());
  // A header whose length disagrees with the packet.
  uint32_t bad[3] = {1, 100, 0};
  ASSERT_EQ(send(sv[0], bad, sizeof(bad), 0), static_cast<ssize_t>(sizeof(bad)));
  EXPECT_FALSE(channel::Receive(sv[1], &m, 5000).ok());
  EXPECT_TRUE(m.fds.empty());
  // A connection message cut short: parsing fails and closes what came with it.
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  uint32_t tiny = 5;
  ASSERT_TRUE(
      channel::Send(sv[0], channel::Type::kCallback, &tiny, sizeof(tiny), {pipefd[0]}).ok());
  ASSERT_TRUE(channel::Receive(sv[1], &m, 5000).ok());
  ASSERT_EQ(m.fds.size(), 1u);
  const int arrived = m.fds[0];
  DetachedConnection d;
  EXPECT_FALSE(channel::ParseConnection(&m, nullptr, &d).ok());
  EXPECT_EQ(fcntl(arrived, F_GETFD), -1);  // closed
  // A closed peer is an error, not a hang.
  close(sv[0]);
  EXPECT_FALSE(channel::Receive(sv[1], &m, 5000).ok());
  close(sv[1]);
  close(pipefd[0]);
  close(pipefd[1]);
}

TEST(TenantBoard, TwoMappingsShareTheCounters) {
  std::unique_ptr<TenantBoard> main_side;
  ASSERT_TRUE(TenantBoard::Create(&main_side).ok());
  std::unique_ptr<TenantBoard> worker_side;
  ASSERT_TRUE(TenantBoard::Map(fcntl(main_side->fd(), F_DUPFD_CLOEXEC, 3), &worker_side).ok());
  (*worker_side)->memory_used += 4096;
  (*worker_side)->slots[3].client_pid = 42;
  EXPECT_EQ((*main_side)->memory_used.load(), 4096u);
  EXPECT_EQ((*main_side)->slots[3].client_pid.load(), 42u);
  (*main_side)->share_generation++;
  EXPECT_EQ((*worker_side)->share_generation.load(), 2u);
  // Something else than a board is refused.
  const int other = memfd_create("not-a-board", MFD_CLOEXEC);
  ASSERT_GE(other, 0);
  ASSERT_EQ(ftruncate(other, 4096), 0);
  std::unique_ptr<TenantBoard> wrong;
  EXPECT_FALSE(TenantBoard::Map(other, &wrong).ok());
}

}  // namespace
}  // namespace flyt::server
