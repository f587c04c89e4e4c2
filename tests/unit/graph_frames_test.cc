// Tests for server/session_graph_nodes.cc at the frame level: a session of the
// sim backend is fed requests of kOpGraphNode / kOpGraphNodeQuery / kOpGraphMisc
// as a client would send them, and hostile ones (bogus handles, absurd sizes,
// truncated descriptions). Good requests work, bad ones get a clear error or end
// the session, and nothing crashes.
//
// Owns: nothing but these tests.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "protocol/ops.h"
#include "protocol/wire.h"
#include "server/session.h"
#include "server/tenant_board.h"
#include "sim_server_state.h"

namespace flyt::server {
namespace {

struct Reply {
  uint16_t op;
  uint32_t status;
  std::vector<uint8_t> payload;
};

// Plays the client: hands the session the frames queued so far, collects the
// replies, and after the k-th reply runs the k-th step, which may queue more.
class Conversation final : public transport::Connection {
 public:
  using Step = std::function<void(const std::vector<Reply>&)>;
  Conversation(std::vector<uint8_t>* in, std::vector<Step>* steps, std::vector<Reply>* replies)
      : in_(in), steps_(steps), replies_(replies) {}
  Status Send(const iovec* iov, int n) override {
    for (int i = 0; i < n; ++i) {
      const auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
      out_.insert(out_.end(), p, p + iov[i].iov_len);
    }
    while (out_.size() >= sizeof(wire::FrameHeader)) {
      wire::FrameHeader h{};
      std::memcpy(&h, out_.data(), sizeof(h));
      if (out_.size() - sizeof(h) < h.payload_len) break;
      Reply r{h.op, h.status, {out_.begin() + sizeof(h), out_.begin() + sizeof(h) + h.payload_len}};
      out_.erase(out_.begin(), out_.begin() + sizeof(h) + h.payload_len);
      if (h.op == ops::kOpDeviceOutput) continue;
      replies_->push_back(std::move(r));
      size_t k = replies_->size() - 1;
      if (k < steps_->size()) (*steps_)[k](*replies_);
    }
    return Status::Ok();
  }
  Status Receive(void* dst, size_t n) override {
    if (n > in_->size() - off_) return Status::Error("end of input");
    std::memcpy(dst, in_->data() + off_, n);
    off_ += n;
    return Status::Ok();
  }
  void Shutdown() override {}
  void AbandonAfterFork() override {}
  void SetReceiveTimeout(int) override {}
  std::string Peer() const override { return "test"; }

 private:
  std::vector<uint8_t>* in_;
  size_t off_ = 0;
  std::vector<uint8_t> out_;
  std::vector<Step>* steps_;
  std::vector<Reply>* replies_;
};

ServerState* State() { return SimServerState(64ull << 20); }

class Script {
 public:
  void Frame(uint16_t op, const wire::Writer& w) {
    wire::FrameHeader h{};
    h.magic = wire::kMagic;
    h.op = op;
    h.flags = wire::kFlagWantReply;
    h.call_id = ++calls_;
    h.payload_len = static_cast<uint32_t>(w.size());
    const auto* p = reinterpret_cast<const uint8_t*>(&h);
    bytes_.insert(bytes_.end(), p, p + sizeof(h));
    bytes_.insert(bytes_.end(), w.data(), w.data() + w.size());
  }
  // What to send after the next reply (in order of the replies).
  void Then(Conversation::Step step) { steps_.push_back(std::move(step)); }
  // Runs a session over the frames; the replies in order.
  std::vector<Reply> Run() {
    std::vector<Reply> replies;
    channel::Ticket ticket;
    ticket.session = 1;
    ticket.client_pid = 1;
    Session session(State(), std::make_unique<Conversation>(&bytes_, &steps_, &replies), ticket);
    session.Run();
    return replies;
  }

