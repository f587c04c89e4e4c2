// The UCX transport ("ucx://HOST:PORT"): a TCP socket for the handshake and liveness,
// UCX tagged messages for the bytes once the worker process that serves the client has
// its own UCP worker.
//
// flyt-server's main process authenticates a client and hands the connection to a worker
// process (Detach/Reattach), and a UCX endpoint cannot move between processes. So a
// ucx:// connection starts as a plain byte stream on its TCP socket (the client's first
// bytes there are a preface with its UCP worker address and the tag it receives on; the
// main process never loads UCX), and switches to UCX in the worker process:
//
//   1. client -> server, TCP: UcxPreface + the client's worker address.
//   2. hello and its reply, TCP, as raw bytes (so is anything the client sends before 3).
//   3. worker (after Reattach) -> client, UCX: UcxSwitch with the server's worker address,
//      its tag and how many raw bytes the server side sent on TCP in all. Every later
//      server byte travels as UCX tagged messages.
//   4. client, when it sees 3: UcxSwitch back over UCX with its own raw byte count; every
//      later client byte travels over UCX. Each side reads its peer's raw bytes up to the
//      count, then UCX messages.
//
// After the switch the socket carries nothing: its hang-up (or TCP keepalive / user
// timeout) means the peer is gone, as on tcp://; bytes there are a protocol violation.
// Tags are random 64-bit values exchanged over the authenticated socket: messages with
// any other tag are never received. Send = one UCX tag message per group of small iovecs
// and one per large iovec (UCX picks eager or rendezvous; rendezvous is zero-copy RMA on
// transports that can); Receive = exactly n bytes of the message stream, a message that
// fits landing straight in the caller's buffer.
//
// Owns: the bootstrap messages and their checks, UcxConnection, the listener, and each
// connection's one-sided access (Rma(): transport/ucx_rma.h, made at the first call; large
// messages to and from memory registered there use that registration). Must not touch
// frames or CUDA. UCX itself comes from transport/ucx_api.h (dlopen).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/transport.h"

namespace flyt::transport {

// Client -> server on TCP, first thing after connect; the address follows.
struct UcxPreface {
  static constexpr uint32_t kMagic = 0x55594c46;  // "FLYU"
  static constexpr uint32_t kVersion = 1;
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint64_t tag = 0;  // the client receives messages with this tag
  uint32_t address_len = 0;
  uint32_t reserved = 0;
};
static_assert(sizeof(UcxPreface) == 24);

// First UCX message in each direction; the server's carries its worker address after it.
struct UcxSwitch {
  static constexpr uint32_t kMagic = 0x57594c46;  // "FLYW"
  static constexpr uint32_t kVersion = 1;
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint64_t raw_bytes = 0;  // bytes this side sent on the TCP socket before switching
  uint64_t tag = 0;        // this side receives messages with this tag
  uint32_t address_len = 0;
  uint32_t reserved = 0;
};
static_assert(sizeof(UcxSwitch) == 32);

// A UCP worker address larger than this is hostile (real ones are a few hundred bytes).
constexpr size_t kUcxMaxAddress = size_t{64} << 10;
// A UCX message larger than this is hostile: senders cut nothing bigger than a frame
// (64 MiB payload plus its header).
constexpr size_t kUcxMaxMessage = (size_t{64} << 20) + (size_t{1} << 20);

// Checks a preface (sizes, magic, version). `bytes`/`n`: the whole preface as received.
Status ValidateUcxPreface(const UcxPreface& p);
// Checks a switch message of `n` bytes; `expect_address`: the server's must carry one,
// the client's must not. On success *p holds its header.
Status ParseUcxSwitch(const void* bytes, size_t n, bool expect_address, UcxSwitch* p);

Status DialUcx(const Address& address, const Liveness& liveness, std::unique_ptr<Connection>* out,
               bool* retryable);
Status ListenUcx(const Address& address, std::unique_ptr<Listener>* out);
// Continues, in a worker process, a server-side ucx:// connection the main process
// detached: creates this process's UCP worker and switches to UCX (step 3 above).
Status ReattachUcx(DetachedConnection&& d, std::unique_ptr<Connection>* out);

}  // namespace flyt::transport
