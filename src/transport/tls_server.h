// TLS 1.3 on flyt-server's data plane (tls://HOST:PORT listeners), with OpenSSL.
//
// flyt-server's main process accepts a connection and authenticates the client before a
// worker process takes it over (server/worker_pool.h), and OpenSSL's connection state
// cannot cross a process boundary. So OpenSSL runs only the handshake; the traffic
// secrets it derives (its key-log callback) then drive a record layer of our own
// (RFC 8446, section 5: AES-GCM, sequence-number nonces, KeyUpdate), whose state is plain
// bytes that Detach hands to the worker, as the kernel's TLS offload takes over from a
// user-space handshake. Suites are limited to TLS_AES_128_GCM_SHA256 and
// TLS_AES_256_GCM_SHA384; no session tickets, so nothing follows the handshake that the
// record layer does not know.
//
// Owns: the server's TLS context (certificate, key, optional client CA), the handshake and
// the record layer, and a worker's dial to another server's tls:// listener when it moves a
// session there (tls_dial.cc). Must not know about frames or CUDA. The client library's side
// is client/tls_client.h (OpenSSL loaded at run time).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "transport/transport.h"

namespace flyt::transport {

struct TlsServerFiles {
  std::string cert, key;  // the server's certificate chain and key (PEM)
  std::string ca;         // set: clients must present a certificate this CA signed
};

class TlsServerContext;

// Loads and checks the files; the error names the file and what is wrong with it.
Status MakeTlsServerContext(const TlsServerFiles& files, std::shared_ptr<TlsServerContext>* out);

// Runs the server side of the handshake on `*conn`, an accepted TCP connection nothing
// has been read from, and replaces it with the encrypted connection (detachable). Fails,
// closing it, when the peer speaks no TLS 1.3 or, with a CA, presents no valid certificate.
Status AcceptTls(const TlsServerContext& ctx, int timeout_ms, std::unique_ptr<Connection>* conn);

// Continues a connection AcceptTls made and another process detached (Kind::kTls).
Status ReattachTls(DetachedConnection&& d, std::unique_ptr<Connection>* out);

// flyt-server dialling another flyt-server's tls:// listener (a session's live migration,
// tls_dial.cc): the target's certificate must be signed by `ca` (empty: the system's trust
// store) and name `server_name` (empty: the address's host); `cert`/`key` (optional) are
// presented to a target that asks for a client certificate.
struct TlsDialFiles {
  std::string ca, cert, key, server_name;
};
Status DialTls(const Address& address, const Liveness& liveness, const TlsDialFiles& files,
               std::unique_ptr<Connection>* out);

}  // namespace flyt::transport
