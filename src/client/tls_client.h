// The client library's side of tls:// (TLS 1.3 to flyt-server, transport/tls_server.h).
//
// OpenSSL is loaded when a tls:// address is first dialled (libssl.so.3, present on every
// current distribution): Debian's static OpenSSL is not position-independent, and a
// process that never asks for TLS loads nothing. Settings from the environment:
// FLYT_TLS_CA (the CA file that signed the server's certificate; default: the system's
// trust store), FLYT_TLS_CERT and FLYT_TLS_KEY (this client's certificate, for servers
// started with --tls-ca), FLYT_TLS_SERVER_NAME (the name the server's certificate must
// carry; default: the address's host).
//
// Owns: the dynamic binding to OpenSSL, the client's TLS context and the encrypted
// connection. Must not know about frames or CUDA.
#pragma once

#include <memory>

#include "common/status.h"
#include "transport/transport.h"

namespace flyt::client {

// Connects to a tls:// address: TCP (with `liveness`), then the TLS handshake with the
// server's certificate verified.
Status DialTls(const transport::Address& address, const transport::Liveness& liveness,
               std::unique_ptr<transport::Connection>* out);

}  // namespace flyt::client
