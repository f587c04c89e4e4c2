// flyt-server as a TLS client: a worker sends a session it moves to a tls:// server
// (transport/tls_server.h, DialTls). OpenSSL is linked statically here, as for the
// listener; the connection lives in this one process, so OpenSSL's own record layer serves
// it (nothing is detached).
//
// Owns: the dialling side's context (the CA that signed the other servers' certificates,
// this server's own certificate for servers that ask for one), the handshake with the
// target's name checked, and the encrypted byte stream. Must not know about frames or CUDA.
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "transport/tls_server.h"

namespace flyt::transport {
namespace {

std::string LastError() {
  unsigned long e = ERR_get_error();
  if (e == 0) return errno != 0 ? std::strerror(errno) : "no details";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

class TlsDialConnection final : public Connection {
 public:
  TlsDialConnection(SSL_CTX* ctx, SSL* ssl, int fd, std::string peer)
      : ctx_(ctx), ssl_(ssl), fd_(fd), peer_(std::move(peer)) {}
  ~TlsDialConnection() override {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
    if (fd_ >= 0) ::close(fd_);
  }

  Status Send(const iovec* iov, int count) override {
    for (int i = 0; i < count; ++i) {
      const auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
      size_t n = iov[i].iov_len;
      while (n > 0) {
        const int chunk = n > (1u << 30) ? (1 << 30) : static_cast<int>(n);
        const int w = SSL_write(ssl_, p, chunk);
        if (w > 0) {
          p += w;
          n -= static_cast<size_t>(w);
          continue;
        }
        if (SSL_get_error(ssl_, w) == SSL_ERROR_SYSCALL && errno == EINTR) continue;
        return Status::Error("TLS send to " + peer_ + ": " + LastError());
      }
    }
    return Status::Ok();
  }

  Status Receive(void* dst, size_t n) override {
    auto* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      const int chunk = n > (1u << 30) ? (1 << 30) : static_cast<int>(n);
      const int r = SSL_read(ssl_, out, chunk);
      if (r > 0) {
        out += r;
        n -= static_cast<size_t>(r);
        continue;
      }
      const int e = SSL_get_error(ssl_, r);
      if (e == SSL_ERROR_ZERO_RETURN) return Status::Error("connection closed by " + peer_);
      if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_SYSCALL) &&
          (errno == EAGAIN || errno == EWOULDBLOCK))
        return Status::Error("receive from " + peer_ + " timed out");
      if (e == SSL_ERROR_SYSCALL && errno == EINTR) continue;
      return Status::Error("TLS receive from " + peer_ + ": " + LastError());
    }
    return Status::Ok();
  }

  void Shutdown() override {
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  }
  void AbandonAfterFork() override {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    ssl_ = nullptr;  // leaked on purpose: the parent still uses its copy
    ctx_ = nullptr;
  }
  void SetReceiveTimeout(int timeout_ms) override {
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  std::string Peer() const override { return peer_; }

 private:
  SSL_CTX* ctx_;
  SSL* ssl_;
  int fd_;
  std::string peer_;
};

}  // namespace

Status DialTls(const Address& address, const Liveness& liveness, const TlsDialFiles& files,
               std::unique_ptr<Connection>* out) {
  const std::string peer = address.ToString();
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) return Status::Error("TLS to " + peer + ": " + LastError());
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  std::string err;
  if (!files.ca.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, files.ca.c_str(), nullptr) != 1)
      err = "--tls-peer-ca " + files.ca + ": " + LastError();
  } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
    err = "the system's trust store: " + LastError();
  }
  if (err.empty() && !files.cert.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, files.cert.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, files.key.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1)
      err = "--tls-cert " + files.cert + " / --tls-key " + files.key + ": " + LastError();
  }
  if (!err.empty()) {
    SSL_CTX_free(ctx);
    return Status::Error("TLS to " + peer + ": " + err);
  }
  Address tcp = address;
  tcp.kind = Address::Kind::kTcp;
  std::unique_ptr<Connection> plain;
  Status st = Dial(tcp, liveness, &plain);
  DetachedConnection socket;
  if (st.ok()) st = plain->Detach(&socket);
  if (!st.ok()) {
    SSL_CTX_free(ctx);
    return st;
  }
  const int fd = socket.fds.empty() ? -1 : socket.fds[0];
  const std::string name = files.server_name.empty() ? address.host : files.server_name;
  SSL* ssl = SSL_new(ctx);
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1 || SSL_set1_host(ssl, name.c_str()) != 1) {
    const std::string e = LastError();
    if (ssl != nullptr) SSL_free(ssl);
    SSL_CTX_free(ctx);
    ::close(fd);
    return Status::Error("TLS to " + peer + ": " + e);
  }
  SSL_set_tlsext_host_name(ssl, name.c_str());
  const int timeout = liveness.connect_timeout_ms > 0 ? liveness.connect_timeout_ms : 10000;
  timeval tv{timeout / 1000, (timeout % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (SSL_connect(ssl) != 1) {
    std::string e = LastError();
    const long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK) e += " (" + std::string(X509_verify_cert_error_string(verify)) + ")";
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    ::close(fd);
    return Status::Error("TLS handshake with " + peer + " failed: " + e +
                         "; the target's certificate must be signed by the CA given with "
                         "--tls-peer-ca (node managers: tls_ca) and name " +
                         name);
  }
  timeval none{0, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
  *out = std::make_unique<TlsDialConnection>(ctx, ssl, fd, peer);
  return Status::Ok();
}

}  // namespace flyt::transport
