// flyt-server's control socket (docs/control_plane.md, "flyt-server control
// socket"): length-prefixed JSON requests without a handshake, on a Unix
// socket only its owner may open.
//
// Owns: the verbs `stats` (sessions, memory use and quota, SM share and how it
// is enforced, calls, idle time, bound addresses) and `set-share` (a live
// change of the SM count and memory quota, with the pause it took), and the
// socket file's life (made 0600, a stale one replaced, removed at exit).
// Must not execute CUDA calls of sessions: changes go through Share.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "control/channel.h"
#include "server/session.h"

namespace flyt::server {

class ControlSocket {
 public:
  // `address` must be unix:///PATH.
  static Status Start(const std::string& address, ServerState* state,
                      std::unique_ptr<ControlSocket>* out);
  ~ControlSocket();
  const std::string& path() const { return path_; }
  std::string Describe() const;

 private:
  ControlSocket() = default;
  std::string path_;
  std::unique_ptr<control::Listener> listener_;
};

// Answers one control request (exposed for tests).
nlohmann::json HandleControlRequest(ServerState* state, const nlohmann::json& request);

// Parses a byte count: digits, optionally followed by K, M, G or T (binary
// multiples). False when malformed or out of range.
bool ParseByteCount(const std::string& text, uint64_t* out);

}  // namespace flyt::server
