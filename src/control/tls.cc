#include "control/tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>

#include "control/config.h"

namespace flyt::control {

class TlsContext {
 public:
  explicit TlsContext(SSL_CTX* ctx) : ctx_(ctx) {}
  ~TlsContext() { SSL_CTX_free(ctx_); }
  SSL_CTX* get() const { return ctx_; }

 private:
  SSL_CTX* ctx_;
};

namespace {

std::string OpenSslError() {
  unsigned long e = ERR_get_error();
  std::string text;
  while (e != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!text.empty()) text += "; ";
    text += buf;
    e = ERR_get_error();
  }
  return text.empty() ? "no detail from OpenSSL" : text;
}

void SetTimeout(int fd, int timeout_ms) {
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// The control protocol over TLS. One thread at a time sends or receives (the
// control protocol is request-reply); Shutdown may come from another thread.
class TlsConnection final : public transport::Connection {
 public:
  TlsConnection(SSL* ssl, int fd, std::string peer) : ssl_(ssl), fd_(fd), peer_(std::move(peer)) {}
  ~TlsConnection() override {
    SSL_free(ssl_);
    ::close(fd_);
  }
  Status Send(const iovec* iov, int count) override {
    for (int i = 0; i < count; ++i) {
      const char* p = static_cast<const char*>(iov[i].iov_base);
      size_t left = iov[i].iov_len;
      while (left > 0) {
        size_t wrote = 0;
        if (SSL_write_ex(ssl_, p, left, &wrote) != 1)
          return Status::Error("TLS send to " + peer_ + " failed: " + OpenSslError());
        p += wrote;
        left -= wrote;
      }
    }
    return Status::Ok();
  }
  Status Receive(void* dst, size_t n) override {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      size_t got = 0;
      if (SSL_read_ex(ssl_, p, n, &got) != 1) {
        int err = SSL_get_error(ssl_, 0);
        if (err == SSL_ERROR_ZERO_RETURN) return Status::Error(peer_ + " closed the connection");
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Error("timed out");
        return Status::Error("TLS receive from " + peer_ + " failed: " + OpenSslError());
      }
      p += got;
      n -= got;
    }
    return Status::Ok();
  }
  void Shutdown() override { ::shutdown(fd_, SHUT_RDWR); }
  void AbandonAfterFork() override { ::close(fd_); }
  void SetReceiveTimeout(int timeout_ms) override {
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  std::string Peer() const override { return peer_; }

 private:
  SSL* ssl_;
  int fd_;
  std::string peer_;
};

}  // namespace

void AddTlsSettings(Settings* settings, TlsFiles* files) {
  settings->Add("tls_ca", &files->ca,
                "CA certificate (PEM) peers' certificates must be signed by; set it, tls_cert "
                "and tls_key to use mutual TLS on every manager connection");
  settings->Add("tls_cert", &files->cert, "this daemon's certificate (PEM), signed by tls_ca");
  settings->Add("tls_key", &files->key, "the private key (PEM) of tls_cert");
}

Status MakeTlsContext(const TlsFiles& files, bool server, std::shared_ptr<TlsContext>* out) {
  if (files.cert.empty() || files.key.empty())
    return Status::Error("TLS: tls_ca is set, so tls_cert and tls_key must be too");
  SSL_CTX* raw = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (raw == nullptr) return Status::Error("TLS: cannot create a context: " + OpenSslError());
  auto ctx = std::make_shared<TlsContext>(raw);
  SSL_CTX_set_min_proto_version(raw, TLS1_2_VERSION);
  if (SSL_CTX_load_verify_locations(raw, files.ca.c_str(), nullptr) != 1)
    return Status::Error("TLS: cannot read the CA certificate tls_ca=" + files.ca + ": " +
                         OpenSslError());
  if (SSL_CTX_use_certificate_chain_file(raw, files.cert.c_str()) != 1)
    return Status::Error("TLS: cannot read the certificate tls_cert=" + files.cert + ": " +
                         OpenSslError());
  if (SSL_CTX_use_PrivateKey_file(raw, files.key.c_str(), SSL_FILETYPE_PEM) != 1) {
    if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH) {
      ERR_clear_error();
      return Status::Error("TLS: tls_key=" + files.key +
                           " is not the key of tls_cert=" + files.cert);
    }
    return Status::Error("TLS: cannot read the private key tls_key=" + files.key + ": " +
                         OpenSslError());
  }
  if (SSL_CTX_check_private_key(raw) != 1)
    return Status::Error("TLS: tls_key=" + files.key + " is not the key of tls_cert=" + files.cert);
  // Both sides: a peer certificate signed by the CA, or no connection.
  SSL_CTX_set_verify(raw, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  *out = std::move(ctx);
  return Status::Ok();
}

Status TlsHandshake(const TlsContext& ctx, bool server, const std::string& peer, int timeout_ms,
                    std::unique_ptr<transport::Connection>* conn) {
  transport::DetachedConnection d;
  Status s = (*conn)->Detach(&d);
  conn->reset();
  if (!s.ok()) return Status::Error("TLS needs a socket connection: " + s.message());
  if (d.kind != transport::DetachedConnection::Kind::kSocket || d.fds.size() != 1 ||
      !d.state.empty()) {
    transport::CloseDetached(&d);
    return Status::Error("TLS needs a fresh socket connection");
  }
  const int fd = d.fds[0];
  SetTimeout(fd, timeout_ms);
  SSL* ssl = SSL_new(ctx.get());
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    ::close(fd);
    return Status::Error("TLS: cannot start a session: " + OpenSslError());
  }
  ERR_clear_error();
  int rc = server ? SSL_accept(ssl) : SSL_connect(ssl);
  if (rc != 1) {
    std::string why = OpenSslError();
    long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK)
      why = std::string("its certificate: ") + X509_verify_cert_error_string(verify);
    SSL_free(ssl);
    ::close(fd);
    return Status::Error("TLS handshake with " + peer + " failed (" + why +
                         "): both sides need tls_ca, tls_cert and tls_key, with certificates "
                         "signed by the same CA");
  }
  SetTimeout(fd, 0);
  *conn = std::make_unique<TlsConnection>(ssl, fd, peer);
  return Status::Ok();
}

}  // namespace flyt::control
