// One-sided copies through a real session (server/session_rma.cc) over a real ucx://
// connection, the session on the sim backend as a worker runs it: a client that speaks
// the frames itself registers its buffers and copies both ways (staged and straight to
// device memory, synchronous and asynchronous, at odd sizes and offsets), then sends what
// a malicious client would: requests before the attach, garbage addresses and keys,
// ranges outside what it registered, lengths that wrap, unknown keys and streams, bogus
// device pointers, malformed frames. Each is refused with an error (or, when malformed,
// ends that session only) and never touches memory the client did not register.
// ctest runs it with UCX_TLS=tcp and sm,self.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "protocol/codec.h"
#include "protocol/ops.h"
#include "protocol/wire.h"
#include "server/session.h"
#include "server/tenant_board.h"
#include "sim_server_state.h"
#include "transport/ucx_rma.h"
#include "ucx_pair.h"

namespace flyt::server {
namespace {

using transport::Connection;
using transport::Pattern;
using transport::RemoteMemory;

ServerState* State() { return SimServerState(256ull << 20); }

// A session on the worker's side of a ucx:// pair, and a client that speaks frames.
class Served {
 public:
  Served() {
    transport::MakePair(&pair_);
    if (::testing::Test::HasFatalFailure()) return;
    channel::Ticket ticket;
    ticket.session = 7;
    ticket.client_pid = 1;
    session_ = std::make_unique<Session>(State(), std::move(pair_.worker), ticket);
    // The session goes when it ends, as its worker process does: the client sees it.
    thread_ = std::thread([this] {
      session_->Run();
      session_.reset();
    });
  }
  ~Served() {
    if (thread_.joinable()) {
      wire::FrameHeader bye{wire::kMagic, ops::kOpGoodbye, 0, next_++, 0, 0, 0, 0};
      iovec iov{&bye, sizeof(bye)};
      (void)pair_.client->Send(&iov, 1);
      thread_.join();
    }
  }
  Connection* client() { return pair_.client.get(); }

  // Sends a frame; with a reply, returns its status and payload; false: the session
  // closed the connection.
  bool Call(uint16_t op, const wire::Writer& w, CUresult* rc, std::vector<uint8_t>* reply = nullptr,
            bool want_reply = true) {
    wire::FrameHeader h{wire::kMagic,
                        op,
                        static_cast<uint16_t>(want_reply ? wire::kFlagWantReply : 0),
                        next_++,
                        static_cast<uint32_t>(w.size()),
                        0,
                        0,
                        0};
    iovec iov[2] = {{&h, sizeof(h)}, {const_cast<uint8_t*>(w.data()), w.size()}};
    if (!pair_.client->Send(iov, w.size() > 0 ? 2 : 1).ok()) return false;
    if (!want_reply) return true;
    wire::FrameHeader r{};
    if (!pair_.client->Receive(&r, sizeof(r)).ok()) return false;
    EXPECT_EQ(r.call_id, h.call_id);
    std::vector<uint8_t> payload(r.payload_len);
    if (!pair_.client->Receive(payload.data(), payload.size()).ok()) return false;
    *rc = static_cast<CUresult>(r.deferred_status != 0 ? r.deferred_status : r.status);
    if (reply != nullptr) *reply = std::move(payload);
    return true;
  }
  CUresult Status(uint16_t op, const wire::Writer& w, std::vector<uint8_t>* reply = nullptr) {
    CUresult rc = CUDA_ERROR_UNKNOWN;
    EXPECT_TRUE(Call(op, w, &rc, reply)) << "op " << op << ": the session closed";
    return rc;
  }
  // The session closes the connection on a malformed frame.
  bool Closes(uint16_t op, const wire::Writer& w) {
    CUresult rc;
    if (!Call(op, w, &rc)) return true;
    ADD_FAILURE() << "op " << op << " answered " << rc << " instead of closing";
    return false;
  }

