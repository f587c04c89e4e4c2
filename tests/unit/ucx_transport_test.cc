// ucx:// transport: the hand-over from flyt-server's main process to a worker (here both
// in one process), the switch from the socket to UCX, byte-stream semantics over UCX
// messages, liveness, timeouts, and hostile peers (prefaces, switch messages, lengths,
// bytes on the socket after the switch). ctest runs it with UCX_TLS=tcp and sm,self.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "transport/transport.h"
#include "transport/ucx_api.h"
#include "transport/ucx_transport.h"
#include "ucx_pair.h"

namespace flyt::transport {
namespace {

using namespace std::chrono_literals;

TEST(UcxTransport, ParsesAddresses) {
  Address a;
  ASSERT_TRUE(ParseAddress("ucx://gpu-host:14833", &a).ok());
  EXPECT_EQ(a.kind, Address::Kind::kUcx);
  EXPECT_EQ(a.host, "gpu-host");
  EXPECT_EQ(a.port, 14833);
  EXPECT_EQ(a.ToString(), "ucx://gpu-host:14833");
  EXPECT_FALSE(ParseAddress("ucx://nohost", &a).ok());
}

TEST(UcxTransport, StreamSurvivesTheHandOverAndTheSwitch) {
  const std::vector<std::vector<uint8_t>> early = {Pattern(10, 3), Pattern(5000, 4),
                                                   Pattern(300000, 5)};
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair(&p, early));
  // The worker reads what the client sent on the socket before and during the hand-over.
  for (const auto& m : early) {
    std::vector<uint8_t> got(m.size());
    Status st = p.worker->Receive(got.data(), got.size());
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(got, m);
  }
  // Both directions over UCX: small, gathered and large messages, read in odd pieces.
  std::mt19937 rng(7);
  for (int round = 0; round < 2; ++round) {
    Connection* tx = round == 0 ? p.worker.get() : p.client.get();
    Connection* rx = round == 0 ? p.client.get() : p.worker.get();
    std::vector<uint8_t> sent;
    auto sender = std::async(std::launch::async, [&] {
      std::mt19937 r(11 + round);
      for (int i = 0; i < 200; ++i) {
        const size_t sizes[4] = {32, r() % 200, (i % 50 == 0) ? (size_t{8} << 20) : r() % 70000, 0};
        std::vector<std::vector<uint8_t>> parts;
        iovec iov[4];
        for (int k = 0; k < 4; ++k) {
          parts.push_back(Pattern(sizes[k], static_cast<uint32_t>(i * 4 + k)));
          iov[k] = {parts.back().data(), parts.back().size()};
        }
        Status st = tx->Send(iov, 4);
        if (!st.ok()) return st;
        for (auto& part : parts) sent.insert(sent.end(), part.begin(), part.end());
      }
      return Status::Ok();
    });
    std::vector<uint8_t> got;
    size_t expected = 0;
    {
      std::mt19937 r(11 + round);
      for (int i = 0; i < 200; ++i) {
        expected += 32 + r() % 200;
        expected += (i % 50 == 0) ? (size_t{8} << 20) : r() % 70000;
      }
    }
    while (got.size() < expected) {
      size_t n = std::min<size_t>(expected - got.size(), 1 + rng() % 100000);
      std::vector<uint8_t> piece(n);
      Status st = rx->Receive(piece.data(), n);
      ASSERT_TRUE(st.ok()) << st.message();
      got.insert(got.end(), piece.begin(), piece.end());
    }
    Status st = sender.get();
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(got.size(), sent.size());
    ASSERT_TRUE(got == sent) << "round " << round;
  }
}

TEST(UcxTransport, ClientThatLeavesIsNoticed) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair(&p));
  ASSERT_TRUE(SendBytes(p.client.get(), Pattern(64, 9)).ok());
  std::vector<uint8_t> got(64);
  ASSERT_TRUE(p.worker->Receive(got.data(), 64).ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto waiter = std::async(std::launch::async, [&] {
    uint8_t b;
    return p.worker->Receive(&b, 1);
  });
  std::this_thread::sleep_for(100ms);
  p.client.reset();
  Status st = waiter.get();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("went away"), std::string::npos) << st.message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST(UcxTransport, ServerThatLeavesIsNoticed) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair(&p));
  // A UCX send completes once the peer takes part (here: its Receive), as a reply does.
  auto reader = std::async(std::launch::async, [&] {
    std::vector<uint8_t> got(64);
    return p.client->Receive(got.data(), 64);
  });
  ASSERT_TRUE(SendBytes(p.worker.get(), Pattern(64, 9)).ok());
  ASSERT_TRUE(reader.get().ok());
  auto waiter = std::async(std::launch::async, [&] {
    uint8_t b;
    return p.client->Receive(&b, 1);
  });
  std::this_thread::sleep_for(100ms);
  p.worker.reset();
  Status st = waiter.get();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("flyt-server at"), std::string::npos) << st.message();
  // Every later call fails at once.
  EXPECT_FALSE(SendBytes(p.client.get(), Pattern(10, 1)).ok());
}

