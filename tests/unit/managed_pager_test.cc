// server/managed_pager.h against hostile and ordinary requests on a real Unix
// socket: fetches and pushes inside the session's managed ranges work, anything
// outside them is refused without touching memory, malformed frames end the
// channel, and a page that faults during a copy is an error, not a crash. No
// driver: without a context the pager copies with the CPU.
#include "server/managed_pager.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "protocol/codec.h"
#include "protocol/ops.h"
#include "protocol/wire.h"

namespace flyt::server {
namespace {

class ManagedPagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mem_ = static_cast<uint8_t*>(
        mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(mem_, MAP_FAILED);
    for (size_t i = 0; i < kSize; ++i) mem_[i] = static_cast<uint8_t>(i * 7);
    base_ = reinterpret_cast<uint64_t>(mem_);
    pager_.Add(base_, kSize);
    const std::string path = "/tmp/flyt-pager-test-" + std::to_string(getpid()) + ".sock";
    transport::Address addr;
    ASSERT_TRUE(transport::ParseAddress("unix://" + path, &addr).ok());
    std::unique_ptr<transport::Listener> listener;
    ASSERT_TRUE(transport::Listen(addr, &listener).ok());
    ASSERT_TRUE(transport::Dial(addr, transport::Liveness{}, &client_).ok());
    std::unique_ptr<transport::Connection> server;
    ASSERT_TRUE(listener->Accept(&server).ok());
    unlink(path.c_str());
    pager_.Attach(std::move(server), &api_, nullptr);  // no context: CPU copies
  }
  void TearDown() override {
    pager_.Stop();
    if (mem_ != nullptr) munmap(mem_, kSize);
  }
  // Sends one request; false when the channel was closed instead of answered.
  bool Exchange(uint16_t op, const wire::Writer& w, CUresult* rc, std::vector<uint8_t>* out) {
    wire::FrameHeader h{
        wire::kMagic, op, wire::kFlagWantReply, ++call_, static_cast<uint32_t>(w.size()), 0, 0, 0};
    iovec iov[2] = {{&h, sizeof(h)}, {const_cast<uint8_t*>(w.data()), w.size()}};
    if (!client_->Send(iov, 2).ok()) return false;
    wire::FrameHeader rep{};
    if (!client_->Receive(&rep, sizeof(rep)).ok()) return false;
    EXPECT_EQ(rep.call_id, h.call_id);
    *rc = static_cast<CUresult>(rep.status);
    out->resize(rep.payload_len);
    return rep.payload_len == 0 || client_->Receive(out->data(), out->size()).ok();
  }
  CUresult Fetch(uint64_t addr, uint32_t len, std::vector<uint8_t>* out, bool* open) {
    wire::Writer w;
    w.Put<uint64_t>(addr);
    w.Put<uint32_t>(len);
    w.Put<uint8_t>(0);
    CUresult rc = CUDA_ERROR_UNKNOWN;
    *open = Exchange(ops::kOpManagedFetch, w, &rc, out);
    return rc;
  }

