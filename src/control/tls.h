// Mutual TLS for the control plane's connections (OpenSSL): every manager
// connection when the daemons are given a CA, a certificate and its key.
//
// Owns: the TLS contexts made from those files and the Connection that
// carries the control protocol over TLS on a connected socket. Both ends
// present a certificate and accept only certificates signed by the CA, so a
// peer without a valid one is refused before a byte of the protocol (the
// shared-secret handshake still runs inside). Must not know about messages.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "transport/transport.h"

namespace flyt::control {

// Settings tls_ca, tls_cert, tls_key; TLS is on when tls_ca is set.
struct TlsFiles {
  std::string ca, cert, key;
  bool enabled() const { return !ca.empty(); }
};

class TlsContext;
class Settings;

// Registers tls_ca, tls_cert and tls_key with a daemon's settings.
void AddTlsSettings(Settings* settings, TlsFiles* files);

// Loads and checks the files (the key must match the certificate); the error
// names the file and what is wrong with it.
Status MakeTlsContext(const TlsFiles& files, bool server, std::shared_ptr<TlsContext>* out);

// Runs the TLS handshake on `*conn` (a socket connection, nothing read from it
// yet) and replaces it with the encrypted connection. `peer` names the other
// side in errors. Fails, closing the connection, when the peer presents no
// certificate or one the CA did not sign, or speaks no TLS.
Status TlsHandshake(const TlsContext& ctx, bool server, const std::string& peer, int timeout_ms,
                    std::unique_ptr<transport::Connection>* conn);

}  // namespace flyt::control
