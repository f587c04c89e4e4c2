// libFuzzer target for flyt-server's decoder: a session of the sim backend (as
// a worker runs it after the main process's handshake) is fed the fuzzer's
// bytes as the client's stream.
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

class ScriptedConnection final : public flyt::transport::Connection {
 public:
  explicit ScriptedConnection(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
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
};

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
      s->share.UseCounters(&board->layout().memory_used, &board->layout().memory_quota);
    }
    return s;
  }();
  return state;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> stream(data, data + size);
  flyt::server::channel::Ticket ticket;
  ticket.session = 1;
  ticket.client_pid = 1;
  flyt::server::Session session(State(), std::make_unique<ScriptedConnection>(std::move(stream)),
                                ticket);
  session.Run();
  return 0;
}
