// The shared-memory transport ("shm:///path"): a Unix socket for the handshake
// and liveness, two SPSC rings in a memfd segment for the bytes.
//
// Owns: the handshake (the server creates a sealed memfd per connection,
// formats a client->server and a server->client ring in it and passes the fd
// with SCM_RIGHTS plus ShmHandshake), and ShmConnection (Send = one ring
// record; Receive = exactly n bytes of the record stream, copied once from
// the ring into the caller's buffer). The socket stays open: its hang-up
// means the peer is gone, which closes the rings and wakes any waiter.
// Must not touch: frames or CUDA. Layout and protocol: docs/shared_memory.md.
// transport::Dial/Listen (socket_transport.cc) call in here for Kind::kShm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/transport.h"

namespace flyt::transport {

// Sent by the server with the memfd (SCM_RIGHTS), little-endian, 56 bytes.
struct ShmHandshake {
  static constexpr uint32_t kMagic = 0x53594c46;  // "FLYS" in little-endian memory
  static constexpr uint32_t kVersion = 1;
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint64_t segment_bytes = 0;  // the memfd's size (the client checks it with fstat)
  uint64_t c2s_offset = 0;     // client->server ring: offset of its 256-byte header
  uint64_t c2s_capacity = 0;   // its data bytes (a power of two)
  uint64_t s2c_offset = 0;     // server->client ring
  uint64_t s2c_capacity = 0;
  uint64_t flags = 0;  // kFlagFileBacked
  // The segment is a file (FLYT_SHM_BACKING=file:DIR), which cannot be sealed.
  static constexpr uint64_t kFlagFileBacked = 1;
};
static_assert(sizeof(ShmHandshake) == 56);

// Ring capacity the server uses: FLYT_SHM_RING_BYTES (rounded up to a power
// of two, 64 KiB .. 1 GiB) or 8 MiB.
size_t ShmRingBytesFromEnv();

// Where the server puts each connection's segment: FLYT_SHM_BACKING is
// "memfd" (the default: anonymous, sealed) or "file:DIR" (a file created in
// DIR and unlinked at once, e.g. on hugetlbfs). *dir is empty for memfd.
Status ShmBackingFromEnv(std::string* dir);

// Checks a handshake a server sent (sizes, offsets, overlap); used by Dial.
Status ValidateShmHandshake(const ShmHandshake& h);

// This kernel's boot id (/proc/sys/kernel/random/boot_id); "" if unreadable.
// Two processes with the same id run on one kernel, so they can share memory
// (a process in a VM has its own kernel and id).
std::string KernelBootId();

// How long a Receive on `conn` busy-polls before it sleeps on the ring's futex, from now
// on; nothing when `conn` is not a shm:// connection. For a connection whose receives are
// replies the caller is blocked on (the client library's main connection), where a sleep
// costs a futex wake on the peer and the wake-up latency here; connections that wait for
// requests keep the short default (FLYT_SHM_SPIN_US), so that idle costs no CPU. Call it
// from the thread that receives.
void SetShmReceiveSpin(Connection* conn, int spin_us);

Status DialShm(const Address& address, const Liveness& liveness, std::unique_ptr<Connection>* out,
               bool* retryable);
Status ListenShm(const Address& address, std::unique_ptr<Listener>* out);
// Continues a server-side shm connection another process detached.
Status ReattachShm(DetachedConnection&& d, std::unique_ptr<Connection>* out);

}  // namespace flyt::transport
