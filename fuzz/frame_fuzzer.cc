// libFuzzer target for flyt-server's decoder: a session of the sim backend (as
// a worker runs it after the main process's handshake) is fed the fuzzer's
// bytes as the client's stream. The connection offers one-sided access to a
// fake client memory (as ucx:// does), so that the one-sided copies' requests
// are decoded and checked too; an input that starts with "RMA!" gets a
// prologue first (a context, a device allocation, the attach and one
// registered buffer), so that the fuzzer reaches the copies at once.
// Any crash, hang, leak or sanitizer report is a bug in the server's handling
// of hostile frames.
#include <cstdint>
#include <cstring>
#include <vector>

#include "protocol/ops.h"
#include "protocol/wire.h"
#include "server/session.h"
#include "server/tenant_board.h"

namespace {

// The client memory the fake one-sided access reaches: reads and writes elsewhere
// fail, as a real transport's do for memory the client did not register.
constexpr uint64_t kFakeBase = 0x7e0000000000ull;
constexpr size_t kFakeBytes = 1 << 20;

class FakeRemoteMemory final : public flyt::transport::RemoteMemory {
 public:
  flyt::Status LocalAddress(std::vector<uint8_t>*) override { return Refused(); }
  flyt::Status Expose(void*, size_t, std::vector<uint8_t>*, uint64_t*) override {
    return Refused();
  }
  void Withdraw(uint64_t) override {}
  flyt::Status Connect(const void*, size_t n) override {
    if (n == 0 || n > 65536 || connected_) return Refused();
    connected_ = true;
    return flyt::Status::Ok();
  }
  flyt::Status ImportKey(const void*, size_t n, uint64_t* id) override {
    if (!connected_ || n == 0) return Refused();
    *id = ++next_;
    return flyt::Status::Ok();
  }
  void DropKey(uint64_t) override {}
  flyt::Status RegisterLocal(void*, size_t, bool, uint64_t* handle) override {
    *handle = ++next_;
    return flyt::Status::Ok();
  }
  void UnregisterLocal(uint64_t) override {}
  flyt::Status Read(void* local, size_t n, uint64_t remote, uint64_t id, bool) override {
    if (!Inside(remote, n, id)) return Refused();
    std::memcpy(local, memory_.data() + (remote - kFakeBase), n);
    return flyt::Status::Ok();
  }
  flyt::Status Write(const void* local, size_t n, uint64_t remote, uint64_t id, bool) override {
    if (!Inside(remote, n, id)) return Refused();
    std::memcpy(memory_.data() + (remote - kFakeBase), local, n);
    return flyt::Status::Ok();
  }
  bool DeviceMemory() const override { return false; }
  std::string Describe() const override { return "fake one-sided access"; }

 private:
  static flyt::Status Refused() { return flyt::Status::Error("refused"); }
  bool Inside(uint64_t remote, size_t n, uint64_t id) const {
    return id != 0 && id <= next_ && remote >= kFakeBase && remote - kFakeBase <= kFakeBytes &&
           n <= kFakeBytes - (remote - kFakeBase);
  }
  bool connected_ = false;
  uint64_t next_ = 0;
  std::vector<uint8_t> memory_ = std::vector<uint8_t>(kFakeBytes, 0x5a);
};

class ScriptedConnection final : public flyt::transport::Connection {
 public:
  explicit ScriptedConnection(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  flyt::transport::RemoteMemory* Rma() override { return &rma_; }
  flyt::Status Send(const iovec*, int) override { return flyt::Status::Ok(); }
  flyt::Status Receive(void* dst, size_t n) override {
    if (n > bytes_.size() - off_) return flyt::Status::Error("end of input");
    std::memcpy(dst, bytes_.data() + off_, n);
    off_ += n;
    return flyt::Status::Ok();
  }
  void Shutdown() override {}
  void AbandonAfterFork() override {}
  void SetReceiveTimeout(int) override {}
  std::string Peer() const override { return "fuzzer"; }

 private:
  std::vector<uint8_t> bytes_;
  size_t off_ = 0;
  FakeRemoteMemory rma_;
};

// Appends one request frame (wanting a reply) to `out`.
void Frame(std::vector<uint8_t>* out, uint16_t op, const flyt::wire::Writer& w) {
  flyt::wire::FrameHeader h{flyt::wire::kMagic,
                            op,
                            flyt::wire::kFlagWantReply,
                            1,
                            static_cast<uint32_t>(w.size()),
                            0,
                            0,
                            0};
  const auto* hb = reinterpret_cast<const uint8_t*>(&h);
  out->insert(out->end(), hb, hb + sizeof(h));
  out->insert(out->end(), w.data(), w.data() + w.size());
}

// A context, 1 MiB of device memory, the one-sided attach and the fake client memory
// registered: what a ucx:// client does before its first one-sided copy.
std::vector<uint8_t> RmaPrologue() {
  std::vector<uint8_t> out;
  flyt::wire::Writer retain;
  retain.Put<int32_t>(0);
  Frame(&out, flyt::ops::kOpPrimaryCtxRetain, retain);
  flyt::wire::Writer alloc;
  alloc.Put<uint8_t>(1);
  alloc.Put<uint64_t>(1 << 20);
  Frame(&out, 150, alloc);  // cuMemAlloc_v2
  flyt::wire::Writer attach;
  attach.PutBlob("a", 1);
  Frame(&out, flyt::ops::kOpRmaAttach, attach);
  flyt::wire::Writer reg;
  reg.Put<uint64_t>(kFakeBase);
  reg.Put<uint64_t>(kFakeBytes);
  reg.PutBlob("k", 1);
  Frame(&out, flyt::ops::kOpRmaRegister, reg);
  return out;
}

flyt::server::ServerState* State() {
  static flyt::server::ServerState* state = [] {
    auto* s = new flyt::server::ServerState();
    flyt::server::SimOptions sim;
    sim.memory_bytes = 64ull << 20;
    flyt::server::LoadSimDriver(sim, &s->api);
    flyt::server::DescribeDevices(s);
    static std::unique_ptr<flyt::server::TenantBoard> board;
    if (flyt::server::TenantBoard::Create(&board).ok()) {
      s->board = board.get();
      s->slot = &board->layout().slots[0];
      s->share.UseCounters(&board->layout().memory_used, &board->layout().memory_quota,
                           board->layout().memory_used_dev);
    }
    return s;
  }();
  return state;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> stream;
  if (size >= 4 && std::memcmp(data, "RMA!", 4) == 0) {
    stream = RmaPrologue();
    data += 4;
    size -= 4;
  }
  stream.insert(stream.end(), data, data + size);
  flyt::server::channel::Ticket ticket;
  ticket.session = 1;
  ticket.client_pid = 1;
  flyt::server::Session session(State(), std::make_unique<ScriptedConnection>(std::move(stream)),
                                ticket);
  session.Run();
  return 0;
}
