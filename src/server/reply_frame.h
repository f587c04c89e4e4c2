// One reply frame sent outside a session's own reply path: the handshake's
// answers (server/acceptor.cc), the paging channel's (server/managed_pager.cc)
// and a restoring worker's answer to the moving server (server/worker.cc).
//
// Owns: the reply header made from the request's op and call id. Must not
// know sessions (their replies carry more: server/session.cc ReplyHeader).
#pragma once

#include <cuda.h>
#include <sys/uio.h>

#include <cstddef>

#include "protocol/wire.h"
#include "transport/transport.h"

namespace flyt::server {

// Answers `req` with rc and n bytes of payload; false when the peer is gone.
inline bool SendReply(transport::Connection* conn, const wire::FrameHeader& req, CUresult rc,
                      const void* data, size_t n) {
  wire::FrameHeader h{};
  h.magic = wire::kMagic;
  h.op = req.op;
  h.flags = wire::kFlagReply;
  h.call_id = req.call_id;
  h.payload_len = static_cast<uint32_t>(n);
  h.status = static_cast<uint32_t>(rc);
  iovec iov[2] = {{&h, sizeof(h)}, {const_cast<void*>(data), n}};
  return conn->Send(iov, n > 0 ? 2 : 1).ok();
}

}  // namespace flyt::server
