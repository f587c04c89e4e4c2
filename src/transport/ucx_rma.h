// One-sided access to a ucx:// client's registered memory (transport.h's RemoteMemory).
//
// Client side: a UCP worker of its own that only serves the server's reads and writes,
// progressed by a thread of its own (over UCX's TCP transport the target of a read or
// write must progress; over shared memory (CMA) and RDMA it need not, and the thread
// sleeps), so that a transfer never waits for the application to call CUDA. Its address
// goes to the server once (LocalAddress); each exposed buffer is registered with
// ucp_mem_map once and its packed key goes to the server (Expose).
// Server side (a worker process): a UCP worker of its own with one endpoint to the
// client's (Connect), the client's keys (ImportKey, checked first: ValidatePackedRkey),
// local buffers registered once (RegisterLocal: the session's pinned staging, or GPU
// memory where UCX can reach it), and blocking reads and writes (ucp_get/ucp_put, a write
// flushed before it returns) that give up when the client's socket hangs up, the
// connection shuts down, UCX reports the peer failed, or kRmaOpTimeoutMs pass.
//
// Owns: the RMA workers, endpoint, registrations and keys, the client's progress thread.
// Must not touch: the connection's own worker and tags, frames, CUDA. UCX comes from
// transport/ucx_api.h.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/transport.h"
#include "transport/ucx_api.h"

namespace flyt::transport {

// A packed key larger than this is hostile (UCX packs a few bytes per memory domain).
constexpr size_t kMaxPackedRkey = 4096;
// Keys one connection may import at once (one per registered client buffer).
constexpr size_t kMaxImportedKeys = 65536;
// A read or write that makes no end within this long fails (the client is stalled).
constexpr int kRmaOpTimeoutMs = 60000;

// Checks the layout of a packed UCX remote key before UCX parses it (UCX trusts its
// peer and takes no length): u64 memory-domain map (not empty), u8 memory type (host),
// then for each domain in the map a u8 length and that many bytes, ending exactly at n.
Status ValidatePackedRkey(const void* key, size_t n);

// How the owning connection tells that its peer is gone (server side): its socket, which
// carries nothing after the switch to UCX (any readiness means a hang-up or a violation),
// its wake-up descriptor (written by Shutdown) and its shutdown flag.
struct RmaPeerWatch {
  int sock = -1;
  int stop_fd = -1;
  const std::atomic<bool>* shutdown = nullptr;
  std::string peer;
};

// `client`: the client side (LocalAddress, Expose, Withdraw); else the server side.
std::unique_ptr<RemoteMemory> NewUcxRemoteMemory(const ucx::Api* api, bool client,
                                                 RmaPeerWatch watch);

// The server side's registration of local memory that holds [p, p+n) (RegisterLocal), or
// null: the connection's own messages to and from that memory use it.
ucp_mem_h UcxLocalRegistration(RemoteMemory* rma, const void* p, size_t n);

}  // namespace flyt::transport
