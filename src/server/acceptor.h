// flyt-server's front door, in its main process.
//
// Accepts connections on every listener, reads each one's first frame and
// either (hello) checks the protocol version and the tenant's token, answers
// with the device inventory as the tenant's share shows it, and hands the
// connection to a worker (server/worker_pool.h), which talks to the client
// directly from then on; or (a client's second, callback channel) checks the
// session's secret and hands the connection to the worker of that session.
// A connection whose client leaves right after the hello (it moved to shared
// memory) never takes a worker.
// On tls:// listeners the TLS handshake comes first, here too (the worker continues the
// encrypted connection). Owns: the handshake, session ids and secrets. Must not execute CUDA calls
// or read anything after the first frame.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "server/session.h"
#include "server/worker_pool.h"
#include "transport/emulated_transport.h"
#include "transport/tls_server.h"
#include "transport/transport.h"

namespace flyt::server {

class Acceptor {
 public:
  Acceptor(ServerState* state, WorkerPool* pool, const transport::EmulationSettings& emulate)
      : state_(state), pool_(pool), emulate_(emulate) {}
  // Accepts on `listener` until it fails; one thread per connection. With `tls`, each
  // connection first completes a TLS handshake (transport/tls_server.h).
  void Run(transport::Listener* listener, const transport::TlsServerContext* tls = nullptr);

 private:
  void Handle(std::unique_ptr<transport::Connection> conn);
  void Hello(std::unique_ptr<transport::Connection> conn, const wire::FrameHeader& h,
             const std::vector<uint8_t>& payload);
  void Callback(std::unique_ptr<transport::Connection> conn, const wire::FrameHeader& h,
                const std::vector<uint8_t>& payload);
  // ops::kOpResume (a client continues its moved session here) and
  // ops::kOpRestoreSession (a server moves a session here).
  void Moved(std::unique_ptr<transport::Connection> conn, const wire::FrameHeader& h,
             const std::vector<uint8_t>& payload);
  // Why the handshake's version or token is refused (empty: accepted).
  std::string Refusal(const wire::HelloRequest& req, const uint8_t* token) const;
  // The device inventory and the shm offer, as a welcome ends.
  void PutWelcome(wire::Writer& out) const;
  static bool Reply(transport::Connection* conn, const wire::FrameHeader& req, CUresult rc,
                    const wire::Writer& out);

  ServerState* state_;
  WorkerPool* pool_;
  transport::EmulationSettings emulate_;
  std::atomic<uint64_t> next_session_{1};
};

}  // namespace flyt::server