TEST(UcxTransport, ReceiveTimesOutAndShutdownWakes) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair(&p));
  p.worker->SetReceiveTimeout(200);
  uint8_t b;
  const auto t0 = std::chrono::steady_clock::now();
  Status st = p.worker->Receive(&b, 1);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("timed out"), std::string::npos) << st.message();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 150ms);
  p.client->SetReceiveTimeout(0);
  auto waiter = std::async(std::launch::async, [&] { return p.client->Receive(&b, 1); });
  std::this_thread::sleep_for(100ms);
  p.client->Shutdown();
  st = waiter.get();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("shut down"), std::string::npos) << st.message();
}

// --- hostile peers

// Connects a plain TCP socket to a ucx:// listener and sends `bytes`; returns what the
// main process's Receive said.
Status ServerSees(const std::vector<uint8_t>& bytes, bool close_after) {
  std::string url;
  auto l = ListenLoopback(&url);
  Address tcp;
  EXPECT_TRUE(ParseAddress("tcp://" + url.substr(6), &tcp).ok());
  std::unique_ptr<Connection> raw;
  Status st = Dial(tcp, Liveness{}, &raw);
  if (!st.ok()) return st;
  std::unique_ptr<Connection> main;
  st = l->Accept(&main);
  if (!st.ok()) return st;
  if (!bytes.empty()) {
    EXPECT_TRUE(SendBytes(raw.get(), bytes).ok());
  }
  if (close_after) raw.reset();
  main->SetReceiveTimeout(2000);
  std::vector<uint8_t> frame(32);
  return main->Receive(frame.data(), frame.size());
}

TEST(UcxTransport, HostilePrefacesAreRefused) {
  Status st = ServerSees(Pattern(64, 1), false);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not a ucx:// client"), std::string::npos) << st.message();

  UcxPreface p;
  p.tag = 5;
  p.address_len = 0x7fffffff;  // hostile length: refused before any allocation
  std::vector<uint8_t> b(sizeof(p));
  std::memcpy(b.data(), &p, sizeof(p));
  st = ServerSees(b, false);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("worker address of"), std::string::npos) << st.message();

  p.address_len = 100;
  b.resize(sizeof(p) + 40);  // truncated: the client hangs up in the middle
  std::memcpy(b.data(), &p, sizeof(p));
  st = ServerSees(b, true);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("went away"), std::string::npos) << st.message();

  // An address in a format no UCX writes (UCX would abort the worker on it): refused by
  // the main process, which never loads UCX.
  b.assign(sizeof(p) + 100, 0x3f);
  std::memcpy(b.data(), &p, sizeof(p));
  st = ServerSees(b, false);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("format version 15"), std::string::npos) << st.message();
  EXPECT_FALSE(ucx::CheckWorkerAddress(b.data(), 1).ok());
  EXPECT_FALSE(ucx::CheckWorkerAddress(nullptr, 100).ok());

  st = ServerSees({}, false);  // says nothing: the handshake timeout applies
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("timed out"), std::string::npos) << st.message();

  // A plain Flyt frame on a ucx:// port.
  std::vector<uint8_t> frame(32, 0);
  const uint32_t magic = 0x54594c46;
  std::memcpy(frame.data(), &magic, 4);
  st = ServerSees(frame, false);
  EXPECT_FALSE(st.ok());
}

