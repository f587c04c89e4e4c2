// Tests of protocol/codec.h (bounds-checked decoding) and transport/ (address
// parsing, a real Unix-socket and TCP round trip, peer death).
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "protocol/codec.h"
#include "protocol/wire.h"
#include "transport/transport.h"

namespace flyt {
namespace {

TEST(Codec, RoundTripsValuesAndStrings) {
  wire::Writer w;
  w.Put<uint32_t>(7);
  w.PutString("hello");
  w.Put<double>(2.5);
  wire::Reader r(w.data(), w.size());
  uint32_t a = 0;
  std::string s;
  double d = 0;
  ASSERT_TRUE(r.Get(&a));
  ASSERT_TRUE(r.GetString(&s));
  ASSERT_TRUE(r.Get(&d));
  EXPECT_EQ(a, 7u);
  EXPECT_EQ(s, "hello");
  EXPECT_EQ(d, 2.5);
  EXPECT_EQ(r.remaining(), 0u);
}

TEST(Codec, HostileLengthsFailClosed) {
  wire::Writer w;
  w.Put<uint32_t>(0xffffffffu);  // a blob "length" far beyond the payload
  w.Put<uint8_t>(1);
  wire::Reader r(w.data(), w.size());
  const uint8_t* p = nullptr;
  uint32_t len = 0;
  EXPECT_FALSE(r.GetBlob(&p, &len));
  EXPECT_FALSE(r.ok());
  uint64_t v = 0;
  EXPECT_FALSE(r.Get(&v));  // stays failed
}

TEST(Codec, LimitIsEnforced) {
  wire::Writer w;
  w.PutString(std::string(100, 'x'));
  wire::Reader r(w.data(), w.size());
  std::string s;
  EXPECT_FALSE(r.GetString(&s, 10));
}

TEST(Codec, ShortReadFails) {
  uint8_t two[2] = {1, 2};
  wire::Reader r(two, 2);
  uint32_t v = 0;
  EXPECT_FALSE(r.Get(&v));
  EXPECT_EQ(r.Skip(1), nullptr);
}

TEST(Address, Parses) {
  transport::Address a;
  ASSERT_TRUE(transport::ParseAddress("tcp://gpu1:14833", &a).ok());
  EXPECT_EQ(a.kind, transport::Address::Kind::kTcp);
  EXPECT_EQ(a.host, "gpu1");
  EXPECT_EQ(a.port, 14833);
  ASSERT_TRUE(transport::ParseAddress("10.0.0.1:99", &a).ok());
  EXPECT_EQ(a.port, 99);
  ASSERT_TRUE(transport::ParseAddress("unix:///tmp/x.sock", &a).ok());
  EXPECT_EQ(a.kind, transport::Address::Kind::kUnix);
  EXPECT_EQ(a.path, "/tmp/x.sock");
  EXPECT_FALSE(transport::ParseAddress("nonsense", &a).ok());
  EXPECT_FALSE(transport::ParseAddress("tcp://h:99999", &a).ok());
  EXPECT_FALSE(transport::ParseAddress("unix://", &a).ok());
}

void RoundTrip(const std::string& text) {
  transport::Address addr;
  ASSERT_TRUE(transport::ParseAddress(text, &addr).ok());
  std::unique_ptr<transport::Listener> l;
  Status st = transport::Listen(addr, &l);
  ASSERT_TRUE(st.ok()) << st.message();
  // Where it listens (tcp port 0: the kernel's choice).
  ASSERT_TRUE(transport::ParseAddress(l->Describe(), &addr).ok()) << l->Describe();
  std::vector<uint8_t> big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 31);
  std::thread server([&] {
    std::unique_ptr<transport::Connection> c;
    ASSERT_TRUE(l->Accept(&c).ok());
    uint32_t small = 0;
    ASSERT_TRUE(c->Receive(&small, 4).ok());
    std::vector<uint8_t> got(big.size());
    ASSERT_TRUE(c->Receive(got.data(), got.size()).ok());
    EXPECT_EQ(got, big);
    small += 1;
    iovec iov{&small, 4};
    ASSERT_TRUE(c->Send(&iov, 1).ok());
  });
  std::unique_ptr<transport::Connection> c;
  st = transport::Dial(addr, transport::Liveness{}, &c);
  ASSERT_TRUE(st.ok()) << st.message();
  uint32_t v = 41;
  iovec iov[2] = {{&v, 4}, {big.data(), big.size()}};
  ASSERT_TRUE(c->Send(iov, 2).ok());
  uint32_t back = 0;
  ASSERT_TRUE(c->Receive(&back, 4).ok());
  EXPECT_EQ(back, 42u);
  server.join();
  // The peer is gone: a receive fails instead of hanging.
  EXPECT_FALSE(c->Receive(&back, 4).ok());
}

TEST(Transport, UnixRoundTrip) {
  RoundTrip("unix:///tmp/flyt-wire-test-" + std::to_string(getpid()) + ".sock");
}

TEST(Transport, TcpRoundTrip) {
  RoundTrip("tcp://127.0.0.1:0");  // a fixed port may be taken by another test
}

TEST(Transport, DialNobodyFailsWithAddress) {
  transport::Address addr;
  ASSERT_TRUE(transport::ParseAddress("unix:///tmp/flyt-nobody-here.sock", &addr).ok());
  std::unique_ptr<transport::Connection> c;
  Status st = transport::Dial(addr, transport::Liveness{}, &c);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("flyt-nobody-here"), std::string::npos);
}

}  // namespace
}  // namespace flyt