  // Primary context and a device allocation of n bytes.
  uint64_t Setup(uint64_t n) {
    wire::Writer r;
    r.Put<int32_t>(0);
    std::vector<uint8_t> reply;
    EXPECT_EQ(Status(ops::kOpPrimaryCtxRetain, r, &reply), CUDA_SUCCESS);
    wire::Writer m;
    m.Put<uint8_t>(1);  // cuMemAlloc_v2(CUdeviceptr* out, size_t n): the output is wanted
    m.Put<uint64_t>(n);
    EXPECT_EQ(Status(150, m, &reply), CUDA_SUCCESS);
    uint64_t d = 0;
    EXPECT_EQ(reply.size(), sizeof(d));
    if (reply.size() == sizeof(d)) std::memcpy(&d, reply.data(), sizeof(d));
    return d;
  }
  CUresult Attach(const std::vector<uint8_t>& address, uint32_t* flags = nullptr) {
    wire::Writer w;
    w.PutBlob(address.data(), address.size());
    std::vector<uint8_t> reply;
    CUresult rc = Status(ops::kOpRmaAttach, w, &reply);
    if (rc == CUDA_SUCCESS && flags != nullptr && reply.size() == 4)
      std::memcpy(flags, reply.data(), 4);
    return rc;
  }
  CUresult Register(uint64_t base, uint64_t size, const std::vector<uint8_t>& key, uint64_t* id) {
    wire::Writer w;
    w.Put<uint64_t>(base);
    w.Put<uint64_t>(size);
    w.PutBlob(key.data(), key.size());
    std::vector<uint8_t> reply;
    CUresult rc = Status(ops::kOpRmaRegister, w, &reply);
    if (rc == CUDA_SUCCESS && reply.size() == 8) std::memcpy(id, reply.data(), 8);
    return rc;
  }
  static wire::Writer CopyReq(bool to_device, uint64_t device, uint64_t key, uint64_t client,
                              uint64_t n, uint64_t stream, bool async) {
    wire::Writer w;
    w.Put<uint8_t>(to_device ? 1 : 0);
    w.Put<uint64_t>(device);
    w.Put<uint64_t>(key);
    w.Put<uint64_t>(client);
    w.Put<uint64_t>(n);
    w.Put<uint64_t>(stream);
    w.Put<uint8_t>(async ? 1 : 0);
    return w;
  }
  CUresult Copy(bool to_device, uint64_t device, uint64_t key, const void* client, uint64_t n,
                bool async = false, uint64_t stream = 0) {
    return Status(ops::kOpCopyRma, CopyReq(to_device, device, key,
                                           reinterpret_cast<uintptr_t>(client), n, stream, async));
  }
  CUresult Sync() { return Status(100, wire::Writer{}); }  // cuCtxSynchronize

