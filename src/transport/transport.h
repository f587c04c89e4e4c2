// Transports: byte streams between a client library and flyt-server.
//
// Owns: the Connection/Listener interface every transport implements (TCP,
// Unix sockets and shared memory (shm_transport.h); the network emulator and
// RDMA plug in here too), address parsing ("tcp://host:port", "unix:///path",
// "shm:///path", "host:port"), and liveness settings (connect timeout, dead-peer timeout).
// Must not know about frames or CUDA: it moves bytes.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace flyt::transport {

struct Address {
  // kShm: shared-memory rings; `path` is the Unix socket of the handshake.
  enum class Kind { kTcp, kUnix, kShm } kind = Kind::kTcp;
  std::string host;  // tcp
  int port = 0;      // tcp
  std::string path;  // unix, shm
  std::string ToString() const;
};

// Parses "tcp://host:port", "host:port", "unix:///path", "unix:path",
// "shm:///path" or "shm:path".
Status ParseAddress(const std::string& text, Address* out);

class Connection {
 public:
  virtual ~Connection() = default;
  // Sends every byte of the vector, or fails (peer gone, timeout).
  virtual Status Send(const iovec* iov, int count) = 0;
  // Receives exactly n bytes, or fails (peer gone, timeout).
  virtual Status Receive(void* dst, size_t n) = 0;
  // Closes the connection; later calls fail. Safe to call from another thread.
  virtual void Shutdown() = 0;
  // In a child process after fork(): closes this process's copies of the
  // descriptors and touches nothing the parent still uses (no shutdown(), no
  // ring or peer notification). The object must then be leaked, never
  // destroyed: the threads it owned exist only in the parent.
  virtual void AbandonAfterFork() = 0;
  // A Receive that waits longer than this fails ("timed out"); 0 = wait forever.
  virtual void SetReceiveTimeout(int timeout_ms) = 0;
  virtual std::string Peer() const = 0;

  // --- Memory shared with the peer (same-host transports, shm://; the others
  // answer SharesMemory() false and fail these calls).
  virtual bool SharesMemory() const { return false; }
  // Client: passes `fd` (a sealed memfd; the caller keeps its own descriptor)
  // to the server beside the byte stream; *id names it in the request that
  // uses it. Send the descriptor before that request.
  virtual Status ShareFd(int /*fd*/, uint64_t* /*id*/) {
    return Status::Error("this transport cannot share memory");
  }
  // Server: the descriptor the client shared as `id` (waits up to timeout_ms
  // for it to arrive). The caller owns the descriptor it gets.
  virtual Status TakeSharedFd(uint64_t /*id*/, int /*timeout_ms*/, int* /*fd*/) {
    return Status::Error("this transport cannot share memory");
  }
};

class Listener {
 public:
  virtual ~Listener() = default;
  // Blocks until a peer connects; fails once Close() was called.
  virtual Status Accept(std::unique_ptr<Connection>* out) = 0;
  virtual void Close() = 0;
  virtual std::string Describe() const = 0;
};

struct Liveness {
  int connect_timeout_ms = 5000;
  // A refused connection is retried this long: a server that restarts (after
  // a sticky CUDA error) listens again within a fraction of a second.
  int refused_retry_ms = 2000;
  // A peer that acknowledges nothing for this long is declared dead (TCP user
  // timeout and keepalive). Processes that exit are noticed at once.
  int dead_peer_timeout_ms = 30000;
};

Status Dial(const Address& address, const Liveness& liveness, std::unique_ptr<Connection>* out);
Status Listen(const Address& address, std::unique_ptr<Listener>* out);

}  // namespace flyt::transport
