// Implementation of client/tls_client.h.
#include "client/tls_client.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <vector>

#include "common/log.h"

namespace flyt::client {
namespace {

// OpenSSL's ABI as libssl.so.3 exports it (opaque pointers; constants from its headers).
struct SSL;
struct SSL_CTX;
struct SSL_METHOD;
constexpr int kSslCtrlSetMinProtoVersion = 123;  // SSL_CTRL_SET_MIN_PROTO_VERSION
constexpr int kTls13Version = 0x0304;            // TLS1_3_VERSION
constexpr int kSslCtrlSetTlsextHostname = 55;    // SSL_CTRL_SET_TLSEXT_HOSTNAME
constexpr int kSslCtrlSetReadAhead = 41;         // SSL_CTRL_SET_READ_AHEAD
constexpr int kVerifyPeer = 1;                   // SSL_VERIFY_PEER
constexpr int kFiletypePem = 1;                  // SSL_FILETYPE_PEM
constexpr int kErrorWantRead = 2, kErrorWantWrite = 3, kErrorSyscall = 5, kErrorZeroReturn = 6;

struct OpenSsl {
  const SSL_METHOD* (*TLS_client_method)();
  SSL_CTX* (*SSL_CTX_new)(const SSL_METHOD*);
  void (*SSL_CTX_free)(SSL_CTX*);
  long (*SSL_CTX_ctrl)(SSL_CTX*, int, long, void*);
  void (*SSL_CTX_set_verify)(SSL_CTX*, int, void*);
  void (*SSL_CTX_set_default_read_buffer_len)(SSL_CTX*, size_t);
  int (*SSL_CTX_load_verify_locations)(SSL_CTX*, const char*, const char*);
  int (*SSL_CTX_set_default_verify_paths)(SSL_CTX*);
  int (*SSL_CTX_use_certificate_chain_file)(SSL_CTX*, const char*);
  int (*SSL_CTX_use_PrivateKey_file)(SSL_CTX*, const char*, int);
  int (*SSL_CTX_check_private_key)(const SSL_CTX*);
  SSL* (*SSL_new)(SSL_CTX*);
  void (*SSL_free)(SSL*);
  int (*SSL_set_fd)(SSL*, int);
  long (*SSL_ctrl)(SSL*, int, long, void*);
  int (*SSL_set1_host)(SSL*, const char*);
  int (*SSL_connect)(SSL*);
  int (*SSL_read)(SSL*, void*, int);
  int (*SSL_write)(SSL*, const void*, int);
  int (*SSL_get_error)(const SSL*, int);
  long (*SSL_get_verify_result)(const SSL*);
  const char* (*X509_verify_cert_error_string)(long);
  unsigned long (*ERR_get_error)();
  void (*ERR_error_string_n)(unsigned long, char*, size_t);
  void (*ERR_clear_error)();
};

// Loads libssl.so.3 once; null (with *why) when it cannot be found.
const OpenSsl* LoadOpenSsl(std::string* why) {
  static std::once_flag once;
  static OpenSsl* api = nullptr;
  static std::string error;
  std::call_once(once, [] {
    void* lib = dlopen("libssl.so.3", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      error = std::string("tls:// needs OpenSSL 3 (libssl.so.3) on this machine: ") +
              (e ? e : "not found") + "; install it (Debian/Ubuntu: libssl3) or use tcp://";
      return;
    }
    auto* a = new OpenSsl();
    bool ok = true;
    auto bind = [&](auto& fn, const char* name) {
      void* p = dlsym(lib, name);  // libssl's dependencies (libcrypto) are searched too
      if (p == nullptr && ok) {
        ok = false;
        error = std::string("tls://: libssl.so.3 lacks ") + name + "; OpenSSL 3 is needed";
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
#define FLYT_BIND(name) bind(a->name, #name)
    FLYT_BIND(TLS_client_method);
    FLYT_BIND(SSL_CTX_new);
    FLYT_BIND(SSL_CTX_free);
    FLYT_BIND(SSL_CTX_ctrl);
    FLYT_BIND(SSL_CTX_set_verify);
    FLYT_BIND(SSL_CTX_set_default_read_buffer_len);
    FLYT_BIND(SSL_CTX_load_verify_locations);
    FLYT_BIND(SSL_CTX_set_default_verify_paths);
    FLYT_BIND(SSL_CTX_use_certificate_chain_file);
    FLYT_BIND(SSL_CTX_use_PrivateKey_file);
    FLYT_BIND(SSL_CTX_check_private_key);
    FLYT_BIND(SSL_new);
    FLYT_BIND(SSL_free);
    FLYT_BIND(SSL_set_fd);
    FLYT_BIND(SSL_ctrl);
    FLYT_BIND(SSL_set1_host);
    FLYT_BIND(SSL_connect);
    FLYT_BIND(SSL_read);
    FLYT_BIND(SSL_write);
    FLYT_BIND(SSL_get_error);
    FLYT_BIND(SSL_get_verify_result);
    FLYT_BIND(X509_verify_cert_error_string);
    FLYT_BIND(ERR_get_error);
    FLYT_BIND(ERR_error_string_n);
    FLYT_BIND(ERR_clear_error);
#undef FLYT_BIND
    if (ok) {
      api = a;
    } else {
      delete a;
    }
  });
  if (api == nullptr) *why = error;
  return api;
}

std::string LastError(const OpenSsl& o) {
  unsigned long e = o.ERR_get_error();
  if (e == 0) return std::strerror(errno);
  char buf[256];
  o.ERR_error_string_n(e, buf, sizeof(buf));
  o.ERR_clear_error();
  return buf;
}

// The context: made once per process from the environment.
SSL_CTX* ClientContext(const OpenSsl& o, std::string* why) {
  static std::mutex mu;
  static SSL_CTX* ctx = nullptr;
  std::lock_guard lock(mu);
  if (ctx != nullptr) return ctx;
  SSL_CTX* c = o.SSL_CTX_new(o.TLS_client_method());
  if (c == nullptr) {
    *why = "TLS: " + LastError(o);
    return nullptr;
  }
  o.SSL_CTX_ctrl(c, kSslCtrlSetMinProtoVersion, kTls13Version, nullptr);
  o.SSL_CTX_set_verify(c, kVerifyPeer, nullptr);
  // Read ahead into a large buffer: many records per recv(), not two recv() per record.
  o.SSL_CTX_ctrl(c, kSslCtrlSetReadAhead, 1, nullptr);
  o.SSL_CTX_set_default_read_buffer_len(c, 256 << 10);
  const char* ca = std::getenv("FLYT_TLS_CA");
  const char* cert = std::getenv("FLYT_TLS_CERT");
  const char* key = std::getenv("FLYT_TLS_KEY");
  std::string err;
  if (ca != nullptr && *ca != '\0') {
    if (o.SSL_CTX_load_verify_locations(c, ca, nullptr) != 1)
      err = "FLYT_TLS_CA " + std::string(ca) + ": " + LastError(o);
  } else if (o.SSL_CTX_set_default_verify_paths(c) != 1) {
    err = "TLS: the system's trust store: " + LastError(o);
  }
  if (err.empty() && cert != nullptr && *cert != '\0') {
    if (o.SSL_CTX_use_certificate_chain_file(c, cert) != 1) {
      err = "FLYT_TLS_CERT " + std::string(cert) + ": " + LastError(o);
    } else if (key == nullptr || *key == '\0' ||
               o.SSL_CTX_use_PrivateKey_file(c, key, kFiletypePem) != 1 ||
               o.SSL_CTX_check_private_key(c) != 1) {
      err = "FLYT_TLS_KEY " + std::string(key ? key : "(unset)") +
            ": not the key of FLYT_TLS_CERT: " + LastError(o);
    }
  }
  if (!err.empty()) {
    o.SSL_CTX_free(c);
    *why = err;
    return nullptr;
  }
  ctx = c;
  return ctx;
}

// One TLS connection. The client library serialises Send and Receive on a connection (one
// lock per connection), so one SSL object serves both directions.
class TlsClientConnection final : public transport::Connection {
 public:
  TlsClientConnection(const OpenSsl& o, SSL* ssl, int fd, std::string peer)
      : o_(o), ssl_(ssl), fd_(fd), peer_(std::move(peer)) {}
  ~TlsClientConnection() override {
    if (ssl_ != nullptr) o_.SSL_free(ssl_);
    if (fd_ >= 0) ::close(fd_);
  }

  Status Send(const iovec* iov, int count) override {
    // Small pieces go out together: one record, not one per frame part.
    std::vector<uint8_t>& buf = gather_;
    buf.clear();
    for (int i = 0; i < count; ++i) {
      const auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
      size_t n = iov[i].iov_len;
      if (buf.size() + n <= kGather) {
        buf.insert(buf.end(), p, p + n);
        continue;
      }
      Status st = WriteAll(buf.data(), buf.size());
      buf.clear();
      if (st.ok()) st = WriteAll(p, n);
      if (!st.ok()) return st;
    }
    return WriteAll(buf.data(), buf.size());
  }

  Status Receive(void* dst, size_t n) override {
    // A read writes too: OpenSSL answers a failed or closing connection with an alert.
    QuietPipe quiet;
    auto* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      int chunk = n > (1u << 30) ? (1 << 30) : static_cast<int>(n);
      int r = o_.SSL_read(ssl_, out, chunk);
      if (r > 0) {
        out += r;
        n -= static_cast<size_t>(r);
        continue;
      }
      int e = o_.SSL_get_error(ssl_, r);
      if (e == kErrorZeroReturn) return Status::Error("connection closed by " + peer_);
      if ((e == kErrorWantRead || e == kErrorSyscall) && (errno == EAGAIN || errno == EWOULDBLOCK))
        return Status::Error("receive from " + peer_ + " timed out");
      if (e == kErrorSyscall && errno == EINTR) continue;
      return Status::Error("TLS receive from " + peer_ + ": " + LastError(o_));
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
  }
  void SetReceiveTimeout(int timeout_ms) override {
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  std::string Peer() const override { return peer_; }

 private:
  static constexpr size_t kGather = 16384;

  // OpenSSL writes with write(2), which raises SIGPIPE when the server has closed (it went
  // away, or a moved session's old server let go): that signal would kill the application.
  // This thread blocks it while writing (or reading, which may write an alert) and takes
  // back one the write raised; the write itself then fails with EPIPE, which is reported
  // like any lost connection.
  class QuietPipe {
   public:
    QuietPipe() {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      sigset_t pending;
      sigpending(&pending);
      was_pending_ = sigismember(&pending, SIGPIPE) == 1;
      pthread_sigmask(SIG_BLOCK, &pipe, &old_);
    }
    ~QuietPipe() {
      if (!was_pending_) {
        sigset_t pipe;
        sigemptyset(&pipe);
        sigaddset(&pipe, SIGPIPE);
        const timespec none{0, 0};
        while (sigtimedwait(&pipe, nullptr, &none) < 0 && errno == EINTR) {
        }
      }
      pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    }
    QuietPipe(const QuietPipe&) = delete;
    QuietPipe& operator=(const QuietPipe&) = delete;

   private:
    sigset_t old_;
    bool was_pending_ = false;
  };

  Status WriteAll(const uint8_t* p, size_t n) {
    QuietPipe quiet;
    while (n > 0) {
      int chunk = n > (1u << 30) ? (1 << 30) : static_cast<int>(n);
      int w = o_.SSL_write(ssl_, p, chunk);
      if (w > 0) {
        p += w;
        n -= static_cast<size_t>(w);
        continue;
      }
      if (o_.SSL_get_error(ssl_, w) == kErrorSyscall && errno == EINTR) continue;
      return Status::Error("TLS send to " + peer_ + ": " + LastError(o_));
    }
    return Status::Ok();
  }

  const OpenSsl& o_;
  SSL* ssl_;
  int fd_;
  std::string peer_;
  std::vector<uint8_t> gather_;
};

}  // namespace

Status DialTls(const transport::Address& address, const transport::Liveness& liveness,
               std::unique_ptr<transport::Connection>* out) {
  std::string why;
  const OpenSsl* o = LoadOpenSsl(&why);
  if (o == nullptr) return Status::Error(why);
  SSL_CTX* ctx = ClientContext(*o, &why);
  if (ctx == nullptr) return Status::Error(why);
  transport::Address tcp = address;
  tcp.kind = transport::Address::Kind::kTcp;
  std::unique_ptr<transport::Connection> plain;
  Status st = transport::Dial(tcp, liveness, &plain);
  if (!st.ok()) return st;
  transport::DetachedConnection socket;
  st = plain->Detach(&socket);
  if (!st.ok()) return st;
  const int fd = socket.fds.empty() ? -1 : socket.fds[0];
  const std::string peer = address.ToString();
  const char* name_env = std::getenv("FLYT_TLS_SERVER_NAME");
  const std::string name = name_env != nullptr && *name_env != '\0' ? name_env : address.host;
  SSL* ssl = o->SSL_new(ctx);
  if (ssl == nullptr || o->SSL_set_fd(ssl, fd) != 1 || o->SSL_set1_host(ssl, name.c_str()) != 1) {
    std::string e = LastError(*o);
    if (ssl != nullptr) o->SSL_free(ssl);
    ::close(fd);
    return Status::Error("TLS to " + peer + ": " + e);
  }
  o->SSL_ctrl(ssl, kSslCtrlSetTlsextHostname, 0, const_cast<char*>(name.c_str()));
  const int timeout = liveness.connect_timeout_ms > 0 ? liveness.connect_timeout_ms : 10000;
  timeval tv{timeout / 1000, (timeout % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (o->SSL_connect(ssl) != 1) {
    std::string e = LastError(*o);
    long verify = o->SSL_get_verify_result(ssl);
    if (verify != 0) e += " (" + std::string(o->X509_verify_cert_error_string(verify)) + ")";
    o->SSL_free(ssl);
    ::close(fd);
    return Status::Error("TLS handshake with " + peer + " failed: " + e +
                         "; check FLYT_TLS_CA (and FLYT_TLS_CERT/FLYT_TLS_KEY if the server "
                         "asks for a client certificate)");
  }
  timeval none{0, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
  *out = std::make_unique<TlsClientConnection>(*o, ssl, fd, peer);
  return Status::Ok();
}

}  // namespace flyt::client
