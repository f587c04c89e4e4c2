// Control-plane messaging: authenticated request/answer channels between the
// Flyt daemons (cluster manager, node managers, client managers, flytctl) and
// the plain channel to a flyt-server's control socket.
//
// Owns: message framing (4-byte little-endian length + one JSON object, at most
// kMaxMessage bytes), the HMAC-SHA256 mutual handshake described in
// docs/control_plane.md, request ids, and the accept loop of a control listener
// (one thread per connection). Must not know what any verb means: the daemons
// own their verbs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "control/tls.h"
#include "transport/transport.h"

namespace flyt::control {

using Json = nlohmann::json;

inline constexpr uint32_t kMaxMessage = 16u << 20;

// Shared secret of a cluster. Empty secret = no handshake (Unix control sockets).
struct Credentials {
  std::string secret;
  // Mutual TLS (control/tls.h), when the daemon was given tls_ca/tls_cert/tls_key.
  std::shared_ptr<TlsContext> tls_server = nullptr, tls_client = nullptr;
};

// Makes the TLS contexts of `files` when TLS is enabled (tls_ca set).
Status LoadTls(const TlsFiles& files, Credentials* out);

// Resolves the secret: `secret` when not empty, else $FLYT_SECRET, else the
// contents of `secret_file`. When the file is missing and `create` is set, writes a new
// random secret there (mode 0600, parent folders created).
Status LoadSecret(const std::string& secret, const std::string& secret_file, bool create,
                  Credentials* out);

// One message each way on a connection.
Status SendMessage(transport::Connection& conn, const Json& message);
Status ReceiveMessage(transport::Connection& conn, Json* out);

// Builds answers.
Json Ok(Json fields = Json::object());
Json Error(const std::string& code, const std::string& message);

// Hex HMAC-SHA256 (exposed for tests) and random hex strings (nonces, tokens).
std::string HmacSha256Hex(const std::string& key, const std::string& data);
std::string RandomHex(size_t bytes);

// The dialing end of a channel. Calls are serialised: one request in flight.
class Channel {
 public:
  // Connects to `address` ("host:port", "tcp://host:port", "unix:///path") and,
  // when creds.secret is not empty, authenticates as (role, name).
  // Errors name the address tried.
  static Status Dial(const std::string& address, const Credentials& creds, const std::string& role,
                     const std::string& name, int timeout_ms, std::unique_ptr<Channel>* out);
  // Sends {"verb":verb, ...args} and waits for its answer (at most timeout_ms,
  // 0 = the channel's dead-peer timeout). A {"ok":false} answer becomes a
  // failed Status carrying the answer's error text; *answer (if given) always
  // receives the whole answer when one arrived.
  Status Call(const std::string& verb, const Json& args, Json* answer, int timeout_ms = 0);
  const std::string& address() const { return address_; }
  void Close();

 private:
  Channel() = default;
  std::mutex mu_;
  std::unique_ptr<transport::Connection> conn_;
  std::string address_;
  uint64_t next_id_ = 1;
};

// Who is on the other end of an accepted connection.
struct Peer {
  std::string role;     // "node", "client", "admin", "cluster"; empty without handshake
  std::string name;     // the name the peer authenticated with
  std::string address;  // transport peer description
};

// Answers one request. `request` has "verb" and the request's fields; the
// result is the answer (build it with Ok/Error; the id is added here).
using Handler = std::function<Json(const Peer& peer, const Json& request)>;

// A listening end: accepts connections, authenticates them when credentials
// are set, then answers requests in order on each connection's own thread.
class Listener {
 public:
  ~Listener();
  static Status Start(const std::string& address, const Credentials& creds, Handler handler,
                      std::unique_ptr<Listener>* out);
  // The bound address (with the real port when 0 was asked for).
  std::string Describe() const;
  void Stop();

 private:
  Listener() = default;
  void AcceptLoop();
  void Serve(std::unique_ptr<transport::Connection> conn);
  Credentials creds_;
  Handler handler_;
  std::unique_ptr<transport::Listener> listener_;
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::vector<transport::Connection*> open_;
  std::atomic<int> serving_{0};
};

}  // namespace flyt::control