TEST(UcxTransport, SwitchMessagesAreChecked) {
  UcxSwitch sw;
  sw.tag = 9;
  std::vector<uint8_t> b(sizeof(sw));
  std::memcpy(b.data(), &sw, sizeof(sw));
  UcxSwitch out;
  EXPECT_TRUE(ParseUcxSwitch(b.data(), b.size(), false, &out).ok());
  EXPECT_FALSE(ParseUcxSwitch(b.data(), b.size(), true, &out).ok());  // server's needs one
  EXPECT_FALSE(ParseUcxSwitch(b.data(), 8, false, &out).ok());
  sw.address_len = 1000;  // more than came
  std::memcpy(b.data(), &sw, sizeof(sw));
  EXPECT_FALSE(ParseUcxSwitch(b.data(), b.size(), false, &out).ok());
  sw.address_len = 0;
  sw.magic = 1;
  std::memcpy(b.data(), &sw, sizeof(sw));
  EXPECT_FALSE(ParseUcxSwitch(b.data(), b.size(), false, &out).ok());
  sw.magic = UcxSwitch::kMagic;
  sw.tag = 0;
  std::memcpy(b.data(), &sw, sizeof(sw));
  EXPECT_FALSE(ParseUcxSwitch(b.data(), b.size(), false, &out).ok());
}

// A fake server that speaks UCX to a real client and misbehaves.
class FakeServer {
 public:
  FakeServer() {
    Status st = ucx::Get(&api_);
    EXPECT_TRUE(st.ok()) << st.message();
    Address a;
    EXPECT_TRUE(ParseAddress("tcp://127.0.0.1:0", &a).ok());
    EXPECT_TRUE(Listen(a, &tcp_).ok());
    url_ = "ucx://" + tcp_->Describe().substr(6);
    ucp_worker_params_t wp{};
    EXPECT_EQ(api_->worker_create(api_->context, &wp, &worker_), UCS_OK);
  }
  ~FakeServer() {
    stop_ = true;
    if (pump_.joinable()) pump_.join();
    if (ep_ != nullptr) {
      ucp_request_param_t p{};
      void* r = api_->ep_close_nbx(ep_, &p);
      const auto until = std::chrono::steady_clock::now() + 200ms;
      if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
        while (api_->request_check_status(r) == UCS_INPROGRESS &&
               std::chrono::steady_clock::now() < until)
          api_->worker_progress(worker_);
        api_->request_free(r);
      }
    }
    api_->worker_destroy(worker_);
  }

  // Accepts the client, reads its preface and reaches its worker.
  void Accept(std::unique_ptr<Connection>* client) {
    Address a;
    ASSERT_TRUE(ParseAddress(url_, &a).ok());
    Status st = Dial(a, Liveness{}, client);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_TRUE(tcp_->Accept(&sock_).ok());
    UcxPreface p;
    ASSERT_TRUE(sock_->Receive(&p, sizeof(p)).ok());
    ASSERT_TRUE(ValidateUcxPreface(p).ok());
    tag_ = p.tag;
    std::vector<uint8_t> addr(p.address_len);
    ASSERT_TRUE(sock_->Receive(addr.data(), addr.size()).ok());
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(addr.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ucs_status_t s = api_->ep_create(worker_, &ep, &ep_);
    if (s == UCS_ERR_UNREACHABLE) {  // shared memory: no peer-failure handling
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
      s = api_->ep_create(worker_, &ep, &ep_);
    }
    ASSERT_EQ(s, UCS_OK);
    pump_ = std::thread([this] {
      while (!stop_) {
        std::lock_guard<std::mutex> lock(mu_);
        api_->worker_progress(worker_);
      }
    });
  }

  // A message to the client, with its tag (left in flight: the client's receive
  // completes it).
  void SendUcx(std::vector<uint8_t> bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    kept_.push_back(std::move(bytes));
    ucp_request_param_t p{};
    void* r = api_->tag_send_nbx(ep_, kept_.back().data(), kept_.back().size(), tag_, &p);
    ASSERT_FALSE(UCS_PTR_IS_ERR(r));
    if (r != nullptr) api_->request_free(r);
  }
  // A valid switch (raw_bytes as given) carrying this worker's real address.
  std::vector<uint8_t> Switch(uint64_t raw_bytes) {
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(api_->worker_get_address(worker_, &addr, &len), UCS_OK);
    UcxSwitch sw;
    sw.raw_bytes = raw_bytes;
    sw.tag = 77;
    sw.address_len = static_cast<uint32_t>(len);
    std::vector<uint8_t> b(sizeof(sw) + len);
    std::memcpy(b.data(), &sw, sizeof(sw));
    std::memcpy(b.data() + sizeof(sw), addr, len);
    api_->worker_release_address(worker_, addr);
    return b;
  }
  Connection* socket() { return sock_.get(); }

 private:
  const ucx::Api* api_ = nullptr;
  std::unique_ptr<Listener> tcp_;
  std::unique_ptr<Connection> sock_;
  std::string url_;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  uint64_t tag_ = 0;
  std::mutex mu_;
  std::atomic<bool> stop_{false};
  std::thread pump_;
  std::vector<std::vector<uint8_t>> kept_;
};

