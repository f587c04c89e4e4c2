// Flyt wire format: the one framing every transport carries.
//
// Owns: the frame header layout, protocol constants, frame limits and the
// handshake messages. Everything is little-endian and fixed-size so that a
// payload can be decoded straight into its destination. Must not know about
// CUDA semantics (see protocol/ops.h) or about sockets (see transport/).
#pragma once

#include <cstdint>

namespace flyt::wire {

inline constexpr uint32_t kMagic = 0x54594c46;  // "FLYT"
inline constexpr uint32_t kProtocolVersion = 1;

// Largest payload one frame may carry. Bigger copies are split by the client;
// a peer announcing more is hostile and its session is closed.
inline constexpr uint32_t kMaxPayload = 64u << 20;
// Bulk copies are cut into chunks of this size so that network and GPU overlap.
inline constexpr uint32_t kCopyChunk = 8u << 20;

enum FrameFlags : uint16_t {
  kFlagNone = 0,
  kFlagWantReply = 1 << 0,   // request: the sender waits for a reply frame
  kFlagReply = 1 << 1,       // this frame is a reply
  kFlagPerThread = 1 << 2,   // request: use the per-thread default stream (_ptsz/_ptds)
  kFlagPersistent = 1 << 3,  // callback channel: the host function belongs to a graph
};

struct FrameHeader {
  uint32_t magic;
  uint16_t op;
  uint16_t flags;
  uint64_t call_id;
  uint32_t payload_len;
  // In replies: the call's CUresult. In requests: zero.
  uint32_t status;
  // In replies: the first error of an earlier asynchronous call, or zero.
  uint32_t deferred_status;
  // In replies: ReplyInfo bits. In requests: zero.
  uint32_t info;
};

enum ReplyInfo : uint32_t {
  // The call was captured into a CUDA graph: it carries no data now (a copy to
  // the host delivers its bytes when the graph runs).
  kReplyCaptured = 1 << 0,
  // The tenant's share (SM count, memory) changed since the client fetched
  // the device inventory: it fetches it again (ops::kOpDeviceInfo).
  kReplyConfigChanged = 1 << 1,
  // The global the call returned is a __managed__ variable: the client maps
  // its host side (client/managed_memory.h).
  kReplyManaged = 1 << 2,
  // The operator moves this session (migration or checkpoint): the client
  // sends ops::kOpPark right after this reply.
  kReplyMoveWanted = 1 << 3,
};
static_assert(sizeof(FrameHeader) == 32);

// Handshake: the first frame of every session (op kOpHello).
inline constexpr uint32_t kMaxTokenLen = 256;
struct HelloRequest {
  uint32_t protocol_version;
  int32_t client_cuda_version;  // CUDA version the client library implements
  uint32_t pid;
  uint32_t token_len;  // followed by token bytes
};
struct HelloReply {
  uint32_t protocol_version;
  int32_t driver_version;  // the server's driver (cuDriverGetVersion)
  uint64_t session_id;
  uint64_t session_secret;  // proves ownership when attaching the callback channel
  // followed by a length-prefixed message (reason on refusal) and, on success,
  // the device inventory (see protocol/ops.h: DeviceInfo).
};

}  // namespace flyt::wire
