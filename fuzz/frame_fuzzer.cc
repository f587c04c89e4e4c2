// libFuzzer target for flyt-server's decoder: a session of the sim backend is
// fed a valid handshake followed by the fuzzer's bytes as the client's stream.
// Any crash, hang, leak or sanitizer report is a bug in the server's handling
// of hostile frames.
#include <cstdint>
#include <cstring>
#include <vector>

#include "protocol/ops.h"
#include "protocol/wire.h"
#include "server/session.h"

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
    return s;
  }();
  return state;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> stream;
  flyt::wire::HelloRequest hello{flyt::wire::kProtocolVersion, 13000, 1, 0};
  flyt::wire::FrameHeader h{flyt::wire::kMagic,
                            flyt::ops::kOpHello,
                            flyt::wire::kFlagWantReply,
                            1,
                            sizeof(hello),
                            0,
                            0,
                            0};
  stream.insert(stream.end(), reinterpret_cast<uint8_t*>(&h), reinterpret_cast<uint8_t*>(&h + 1));
  stream.insert(stream.end(), reinterpret_cast<uint8_t*>(&hello),
                reinterpret_cast<uint8_t*>(&hello + 1));
  stream.insert(stream.end(), data, data + size);
  flyt::server::Session session(State(), std::make_unique<ScriptedConnection>(std::move(stream)));
  session.Run();
  return 0;
}
