// Staged device-to-host copies (server/session_staged_copy.cc) through a real session on
// the sim backend over a real shm:// connection, with a client that speaks the frames
// itself: it shares a staging area (kOpHostShare), then copies at odd sizes (one chunk,
// many chunks, more chunks than slots), reading each notice, copying the slot out and
// acking it. Then what a broken or hostile client does: an area outside its shared
// memory, a copy that fails in a later chunk, acks out of order, malformed requests, a
// client that leaves in the middle of a copy. Each is an error on that copy, or ends that
// session only; the session never writes outside the area.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "byte_pattern.h"
#include "protocol/codec.h"
#include "protocol/ops.h"
#include "protocol/wire.h"
#include "server/session.h"
#include "server/tenant_board.h"
#include "sim_server_state.h"
#include "transport/transport.h"

namespace flyt::server {
namespace {

using transport::Connection;

ServerState* State() { return SimServerState(256ull << 20); }

using test_support::Pattern;

constexpr uint64_t kChunk = 64 << 10;
constexpr uint32_t kSlots = 3;

// A session on the server side of a shm:// pair, and a client that speaks frames.
class Served {
 public:
  Served() {
    path_ = "/tmp/flyt-staged-test-" + std::to_string(getpid()) + "-" + std::to_string(++count_) +
            ".sock";
    transport::Address a;
    EXPECT_TRUE(transport::ParseAddress("shm://" + path_, &a).ok());
    EXPECT_TRUE(transport::Listen(a, &listener_).ok());
    std::unique_ptr<Connection> server;
    std::thread acceptor([&] { EXPECT_TRUE(listener_->Accept(&server).ok()); });
    flyt::Status st = transport::Dial(a, transport::Liveness{}, &client_);
    acceptor.join();
    EXPECT_TRUE(st.ok()) << st.message();
    if (server == nullptr || client_ == nullptr) return;
    channel::Ticket ticket;
    ticket.session = 9;
    ticket.client_pid = 1;
    session_ = std::make_unique<Session>(State(), std::move(server), ticket);
    thread_ = std::thread([this] {
      session_->Run();
      session_.reset();
      ended_ = true;
    });
  }
  ~Served() {
    if (thread_.joinable()) {
      wire::FrameHeader bye{wire::kMagic, ops::kOpGoodbye, 0, next_++, 0, 0, 0, 0};
      iovec iov{&bye, sizeof(bye)};
      (void)client_->Send(&iov, 1);
      thread_.join();
    }
    if (area_ != nullptr) munmap(area_, area_bytes_);
    unlink(path_.c_str());
  }
  bool ok() const { return client_ != nullptr && session_ != nullptr; }
  Connection* client() { return client_.get(); }

  bool SendFrame(uint16_t op, const wire::Writer& w, uint64_t* id) {
    wire::FrameHeader h{
        wire::kMagic, op, wire::kFlagWantReply, next_++, static_cast<uint32_t>(w.size()), 0, 0, 0};
    *id = h.call_id;
    iovec iov[2] = {{&h, sizeof(h)}, {const_cast<uint8_t*>(w.data()), w.size()}};
    return client_->Send(iov, w.size() > 0 ? 2 : 1).ok();
  }
  // The reply of call `id`: false when the session closed the connection.
  bool ReadReply(uint64_t id, CUresult* rc, std::vector<uint8_t>* reply = nullptr) {
    wire::FrameHeader r{};
    if (!client_->Receive(&r, sizeof(r)).ok()) return false;
    EXPECT_EQ(r.call_id, id);
    std::vector<uint8_t> payload(r.payload_len);
    if (!client_->Receive(payload.data(), payload.size()).ok()) return false;
    *rc = static_cast<CUresult>(r.deferred_status != 0 ? r.deferred_status : r.status);
    if (reply != nullptr) *reply = std::move(payload);
    return true;
  }
  CUresult Status(uint16_t op, const wire::Writer& w, std::vector<uint8_t>* reply = nullptr) {
    uint64_t id = 0;
    CUresult rc = CUDA_ERROR_UNKNOWN;
    EXPECT_TRUE(SendFrame(op, w, &id) && ReadReply(id, &rc, reply)) << "op " << op << ": closed";
    return rc;
  }