Status Receive(Connection* c, size_t n) {
  std::vector<uint8_t> buf(n);
  c->SetReceiveTimeout(5000);
  return c->Receive(buf.data(), n);
}

TEST(UcxTransport, HostileServerMessagesFailCleanly) {
  // Garbage instead of a switch.
  {
    FakeServer fake;
    std::unique_ptr<Connection> client;
    ASSERT_NO_FATAL_FAILURE(fake.Accept(&client));
    fake.SendUcx(Pattern(100, 1));
    Status st = Receive(client.get(), 16);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("bad switch to UCX"), std::string::npos) << st.message();
    EXPECT_FALSE(Receive(client.get(), 16).ok());  // and stays failed
  }
  // A truncated switch.
  {
    FakeServer fake;
    std::unique_ptr<Connection> client;
    ASSERT_NO_FATAL_FAILURE(fake.Accept(&client));
    auto sw = fake.Switch(0);
    sw.resize(12);
    fake.SendUcx(sw);
    Status st = Receive(client.get(), 16);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
  }
  // A hostile length after a valid switch: refused, nothing allocated for it.
  {
    FakeServer fake;
    std::unique_ptr<Connection> client;
    ASSERT_NO_FATAL_FAILURE(fake.Accept(&client));
    fake.SendUcx(fake.Switch(0));
    fake.SendUcx(std::vector<uint8_t>(kUcxMaxMessage + 1));
    Status st = Receive(client.get(), 16);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("larger than any frame"), std::string::npos) << st.message();
  }
  // The raw byte count goes backwards (10 bytes came on the socket, the switch says 4).
  {
    FakeServer fake;
    std::unique_ptr<Connection> client;
    ASSERT_NO_FATAL_FAILURE(fake.Accept(&client));
    ASSERT_TRUE(SendBytes(fake.socket(), Pattern(10, 2)).ok());
    std::this_thread::sleep_for(50ms);
    std::vector<uint8_t> first(10);
    ASSERT_TRUE(client->Receive(first.data(), 10).ok());
    fake.SendUcx(fake.Switch(4));
    Status st = Receive(client.get(), 16);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("went backwards"), std::string::npos) << st.message();
  }
  // Bytes on the socket after the switch.
  {
    FakeServer fake;
    std::unique_ptr<Connection> client;
    ASSERT_NO_FATAL_FAILURE(fake.Accept(&client));
    fake.SendUcx(fake.Switch(0));
    fake.SendUcx(Pattern(8, 3));
    std::vector<uint8_t> got(8);
    Status st = Receive(client.get(), 8);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_TRUE(SendBytes(fake.socket(), Pattern(3, 4)).ok());
    st = Receive(client.get(), 8);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("protocol violation"), std::string::npos) << st.message();
  }
  // A server that hangs up in the middle of a message stream.
  {
    FakeServer fake;
    std::unique_ptr<Connection> client;
    ASSERT_NO_FATAL_FAILURE(fake.Accept(&client));
    fake.SendUcx(fake.Switch(0));
    fake.SendUcx(Pattern(8, 3));
    fake.socket()->Shutdown();
    Status st = Receive(client.get(), 100);  // 8 bytes come, then the hang-up
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("went away"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace flyt::transport