 private:
  transport::Pair pair_;
  std::unique_ptr<Session> session_;
  std::thread thread_;
  uint64_t next_ = 1;
};

uint64_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(SessionRma, CopiesBothWaysAtOddOffsets) {
  Served s;
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const size_t n = (size_t{17} << 20) + 333;  // three staging chunks and some
  const uint64_t d = s.Setup(n);
  ASSERT_NE(d, 0u);
  RemoteMemory* mine = s.client()->Rma();
  ASSERT_NE(mine, nullptr);
  std::vector<uint8_t> address;
  ASSERT_TRUE(mine->LocalAddress(&address).ok());
  uint32_t flags = 0;
  ASSERT_EQ(s.Attach(address, &flags), CUDA_SUCCESS);
  EXPECT_EQ(flags & ops::kRmaDirect, ops::kRmaDirect) << "the sim's device memory is host memory";
  std::vector<uint8_t> a = Pattern(n, 1), b(n, 0);
  std::vector<uint8_t> ka, kb;
  uint64_t ha = 0, hb = 0, ida = 0, idb = 0;
  ASSERT_TRUE(mine->Expose(a.data(), n, &ka, &ha).ok());
  ASSERT_TRUE(mine->Expose(b.data(), n, &kb, &hb).ok());
  ASSERT_EQ(s.Register(Addr(a.data()), n, ka, &ida), CUDA_SUCCESS);
  ASSERT_EQ(s.Register(Addr(b.data()), n, kb, &idb), CUDA_SUCCESS);

  // Synchronous: straight to and from device memory.
  ASSERT_EQ(s.Copy(true, d, ida, a.data(), n), CUDA_SUCCESS);
  ASSERT_EQ(s.Copy(false, d, idb, b.data(), n), CUDA_SUCCESS);
  ASSERT_EQ(a, b);
  // Asynchronous: staged, written back by host functions; a synchronize makes them seen.
  std::mt19937 rng(3);
  for (int i = 0; i < 12; ++i) {
    const size_t off = rng() % n;
    const size_t len = 1 + rng() % std::min<size_t>(n - off, (size_t{9} << 20));
    auto fresh = Pattern(len, 50 + i);
    std::memcpy(a.data() + off, fresh.data(), len);
    std::fill(b.begin(), b.end(), 0);
    ASSERT_EQ(s.Copy(true, d + off, ida, a.data() + off, len, true), CUDA_SUCCESS);
    ASSERT_EQ(s.Copy(false, d + off, idb, b.data() + off, len, true), CUDA_SUCCESS);
    ASSERT_EQ(s.Sync(), CUDA_SUCCESS);
    ASSERT_EQ(0, std::memcmp(b.data() + off, fresh.data(), len)) << off << "+" << len;
    EXPECT_TRUE(off == 0 || b[off - 1] == 0);
    EXPECT_TRUE(off + len == n || b[off + len] == 0);
  }
  // A device range the direct path does not take (not the allocation's): staged, and the
  // driver's answer (a range past the allocation is not device memory).
  EXPECT_NE(s.Copy(true, d + n - 10, ida, a.data(), 20), CUDA_SUCCESS);
  // Unregistered: copies by that key are refused.
  wire::Writer u;
  u.Put<uint64_t>(ida);
  EXPECT_EQ(s.Status(ops::kOpRmaUnregister, u), CUDA_SUCCESS);
  EXPECT_EQ(s.Status(ops::kOpRmaUnregister, u), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(s.Copy(true, d, ida, a.data(), 64), CUDA_ERROR_INVALID_VALUE);
  mine->Withdraw(ha);
  EXPECT_EQ(s.Copy(false, d, idb, b.data(), 64), CUDA_SUCCESS);
}

TEST(SessionRma, HostileRequestsAreRefused) {
  Served s;
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const uint64_t d = s.Setup(1 << 20);
  ASSERT_NE(d, 0u);
  std::vector<uint8_t> buf(1 << 20), outside(4096, 0x77);
  // Before the attach: nothing.
  uint64_t id = 0;
  EXPECT_EQ(s.Register(Addr(buf.data()), buf.size(), Pattern(20, 1), &id),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(s.Copy(true, d, 1, buf.data(), 16), CUDA_ERROR_INVALID_VALUE);
  // An empty address: refused by the transport.
  EXPECT_EQ(s.Attach({}), CUDA_ERROR_NOT_SUPPORTED);
  // Addresses in no format UCX writes (it would abort the process on them): refused.
  for (uint8_t first : {0x02, 0x0f, 0x36, 0xff}) {
    auto g = Pattern(300, first);
    g[0] = first;
    EXPECT_EQ(s.Attach(g), CUDA_ERROR_NOT_SUPPORTED) << int{first};
  }
  EXPECT_EQ(s.Attach({0}), CUDA_ERROR_NOT_SUPPORTED) << "one byte";
  // The real one.
  RemoteMemory* mine = s.client()->Rma();
  std::vector<uint8_t> address, key;
  ASSERT_TRUE(mine->LocalAddress(&address).ok());
  ASSERT_EQ(s.Attach(address), CUDA_SUCCESS);
  EXPECT_EQ(s.Attach(address), CUDA_ERROR_INVALID_VALUE) << "a second attach";
  uint64_t h = 0;
  ASSERT_TRUE(mine->Expose(buf.data(), buf.size(), &key, &h).ok());
  // Keys: garbage, the wrong memory type, stray bytes, empty.
  EXPECT_EQ(s.Register(Addr(buf.data()), buf.size(), Pattern(40, 2), &id),
            CUDA_ERROR_INVALID_VALUE);
  auto k = key;
  k[8] = UCS_MEMORY_TYPE_CUDA;
  EXPECT_EQ(s.Register(Addr(buf.data()), buf.size(), k, &id), CUDA_ERROR_INVALID_VALUE);
  k = key;
  k.push_back(1);
  EXPECT_EQ(s.Register(Addr(buf.data()), buf.size(), k, &id), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(s.Register(Addr(buf.data()), buf.size(), {}, &id), CUDA_ERROR_INVALID_VALUE);
  // Sizes: none, wrapping around.
  EXPECT_EQ(s.Register(Addr(buf.data()), 0, key, &id), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(s.Register(~uint64_t{0} - 10, 100, key, &id), CUDA_ERROR_INVALID_VALUE);
  // A good one, for a range smaller than the buffer.
  const uint64_t base = Addr(buf.data()) + 4096, size = 8192;
  ASSERT_EQ(s.Register(base, size, key, &id), CUDA_SUCCESS);
  // Copies outside that range, wrapping lengths, unknown keys, streams, device pointers.
  const auto* in = reinterpret_cast<const uint8_t*>(base);
  EXPECT_EQ(s.Copy(true, d, id, in - 1, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(s.Copy(true, d, id, in + size - 8, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(s.Copy(false, d, id, in + 1, size), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(s.Copy(false, d, id, in + 16, ~uint64_t{0} - 8), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(s.Copy(false, d, id, outside.data(), 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(s.Copy(true, d, id + 1000, in, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(s.Copy(true, d, id, in, 16, false, 0x1234567), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(s.Copy(true, d, id, in, 0), CUDA_SUCCESS);
  EXPECT_NE(s.Copy(true, 0x10, id, in, 16), CUDA_SUCCESS) << "a bogus device pointer";
  EXPECT_NE(s.Copy(false, d + (1 << 20) + 4096, id, in, 16), CUDA_SUCCESS);
  // An asynchronous copy from a bogus device pointer: its error comes with the next reply.
  CUresult rc = CUDA_SUCCESS;
  ASSERT_TRUE(s.Call(ops::kOpCopyRma, Served::CopyReq(false, 0x10, id, base, 16, 0, true), &rc,
                     nullptr, false));
  EXPECT_NE(s.Sync(), CUDA_SUCCESS);
  EXPECT_EQ(std::count(outside.begin(), outside.end(), 0x77), 4096) << "memory not registered";
  // And the session still copies what it may.
  std::memset(buf.data() + 4096, 0x42, size);
  EXPECT_EQ(s.Copy(true, d, id, in, size), CUDA_SUCCESS);
  std::memset(buf.data() + 4096, 0, size);
  EXPECT_EQ(s.Copy(false, d, id, in, size), CUDA_SUCCESS);
  EXPECT_EQ(buf[4096 + size - 1], 0x42);
  EXPECT_EQ(buf[4095], 0);
  EXPECT_EQ(buf[4096 + size], 0);
  // Malformed frames end this session only (the direction byte, trailing bytes, a key
  // longer than any UCX packs, a truncated request).
  wire::Writer bad = Served::CopyReq(true, d, id, base, 16, 0, false);
  bad.Put<uint8_t>(0);
  EXPECT_TRUE(s.Closes(ops::kOpCopyRma, bad));
}

TEST(SessionRma, MalformedFramesEndTheSession) {
  for (int which = 0; which < 4; ++which) {
    Served s;
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    s.Setup(4096);
    wire::Writer w;
    switch (which) {
      case 0:  // a direction that is neither
        w = Served::CopyReq(true, 0, 1, 0, 16, 0, false);
        {
          std::vector<uint8_t> raw(w.data(), w.data() + w.size());
          raw[0] = 2;
          w = wire::Writer();
          w.PutBytes(raw.data(), raw.size());
        }
        EXPECT_TRUE(s.Closes(ops::kOpCopyRma, w));
        break;
      case 1: {  // a key longer than any UCX packs
        w.Put<uint64_t>(1);
        w.Put<uint64_t>(1);
        std::vector<uint8_t> huge(ops::kMaxRmaKey + 1);
        w.PutBlob(huge.data(), huge.size());
        EXPECT_TRUE(s.Closes(ops::kOpRmaRegister, w));
        break;
      }
      case 2:  // an address longer than any worker's
        w.Put<uint32_t>(ops::kMaxRmaAddress + 1);
        EXPECT_TRUE(s.Closes(ops::kOpRmaAttach, w));
        break;
      case 3:  // truncated
        w.Put<uint8_t>(1);
        w.Put<uint64_t>(0);
        EXPECT_TRUE(s.Closes(ops::kOpCopyRma, w));
        break;
    }
  }
}

}  // namespace
}  // namespace flyt::server
