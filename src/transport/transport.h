// Transports: byte streams between a client library and flyt-server.
//
// Owns: the Connection/Listener interface every transport implements (TCP,
// Unix sockets, shared memory (shm_transport.h) and UCX (ucx_transport.h); the network
// emulator plugs in here too), the RemoteMemory interface of transports that let the
// server read and write registered client memory one-sided (ucx://: ucx_rma.h), address parsing
// ("tcp://host:port", "tls://host:port", "ucx://host:port", "unix:///path", "shm:///path",
// "host:port"), and liveness settings (connect timeout, dead-peer timeout). TLS itself lives
// outside: transport/tls_server.h (flyt-server) and client/tls_client.h (the client library); here
// tls:// listens like tcp://. Must not know about frames or CUDA: it moves bytes.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace flyt::transport {

struct Address {
  // kShm: shared-memory rings; `path` is the Unix socket of the handshake.
  // kTls: TCP carrying TLS 1.3 (Listen listens as for kTcp; Dial refuses it).
  // kUcx: a TCP socket for the handshake and liveness, UCX for the bytes.
  enum class Kind { kTcp, kUnix, kShm, kTls, kUcx } kind = Kind::kTcp;
  std::string host;  // tcp, tls, ucx
  int port = 0;      // tcp, tls, ucx
  std::string path;  // unix, shm
  std::string ToString() const;
};

// Parses "tcp://host:port", "host:port", "tls://host:port", "ucx://host:port",
// "unix:///path", "unix:path",
// "shm:///path" or "shm:path".
Status ParseAddress(const std::string& text, Address* out);

// A server-side connection on its way to another process: flyt-server's
// main process accepts and authenticates a client, then hands the connection
// to the worker process that serves it (server/worker_pool.h). The holder
// owns the descriptors until Reattach takes them.
struct DetachedConnection {
  // kTls: a socket with TLS 1.3 record state (transport/tls_server.h continues it).
  // kUcx: the socket of a ucx:// connection before its switch to UCX (ucx_transport.h).
  enum class Kind : uint32_t { kNone = 0, kSocket = 1, kShm = 2, kTls = 3, kUcx = 4 };
  Kind kind = Kind::kNone;
  std::vector<int> fds;        // socket: {socket}; shm: {socket, segment, shared...}
  std::vector<uint8_t> state;  // kind-specific: bytes already buffered, ring layout
  std::string peer;
};

// One-sided access to registered memory of the client (ucx://). A connection that has it
// answers Connection::Rma() with this object, which it owns and which lives as long as
// the connection. The client side exposes buffers (Expose) and sends the address and the
// keys it gets in frames of its own; the server side connects to that address, imports
// the keys, and reads and writes the client's buffers (Read, Write) while the client's
// threads go on with other work. The server treats every key, address and length from
// the client as hostile: ImportKey checks the key's layout before the transport library
// parses it, and Read/Write reach only the client's own process. Moves bytes only.
class RemoteMemory {
 public:
  virtual ~RemoteMemory() = default;

  // --- client side
  // The bytes the server needs to reach this process's exposed memory (Connect).
  virtual Status LocalAddress(std::vector<uint8_t>* out) = 0;
  // Registers [base, base+len) for the server's reads and writes; *key is what the server
  // imports, *handle names the registration for Withdraw.
  virtual Status Expose(void* base, size_t len, std::vector<uint8_t>* key, uint64_t* handle) = 0;
  // Ends a registration (the server must have dropped its key, or be gone).
  virtual void Withdraw(uint64_t handle) = 0;

  // --- server side
  // Reaches the client's exposed memory through the address LocalAddress gave there.
  virtual Status Connect(const void* address, size_t n) = 0;
  // A key the client's Expose made; *id names it in Read/Write.
  virtual Status ImportKey(const void* key, size_t n, uint64_t* id) = 0;
  virtual void DropKey(uint64_t id) = 0;
  // Registers a local buffer once, so that transfers to and from it need no registration
  // of their own. `device`: GPU memory (only where DeviceMemory() says it can be reached).
  virtual Status RegisterLocal(void* base, size_t len, bool device, uint64_t* handle) = 0;
  virtual void UnregisterLocal(uint64_t handle) = 0;
  // Copies n bytes between `local` and the client's address `remote`, which must lie in the
  // memory of key `id`; each waits until the bytes are in place (Write: visible to the
  // client). A failure means the client is gone or misbehaves: every later call fails.
  // `device`: `local` is GPU memory. Thread-safe (calls are serialized).
  virtual Status Read(void* local, size_t n, uint64_t remote, uint64_t id, bool device) = 0;
  virtual Status Write(const void* local, size_t n, uint64_t remote, uint64_t id, bool device) = 0;
  // Whether the transport library here can read and write GPU memory itself (UCX built
  // with CUDA support); what it reports, for the log.
  virtual bool DeviceMemory() const = 0;
  virtual std::string Describe() const = 0;
};

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
  // Sockets: a Receive with nothing buffered polls the socket for up to this many
  // microseconds before it blocks, so that an answer that comes within that time does not
  // pay the wake-up of a sleeping thread (on a VM, tens to hundreds of microseconds when
  // the host parked the idle vCPU). 0 (the default) blocks at once. Other transports spin
  // by their own settings and ignore it.
  virtual void SetSocketSpin(int spin_us) { (void)spin_us; }
  virtual std::string Peer() const = 0;
  // Server side: gives up the connection's descriptors and state so that
  // another process can continue it (Reattach) exactly where this one
  // stopped, at a frame boundary. Afterwards this object is inert: destroying
  // it neither shuts the connection down nor tells the peer anything.
  virtual Status Detach(DetachedConnection* /*out*/) {
    return Status::Error("this connection cannot be handed to another process");
  }

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

  // --- One-sided access to registered client memory (ucx://), or nullptr. Made at the
  // first call; the connection owns it.
  virtual RemoteMemory* Rma() { return nullptr; }
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

// Continues a connection another process detached; takes d's descriptors
// (closed on failure).
Status Reattach(DetachedConnection&& d, std::unique_ptr<Connection>* out);
// Closes the descriptors of a detached connection nobody will continue.
void CloseDetached(DetachedConnection* d);

Status Dial(const Address& address, const Liveness& liveness, std::unique_ptr<Connection>* out);
// Writes every byte of `iov` (at most 16 pieces) to a blocking stream socket, going on
// after short writes and EINTR; *sent (when given) grows by the bytes written, also when
// it fails. The socket transports' Send (tcp, unix, and ucx:// before its switch).
Status SendAllOnSocket(int fd, const std::string& peer, const iovec* iov, int count,
                       uint64_t* sent = nullptr);
Status Listen(const Address& address, std::unique_ptr<Listener>* out);

}  // namespace flyt::transport