 private:
  std::vector<uint8_t> bytes_;
  std::vector<Conversation::Step> steps_;
  uint64_t calls_ = 0;
};

uint64_t U64(const Reply& r, size_t at = 0) {
  uint64_t v = 0;
  if (r.payload.size() >= at + 8) std::memcpy(&v, r.payload.data() + at, 8);
  return v;
}

// cuGraphCreate (generic op 225): out present, flags 0.
wire::Writer GraphCreate() {
  wire::Writer w;
  w.Put<uint8_t>(1);
  w.Put<uint32_t>(0);
  return w;
}

wire::Writer AddHead(uint64_t graph) {
  wire::Writer w;
  w.Put<uint8_t>(ops::kGraphNodeAdd);
  w.Put<uint64_t>(graph);
  w.Put<uint64_t>(0);
  w.Put<uint32_t>(0);  // no dependencies
  return w;
}

TEST(GraphFrames, BogusGraphsNodesAndHandlesGetErrors) {
  Script s;
  wire::Writer empty = AddHead(0xdead0000);  // a graph the session does not have
  empty.Put<uint32_t>(CU_GRAPH_NODE_TYPE_EMPTY);
  s.Frame(ops::kOpGraphNode, empty);
  wire::Writer q;
  q.Put<uint64_t>(0xbeef0000);  // a node the session does not have
  s.Frame(ops::kOpGraphNodeQuery, q);
  wire::Writer clone;
  clone.Put<uint8_t>(ops::kGraphMiscClone);
  clone.Put<uint64_t>(0x1234);
  s.Frame(ops::kOpGraphMisc, clone);
  auto replies = s.Run();
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(replies[0].status, CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(replies[1].status, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(replies[2].status, CUDA_ERROR_INVALID_VALUE);
}

TEST(GraphFrames, HostileNodeDescriptionsAreRefused) {
  // Each request names a graph the session made (its handle from the first reply).
  Script s;
  s.Frame(225, GraphCreate());
  s.Then([&](const std::vector<Reply>& r) {
    uint64_t g = U64(r[0]);
    // A memcpy whose dimensions overflow 64 bits, from client memory.
    wire::Writer copy = AddHead(g);
    copy.Put<uint32_t>(CU_GRAPH_NODE_TYPE_MEMCPY);
    CUDA_MEMCPY3D m{};
    m.srcMemoryType = CU_MEMORYTYPE_HOST;
    m.srcHost = reinterpret_cast<void*>(0x1000);
    m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    m.WidthInBytes = (1ull << 40) + 1;
    m.Height = 1ull << 24;
    m.Depth = 1;
    copy.Put(m);
    copy.Put<uint64_t>(0);
    copy.Put<uint8_t>(1);
    copy.Put<uint8_t>(0);
    s.Frame(ops::kOpGraphNode, copy);
    // Host memory of the server's own process.
    wire::Writer own = AddHead(g);
    own.Put<uint32_t>(CU_GRAPH_NODE_TYPE_MEMCPY);
    m.WidthInBytes = 64;
    m.Height = 1;
    own.Put(m);
    own.Put<uint64_t>(0);
    own.Put<uint8_t>(0);
    own.Put<uint8_t>(0);
    s.Frame(ops::kOpGraphNode, own);
    // A conditional node with a handle nobody created and too many bodies.
    wire::Writer cond = AddHead(g);
    cond.Put<uint32_t>(CU_GRAPH_NODE_TYPE_CONDITIONAL);
    cond.Put<uint64_t>(0x42);
    cond.Put<uint32_t>(CU_GRAPH_COND_TYPE_SWITCH);
    cond.Put<uint32_t>(1u << 30);
    cond.Put<uint64_t>(0);
    s.Frame(ops::kOpGraphNode, cond);
    // An unknown node type.
    wire::Writer odd = AddHead(g);
    odd.Put<uint32_t>(0x7777);
    s.Frame(ops::kOpGraphNode, odd);
    // A truncated description ends the session (no reply).
    wire::Writer cut = AddHead(g);
    cut.Put<uint32_t>(CU_GRAPH_NODE_TYPE_MEMCPY);
    cut.Put<uint32_t>(7);
    s.Frame(ops::kOpGraphNode, cut);
    wire::Writer after = AddHead(g);
    after.Put<uint32_t>(CU_GRAPH_NODE_TYPE_EMPTY);
    s.Frame(ops::kOpGraphNode, after);
  });
  auto replies = s.Run();
  ASSERT_EQ(replies.size(), 5u);  // none for the truncated frame nor after it
  EXPECT_EQ(replies[0].status, CUDA_SUCCESS);
  EXPECT_EQ(replies[1].status, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(replies[2].status, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(replies[3].status, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(replies[4].status, CUDA_ERROR_NOT_SUPPORTED);
}

TEST(GraphFrames, AGraphTakesNodesAndAnswersQueries) {
  // The graph's handle comes in the first reply; the next requests use it.
  Script s;
  s.Frame(225, GraphCreate());
  s.Then([&](const std::vector<Reply>& r) {
    uint64_t g = U64(r[0]);
    wire::Writer empty = AddHead(g);
    empty.Put<uint32_t>(CU_GRAPH_NODE_TYPE_EMPTY);
    s.Frame(ops::kOpGraphNode, empty);
    wire::Writer handle;
    handle.Put<uint8_t>(ops::kGraphMiscCondHandle);
    handle.Put<uint64_t>(g);
    handle.Put<uint64_t>(0);
    handle.Put<uint32_t>(1);
    handle.Put<uint32_t>(0);
    s.Frame(ops::kOpGraphMisc, handle);
    wire::Writer attr;
    attr.Put<uint8_t>(ops::kGraphMiscMemAttrGet);
    attr.Put<int32_t>(0);
    attr.Put<int32_t>(99);  // no such attribute
    s.Frame(ops::kOpGraphMisc, attr);
  });
  s.Then([&](const std::vector<Reply>& r) {  // query the empty node
    wire::Writer q;
    q.Put<uint64_t>(U64(r[1]));
    s.Frame(ops::kOpGraphNodeQuery, q);
  });
  s.Then([](const std::vector<Reply>&) {});
  s.Then([](const std::vector<Reply>&) {});
  auto replies = s.Run();
  ASSERT_EQ(replies.size(), 5u);
  EXPECT_EQ(replies[0].status, CUDA_SUCCESS);
  EXPECT_EQ(replies[1].status, CUDA_SUCCESS);
  EXPECT_NE(U64(replies[1]), 0u);
  EXPECT_EQ(replies[2].status, CUDA_SUCCESS);
  EXPECT_NE(U64(replies[2]), 0u);
  EXPECT_EQ(replies[3].status, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(replies[4].status, CUDA_SUCCESS);
  uint32_t type = 0;
  ASSERT_GE(replies[4].payload.size(), 4u);
  std::memcpy(&type, replies[4].payload.data(), 4);
  EXPECT_EQ(type, static_cast<uint32_t>(CU_GRAPH_NODE_TYPE_EMPTY));
}

}  // namespace
}  // namespace flyt::server