  // Primary context, a device allocation of n bytes holding `bytes`, and a staging area.
  uint64_t Setup(const std::vector<uint8_t>& bytes) {
    wire::Writer r;
    r.Put<int32_t>(0);
    std::vector<uint8_t> reply;
    EXPECT_EQ(Status(ops::kOpPrimaryCtxRetain, r, &reply), CUDA_SUCCESS);
    wire::Writer m;
    m.Put<uint8_t>(1);  // cuMemAlloc_v2: the output is wanted
    m.Put<uint64_t>(bytes.size());
    EXPECT_EQ(Status(150, m, &reply), CUDA_SUCCESS);
    uint64_t d = 0;
    if (reply.size() == sizeof(d)) std::memcpy(&d, reply.data(), sizeof(d));
    wire::Writer up;
    up.Put<uint64_t>(d);
    up.Put<uint64_t>(0);
    up.Put<uint8_t>(0);
    up.Put<uint64_t>(0);
    up.PutBytes(bytes.data(), bytes.size());
    EXPECT_EQ(Status(ops::kOpCopyToDevice, up), CUDA_SUCCESS);
    // The staging area, shared as the client library shares it.
    area_bytes_ = kChunk * kSlots;
    int fd = memfd_create("flyt-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(area_bytes_)), 0);
    void* p = mmap(nullptr, area_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(p, MAP_FAILED);
    area_ = static_cast<uint8_t*>(p);
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    uint64_t share_id = 0;
    EXPECT_TRUE(client_->ShareFd(fd, &share_id).ok());
    close(fd);
    wire::Writer w;
    w.Put<uint64_t>(share_id);
    w.Put<uint64_t>(area_bytes_);
    w.Put<uint32_t>(ops::kHostShareStaging);
    w.Put<uint64_t>(reinterpret_cast<uintptr_t>(area_));
    EXPECT_EQ(Status(ops::kOpHostShare, w, &reply), CUDA_SUCCESS);
    if (reply.size() >= 8) std::memcpy(&server_area_, reply.data(), 8);
    return d;
  }

  static wire::Writer CopyReq(uint64_t src, uint64_t n, uint64_t area, uint64_t chunk = kChunk,
                              uint32_t slots = kSlots, bool async = false) {
    wire::Writer w;
    w.Put<uint64_t>(src);
    w.Put<uint64_t>(n);
    w.Put<uint64_t>(0);
    w.Put<uint8_t>(async ? 1 : 0);
    w.Put<uint64_t>(area);
    w.Put<uint64_t>(chunk);
    w.Put<uint32_t>(slots);
    return w;
  }

  // One staged copy as the client library does it, into out[0, n); the call's status.
  // With `ack_hook`, what to ack for chunk i instead of i (-1: hang up instead).
  CUresult Copy(uint64_t src, uint64_t n, uint8_t* out, bool async = false,
                int64_t (*ack_hook)(uint64_t) = nullptr, bool* closed = nullptr) {
    uint64_t id = 0;
    if (closed != nullptr) *closed = false;
    EXPECT_TRUE(SendFrame(ops::kOpCopyFromDeviceStaged,
                          CopyReq(src, n, server_area_, kChunk, kSlots, async), &id));
    const uint64_t chunks = (n + kChunk - 1) / kChunk;
    if (chunks > 1) {
      for (uint64_t i = 0; i < chunks; ++i) {
        ops::StagedNotice notice{};
        if (!client_->Receive(&notice, sizeof(notice)).ok()) {
          if (closed != nullptr) *closed = true;
          return CUDA_ERROR_UNKNOWN;
        }
        EXPECT_EQ(notice.index, i);
        if (notice.status != CUDA_SUCCESS) break;
        const uint64_t off = i * kChunk;
        std::memcpy(out + off, area_ + (i % kSlots) * kChunk, std::min(kChunk, n - off));
        int64_t ack = ack_hook != nullptr ? ack_hook(i) : static_cast<int64_t>(i);
        if (ack < 0) {
          client_->Shutdown();
          if (closed != nullptr) *closed = true;
          return CUDA_ERROR_UNKNOWN;
        }
        uint64_t a = static_cast<uint64_t>(ack);
        iovec iov{&a, sizeof(a)};
        if (!client_->Send(&iov, 1).ok()) {
          if (closed != nullptr) *closed = true;
          return CUDA_ERROR_UNKNOWN;
        }
      }
    }
    CUresult rc = CUDA_ERROR_UNKNOWN;
    if (!ReadReply(id, &rc)) {
      if (closed != nullptr) *closed = true;
      return CUDA_ERROR_UNKNOWN;
    }
    if (rc == CUDA_SUCCESS && chunks == 1) std::memcpy(out, area_, n);
    return rc;
  }
  // The session closes the connection on this request.
  bool Closes(const wire::Writer& w) {
    uint64_t id = 0;
    if (!SendFrame(ops::kOpCopyFromDeviceStaged, w, &id)) return true;
    CUresult rc;
    if (!ReadReply(id, &rc)) return true;
    ADD_FAILURE() << "answered " << rc << " instead of closing";
    return false;
  }
  bool WaitEnded() {
    for (int i = 0; i < 500 && !ended_; ++i) usleep(10000);
    return ended_;
  }

  uint64_t server_area_ = 0;
  uint8_t* area_ = nullptr;
  size_t area_bytes_ = 0;

 private:
  static inline int count_ = 0;
  std::string path_;
  std::unique_ptr<transport::Listener> listener_;
  std::unique_ptr<Connection> client_;
  std::unique_ptr<Session> session_;
  std::thread thread_;
  std::atomic<bool> ended_{false};
  uint64_t next_ = 1;
};

TEST(SessionStagedCopy, OddSizesExact) {
  Served s;
  ASSERT_TRUE(s.ok());
  const size_t n = kChunk * 11 + 123;  // more chunks than slots, and a tail
  const std::vector<uint8_t> want = Pattern(n, 1);
  const uint64_t d = s.Setup(want);
  ASSERT_NE(d, 0u);
  ASSERT_NE(s.server_area_, 0u);
  const size_t sizes[] = {1, 4, 4095, kChunk - 1, kChunk, kChunk + 1, 3 * kChunk, n - 5, n};
  for (size_t size : sizes) {
    for (size_t off : {size_t{0}, size_t{3}}) {
      if (off + size > n) continue;
      for (bool async : {false, true}) {
        std::vector<uint8_t> got(size + 16, 0xee);
        ASSERT_EQ(s.Copy(d + off, size, got.data(), async), CUDA_SUCCESS) << size;
        ASSERT_EQ(std::memcmp(got.data(), want.data() + off, size), 0) << size << " at +" << off;
        for (size_t i = size; i < got.size(); ++i) ASSERT_EQ(got[i], 0xee);
      }
    }
  }
}

TEST(SessionStagedCopy, ErrorsAreTheCopysOwn) {
  Served s;
  ASSERT_TRUE(s.ok());
  const size_t n = kChunk * 5;
  const std::vector<uint8_t> want = Pattern(n, 2);
  const uint64_t d = s.Setup(want);
  std::vector<uint8_t> got(8 * kChunk, 0);
  // A bogus device address: the first chunk's notice says so.
  EXPECT_EQ(s.Copy(0x10, 4 * kChunk, got.data()), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(s.Copy(0x10, 4, got.data()), CUDA_ERROR_INVALID_VALUE);
  // Past the end of the allocation: the first chunks arrive, a later one fails.
  std::fill(got.begin(), got.end(), 0);
  EXPECT_EQ(s.Copy(d + kChunk, 6 * kChunk, got.data()), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(std::memcmp(got.data(), want.data() + kChunk, 4 * kChunk), 0);
  // An area that is not memory this client shared: refused, nothing written there.
  std::vector<uint8_t> elsewhere(4 * kChunk, 0x11);
  for (uint64_t area : {uint64_t{0}, reinterpret_cast<uint64_t>(elsewhere.data()),
                        s.server_area_ + 2 * kChunk + 1}) {
    for (uint64_t size : {uint64_t{16}, 3 * kChunk}) {
      uint64_t id = 0;
      ASSERT_TRUE(s.SendFrame(ops::kOpCopyFromDeviceStaged, Served::CopyReq(d, size, area), &id));
      if (size > kChunk) {
        ops::StagedNotice notice{};
        ASSERT_TRUE(s.client()->Receive(&notice, sizeof(notice)).ok());
        EXPECT_EQ(notice.index, 0u);
        EXPECT_EQ(notice.status, static_cast<uint32_t>(CUDA_ERROR_INVALID_VALUE));
      }
      CUresult rc = CUDA_SUCCESS;
      ASSERT_TRUE(s.ReadReply(id, &rc));
      EXPECT_EQ(rc, CUDA_ERROR_INVALID_VALUE);
    }
  }
  for (uint8_t b : elsewhere) ASSERT_EQ(b, 0x11);
  // The session still works.
  std::fill(got.begin(), got.end(), 0);
  EXPECT_EQ(s.Copy(d, n, got.data()), CUDA_SUCCESS);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n), 0);
}

TEST(SessionStagedCopy, MalformedRequestsEndTheSession) {
  const std::vector<uint8_t> want = Pattern(kChunk * 4, 3);
  for (int k = 0; k < 5; ++k) {
    Served s;
    ASSERT_TRUE(s.ok());
    const uint64_t d = s.Setup(want);
    wire::Writer w;
    switch (k) {
      case 0:
        w = Served::CopyReq(d, kChunk * 2, s.server_area_, kChunk, 0);
        break;  // no slots
      case 1:
        w = Served::CopyReq(d, kChunk * 2, s.server_area_, kChunk, 17);
        break;  // too many
      case 2:
        w = Served::CopyReq(d, kChunk * 2, s.server_area_, 0);
        break;  // no chunk
      case 3:
        w = Served::CopyReq(d, 0, s.server_area_);
        break;  // no bytes
      default:
        w = Served::CopyReq(d, kChunk, s.server_area_);
        w.Put<uint8_t>(0);  // trailing garbage
        break;
    }
    EXPECT_TRUE(s.Closes(w)) << "case " << k;
    EXPECT_TRUE(s.WaitEnded()) << "case " << k;
  }
}

int64_t AckTwice(uint64_t i) { return i == 1 ? 0 : static_cast<int64_t>(i); }
int64_t HangUpAtTwo(uint64_t i) { return i == 2 ? -1 : static_cast<int64_t>(i); }

TEST(SessionStagedCopy, AckOutOfOrderEndsTheSession) {
  Served s;
  ASSERT_TRUE(s.ok());
  const std::vector<uint8_t> want = Pattern(kChunk * 8, 4);
  const uint64_t d = s.Setup(want);
  std::vector<uint8_t> got(want.size());
  bool closed = false;
  s.Copy(d, want.size(), got.data(), false, AckTwice, &closed);
  EXPECT_TRUE(closed);
  EXPECT_TRUE(s.WaitEnded());
}

TEST(SessionStagedCopy, ClientLeavingMidCopyEndsTheSession) {
  Served s;
  ASSERT_TRUE(s.ok());
  const std::vector<uint8_t> want = Pattern(kChunk * 10, 5);
  const uint64_t d = s.Setup(want);
  std::vector<uint8_t> got(want.size());
  bool closed = false;
  s.Copy(d, want.size(), got.data(), true, HangUpAtTwo, &closed);
  EXPECT_TRUE(closed);
  EXPECT_TRUE(s.WaitEnded()) << "the session did not notice its client left";
}

}  // namespace
}  // namespace flyt::server
