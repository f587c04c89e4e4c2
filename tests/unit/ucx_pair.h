// Test helpers for the ucx:// transport's tests (ucx_transport_test.cc, ucx_rma_test.cc):
// byte patterns and a connected pair made the way flyt-server makes one (a client, the
// main process's handshake, the hand-over to a worker and the switch to UCX).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace flyt::transport {

inline std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

inline Status SendBytes(Connection* c, const std::vector<uint8_t>& v) {
  iovec iov{const_cast<uint8_t*>(v.data()), v.size()};
  return c->Send(&iov, 1);
}

inline std::unique_ptr<Listener> ListenLoopback(std::string* url) {
  Address a;
  EXPECT_TRUE(ParseAddress("ucx://127.0.0.1:0", &a).ok());
  std::unique_ptr<Listener> l;
  Status st = Listen(a, &l);
  EXPECT_TRUE(st.ok()) << st.message();
  *url = l->Describe();
  return l;
}

// A client, the main process's side (handshake done: 100 bytes each way) and the
// worker's side after the hand-over. `early`: messages the client sends before the
// hand-over (raw, on the socket).
struct Pair {
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> client, worker;
};

inline void MakePair(Pair* p, const std::vector<std::vector<uint8_t>>& early = {}) {
  std::string url;
  p->listener = ListenLoopback(&url);
  ASSERT_EQ(url.rfind("ucx://127.0.0.1:", 0), 0u) << url;
  Address a;
  ASSERT_TRUE(ParseAddress(url, &a).ok());
  ASSERT_EQ(a.kind, Address::Kind::kUcx);
  Status st = Dial(a, Liveness{}, &p->client);
  ASSERT_TRUE(st.ok()) << st.message();
  std::unique_ptr<Connection> main;
  st = p->listener->Accept(&main);
  ASSERT_TRUE(st.ok()) << st.message();
  auto hello = Pattern(100, 1);
  ASSERT_TRUE(SendBytes(p->client.get(), hello).ok());
  std::vector<uint8_t> got(100);
  main->SetReceiveTimeout(5000);
  st = main->Receive(got.data(), got.size());
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(got, hello);
  ASSERT_TRUE(SendBytes(main.get(), Pattern(100, 2)).ok());
  for (const auto& m : early) ASSERT_TRUE(SendBytes(p->client.get(), m).ok());
  DetachedConnection d;
  st = main->Detach(&d);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(d.kind, DetachedConnection::Kind::kUcx);
  main.reset();  // inert after Detach
  st = Reattach(std::move(d), &p->worker);
  ASSERT_TRUE(st.ok()) << st.message();
  p->client->SetReceiveTimeout(10000);
  p->worker->SetReceiveTimeout(10000);
  st = p->client->Receive(got.data(), got.size());
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(got, Pattern(100, 2));
}

}  // namespace flyt::transport