  static constexpr size_t kSize = 64 * 1024;
  DriverApi api_{};
  ManagedPager pager_;
  uint8_t* mem_ = nullptr;
  uint64_t base_ = 0;
  uint64_t call_ = 0;
  std::unique_ptr<transport::Connection> client_;
};

TEST_F(ManagedPagerTest, FetchReturnsTheBytesOfTheRange) {
  std::vector<uint8_t> got;
  bool open = false;
  ASSERT_EQ(Fetch(base_ + 4096, 8192, &got, &open), CUDA_SUCCESS);
  ASSERT_TRUE(open);
  ASSERT_EQ(got.size(), 8192u);
  EXPECT_EQ(std::memcmp(got.data(), mem_ + 4096, 8192), 0);
}

TEST_F(ManagedPagerTest, RequestsOutsideTheRangesAreRefusedAndTheChannelLives) {
  std::vector<uint8_t> got;
  bool open = false;
  EXPECT_EQ(Fetch(base_ + kSize - 16, 32, &got, &open), CUDA_ERROR_INVALID_VALUE);  // straddles
  EXPECT_TRUE(open);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(Fetch(0x1000, 16, &got, &open), CUDA_ERROR_INVALID_VALUE);  // not managed
  EXPECT_EQ(Fetch(base_, 16, &got, &open), CUDA_SUCCESS);               // still served
  pager_.Remove(base_);
  EXPECT_EQ(Fetch(base_, 16, &got, &open), CUDA_ERROR_INVALID_VALUE);  // freed
  EXPECT_TRUE(open);
}

TEST_F(ManagedPagerTest, PushWritesRunsAllOrNothing) {
  wire::Writer w;
  w.Put<uint32_t>(2);
  w.Put<uint8_t>(0);
  w.Put<uint64_t>(base_ + 100);
  w.Put<uint32_t>(3);
  w.Put<uint64_t>(base_ + 5000);
  w.Put<uint32_t>(2);
  const uint8_t bytes[5] = {1, 2, 3, 4, 5};
  w.PutBytes(bytes, sizeof(bytes));
  CUresult rc = CUDA_ERROR_UNKNOWN;
  std::vector<uint8_t> out;
  ASSERT_TRUE(Exchange(ops::kOpManagedPush, w, &rc, &out));
  EXPECT_EQ(rc, CUDA_SUCCESS);
  EXPECT_EQ(mem_[100], 1);
  EXPECT_EQ(mem_[102], 3);
  EXPECT_EQ(mem_[5000], 4);
  EXPECT_EQ(mem_[5001], 5);

  // One run outside: nothing is written, not even the valid run before it.
  const uint8_t before = mem_[200];
  wire::Writer bad;
  bad.Put<uint32_t>(2);
  bad.Put<uint8_t>(0);
  bad.Put<uint64_t>(base_ + 200);
  bad.Put<uint32_t>(1);
  bad.Put<uint64_t>(base_ + kSize);
  bad.Put<uint32_t>(1);
  bad.PutBytes(bytes, 2);
  ASSERT_TRUE(Exchange(ops::kOpManagedPush, bad, &rc, &out));
  EXPECT_EQ(rc, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(mem_[200], before);
}

// Pinned host memory mapped for a client over a socket (kOpHostMap) is a host range:
// its pages are this process's own, copied by the CPU even when the pager has a DMA path;
// a second Remove of it finds nothing (the session counts its bytes by that answer).
TEST_F(ManagedPagerTest, HostRangesAreServedAndForgottenOnce) {
  EXPECT_TRUE(pager_.Remove(base_));
  EXPECT_FALSE(pager_.Remove(base_));
  pager_.Add(base_, kSize, 0, /*host=*/true);
  wire::Writer w;
  w.Put<uint32_t>(1);
  w.Put<uint8_t>(0);
  w.Put<uint64_t>(base_ + 4097);
  w.Put<uint32_t>(3);
  const uint8_t bytes[3] = {9, 8, 7};
  w.PutBytes(bytes, sizeof(bytes));
  CUresult rc = CUDA_ERROR_UNKNOWN;
  std::vector<uint8_t> out;
  ASSERT_TRUE(Exchange(ops::kOpManagedPush, w, &rc, &out));
  EXPECT_EQ(rc, CUDA_SUCCESS);
  EXPECT_EQ(mem_[4097], 9);
  EXPECT_EQ(mem_[4099], 7);
  std::vector<uint8_t> got;
  bool open = false;
  ASSERT_EQ(Fetch(base_ + 4096, 8, &got, &open), CUDA_SUCCESS);
  ASSERT_EQ(got.size(), 8u);
  EXPECT_EQ(got[1], 9);
  EXPECT_EQ(got[0], static_cast<uint8_t>(4096 * 7));
  EXPECT_TRUE(pager_.Remove(base_));
  EXPECT_EQ(Fetch(base_, 16, &got, &open), CUDA_ERROR_INVALID_VALUE);
  EXPECT_TRUE(open);
}

TEST_F(ManagedPagerTest, APushWithFewerBytesThanItsRunsEndsTheChannel) {
  wire::Writer w;
  w.Put<uint32_t>(1);
  w.Put<uint8_t>(0);
  w.Put<uint64_t>(base_);
  w.Put<uint32_t>(100);
  w.PutBytes("abc", 3);
  CUresult rc = CUDA_ERROR_UNKNOWN;
  std::vector<uint8_t> out;
  EXPECT_FALSE(Exchange(ops::kOpManagedPush, w, &rc, &out));
}

TEST_F(ManagedPagerTest, HostileCountsAndUnknownOpsEndTheChannel) {
  wire::Writer w;
  w.Put<uint32_t>(0xffffffffu);  // more runs than the payload could hold
  w.Put<uint8_t>(0);
  CUresult rc = CUDA_ERROR_UNKNOWN;
  std::vector<uint8_t> out;
  EXPECT_FALSE(Exchange(ops::kOpManagedPush, w, &rc, &out));
}

TEST_F(ManagedPagerTest, AnUnknownOpEndsTheChannel) {
  wire::Writer w;
  w.Put<uint64_t>(0);
  CUresult rc = CUDA_ERROR_UNKNOWN;
  std::vector<uint8_t> out;
  EXPECT_FALSE(Exchange(ops::kOpLaunch, w, &rc, &out));
}

TEST_F(ManagedPagerTest, APageThatFaultsIsAnErrorNotACrash) {
  // The driver took the memory away under the table (a failed GPU, say).
  ASSERT_EQ(mprotect(mem_, 4096, PROT_NONE), 0);
  std::vector<uint8_t> got;
  bool open = false;
  EXPECT_EQ(Fetch(base_, 64, &got, &open), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_TRUE(open);
  EXPECT_EQ(Fetch(base_ + 4096, 64, &got, &open), CUDA_SUCCESS);  // the rest still works
  ASSERT_EQ(mprotect(mem_, 4096, PROT_READ | PROT_WRITE), 0);
}

TEST_F(ManagedPagerTest, SharingNeedsASharedMemoryChannel) {
  wire::Writer w;
  w.Put<uint64_t>(1);
  w.Put<uint64_t>(base_);
  w.Put<uint64_t>(kSize);
  CUresult rc = CUDA_ERROR_UNKNOWN;
  std::vector<uint8_t> out;
  ASSERT_TRUE(Exchange(ops::kOpManagedShare, w, &rc, &out));
  EXPECT_EQ(rc, CUDA_ERROR_NOT_SUPPORTED);
  // A shared fetch of a range the server has not mapped is refused.
  wire::Writer f;
  f.Put<uint64_t>(base_);
  f.Put<uint32_t>(16);
  f.Put<uint8_t>(1);
  ASSERT_TRUE(Exchange(ops::kOpManagedFetch, f, &rc, &out));
  EXPECT_EQ(rc, CUDA_ERROR_INVALID_VALUE);
}

}  // namespace
}  // namespace flyt::server
