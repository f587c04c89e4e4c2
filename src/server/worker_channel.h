// Messages between flyt-server's main process and its workers.
//
// Each worker has two SOCK_SEQPACKET socket pairs with the main process: the
// control channel (main -> worker: a client to serve, a client's callback
// channel) and the request channel (worker -> main: ready, code images,
// with the main process's answers). One message = one packet: a fixed header,
// a payload, and descriptors attached with SCM_RIGHTS.
// Owns: the message types and their framing. Must not know about CUDA or
// sessions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace flyt::server::channel {

enum class Type : uint32_t {
  // main -> worker (control channel)
  kServe = 1,        // Ticket + detached connection: serve this client
  kCallback = 2,     // detached connection: the client's callback channel
  kPaging = 3,       // detached connection: the client's paging channel (managed memory)
  kMove = 4,         // MoveOrder: move the session (migration or checkpoint) at its next park
  kResume = 5,       // detached connection: the client continues its restored session on it
  kRestoreFile = 6,  // Ticket + the checkpoint file's descriptor: restore that session
  // worker -> main (request channel)
  kReady = 10,         // CUDA is initialised; the worker waits for a client
  kImageFind = 11,     // u64 h0, u64 h1 -> kImage
  kImagePut = 12,      // u64 h0, u64 h1, u64 size + memfd (no answer)
  kShareablePut = 13,  // + the driver's VMM shareable descriptor -> kShareableKey
  kShareableGet = 14,  // u64 key, u64 secret -> kShareable
  kSticky = 15,        // its client hit a sticky error (no answer)
  kResumeKey = 16,     // u64 key[2]: the restored session waits for the client holding it
  kReport = 17,        // Report: how a move or a restore ended (no answer)
  // main -> worker (request channel, answers)
  kImage = 20,         // u8 found, u64 size [+ memfd]
  kShareableKey = 21,  // u64 key, u64 secret
  kShareable = 22,     // u8 found [+ the descriptor]
};

struct Message {
  Type type{};
  std::vector<uint8_t> payload;
  std::vector<int> fds;  // owned by the receiver
};

// Payload limit: a message is one packet.
constexpr size_t kMaxPayload = 60 * 1024;

// Sends one message; the caller keeps its descriptors.
Status Send(int sock, Type type, const void* payload, size_t n, const std::vector<int>& fds = {});
// Receives one message (descriptors arrive close-on-exec). timeout_ms < 0:
// wait forever. Fails at end of file ("closed") or on a malformed packet.
Status Receive(int sock, Message* out, int timeout_ms = -1);
void CloseFds(Message* m);

// What the main process learnt in the handshake, for the worker.
struct Ticket {
  uint64_t session = 0;
  uint64_t secret = 0;
  uint32_t client_pid = 0;
  uint32_t flags = 0;  // kTicketRestore
  // The tenant board's share generation whose device inventory the client
  // got in the handshake.
  uint64_t share_generation = 0;
};

// Ticket::flags: the connection is a server moving a session here
// (ops::kOpRestoreSession): the worker reads the snapshot from it.
inline constexpr uint32_t kTicketRestore = 1;

// kMove: what the operator asked for (control socket verbs migrate, checkpoint).
struct MoveOrder {
  enum class Mode : uint8_t { kMigrate = 1, kCheckpoint = 2 } mode = Mode::kMigrate;
  bool leave_running = false;  // checkpoint only: the session goes on here
  std::string where;           // migrate: the target's address; checkpoint: a directory
  std::string token;           // migrate: the target server's token
};
std::vector<uint8_t> EncodeMoveOrder(const MoveOrder& o);
bool DecodeMoveOrder(const std::vector<uint8_t>& payload, MoveOrder* out);

// kReport: one session's move or restore, for the control socket's answer.
struct Report {
  enum class Kind : uint8_t { kMove = 1, kRestore = 2 } kind = Kind::kMove;
  bool ok = false;
  uint64_t session = 0;
  std::string message;  // where it went, or why not
};
std::vector<uint8_t> EncodeReport(const Report& r);
bool DecodeReport(const std::vector<uint8_t>& payload, Report* out);

// A detached connection as one message (kServe carries a Ticket first).
Status SendConnection(int sock, Type type, const Ticket* ticket, transport::DetachedConnection* c);
// Inverse of SendConnection; takes the message's descriptors.
Status ParseConnection(Message* m, Ticket* ticket, transport::DetachedConnection* c);

}  // namespace flyt::server::channel
