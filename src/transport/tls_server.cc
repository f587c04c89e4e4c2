// Implementation of transport/tls_server.h.
#include "transport/tls_server.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

namespace flyt::transport {
namespace {

constexpr size_t kMaxPlain = 16384;             // RFC 8446 5.1
constexpr size_t kMaxCipher = kMaxPlain + 256;  // RFC 8446 5.2
constexpr size_t kTagBytes = 16;
constexpr uint8_t kApplicationData = 23, kAlert = 21, kHandshake = 22;
constexpr uint8_t kKeyUpdate = 24;
constexpr size_t kReadChunk = 256 << 10;

std::string OpenSslError() {
  unsigned long e = ERR_get_error();
  if (e == 0) return "no details";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

enum class Suite : uint16_t { kAes128GcmSha256 = 1, kAes256GcmSha384 = 2 };

const EVP_MD* SuiteHash(Suite s) {
  return s == Suite::kAes128GcmSha256 ? EVP_sha256() : EVP_sha384();
}
const EVP_CIPHER* SuiteCipher(Suite s) {
  return s == Suite::kAes128GcmSha256 ? EVP_aes_128_gcm() : EVP_aes_256_gcm();
}
size_t SuiteKeyBytes(Suite s) { return s == Suite::kAes128GcmSha256 ? 16 : 32; }

// HKDF-Expand-Label(secret, label, "", length), RFC 8446 7.1.
bool ExpandLabel(Suite suite, const std::vector<uint8_t>& secret, const char* label, uint8_t* out,
                 size_t length) {
  std::vector<uint8_t> info;
  info.push_back(static_cast<uint8_t>(length >> 8));
  info.push_back(static_cast<uint8_t>(length));
  const std::string full = std::string("tls13 ") + label;
  info.push_back(static_cast<uint8_t>(full.size()));
  info.insert(info.end(), full.begin(), full.end());
  info.push_back(0);  // empty context
  std::vector<uint8_t> t;
  size_t done = 0;
  for (uint8_t i = 1; done < length; ++i) {  // HKDF-Expand, RFC 5869 2.3
    std::vector<uint8_t> in = t;
    in.insert(in.end(), info.begin(), info.end());
    in.push_back(i);
    uint8_t block[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    if (HMAC(SuiteHash(suite), secret.data(), static_cast<int>(secret.size()), in.data(), in.size(),
             block, &len) == nullptr)
      return false;
    t.assign(block, block + len);
    size_t take = length - done < len ? length - done : len;
    std::memcpy(out + done, block, take);
    done += take;
  }
  return true;
}

// One direction's protection: traffic secret, key, IV and record sequence number.
class Direction {
 public:
  Direction() : ctx_(EVP_CIPHER_CTX_new()) {}
  ~Direction() { EVP_CIPHER_CTX_free(ctx_); }
  Direction(const Direction&) = delete;
  Direction& operator=(const Direction&) = delete;

  // `sealing`: this direction encrypts (our writes) rather than decrypts (our reads).
  bool Init(Suite suite, bool sealing, std::vector<uint8_t> secret, uint64_t seq) {
    suite_ = suite;
    sealing_ = sealing;
    secret_ = std::move(secret);
    seq_ = seq;
    if (ctx_ == nullptr || !ExpandLabel(suite, secret_, "key", key_, SuiteKeyBytes(suite)) ||
        !ExpandLabel(suite, secret_, "iv", iv_, sizeof(iv_)))
      return false;
    // The key schedule once; each record then sets only its nonce.
    return sealing ? EVP_EncryptInit_ex(ctx_, SuiteCipher(suite), nullptr, key_, nullptr) == 1
                   : EVP_DecryptInit_ex(ctx_, SuiteCipher(suite), nullptr, key_, nullptr) == 1;
  }
  // RFC 8446 7.2: the next generation of the secret.
  bool Update() {
    std::vector<uint8_t> next(secret_.size());
    return ExpandLabel(suite_, secret_, "traffic upd", next.data(), next.size()) &&
           Init(suite_, sealing_, std::move(next), 0);
  }

  // header (5 bytes, the AAD) + plaintext in pieces -> out (ciphertext, then the tag).
  bool Seal(const uint8_t* header, const iovec* pieces, int count, uint8_t* out) {
    uint8_t nonce[12];
    Nonce(nonce);
    int len = 0;
    bool ok = EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, nonce) == 1 &&
              EVP_EncryptUpdate(ctx_, nullptr, &len, header, 5) == 1;
    size_t at = 0;
    for (int i = 0; ok && i < count; ++i) {
      ok = EVP_EncryptUpdate(ctx_, out + at, &len, static_cast<const uint8_t*>(pieces[i].iov_base),
                             static_cast<int>(pieces[i].iov_len)) == 1;
      at += static_cast<size_t>(len);
    }
    ok = ok && EVP_EncryptFinal_ex(ctx_, out + at, &len) == 1 &&
         EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, kTagBytes, out + at + len) == 1;
    ++seq_;
    return ok;
  }
  // header + ciphertext with tag (n bytes) -> plain (n - 16 bytes); false if forged.
  bool Open(const uint8_t* header, const uint8_t* cipher, size_t n, uint8_t* plain) {
    if (n < kTagBytes) return false;
    uint8_t nonce[12];
    Nonce(nonce);
    int len = 0;
    uint8_t tag[kTagBytes];
    std::memcpy(tag, cipher + n - kTagBytes, kTagBytes);
    bool ok = EVP_DecryptInit_ex(ctx_, nullptr, nullptr, nullptr, nonce) == 1 &&
              EVP_DecryptUpdate(ctx_, nullptr, &len, header, 5) == 1 &&
              EVP_DecryptUpdate(ctx_, plain, &len, cipher, static_cast<int>(n - kTagBytes)) == 1 &&
              EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) == 1 &&
              EVP_DecryptFinal_ex(ctx_, plain + len, &len) == 1;
    ++seq_;
    return ok;
  }

  void Save(std::vector<uint8_t>* out) const {
    out->push_back(static_cast<uint8_t>(secret_.size()));
    out->insert(out->end(), secret_.begin(), secret_.end());
    for (int i = 0; i < 8; ++i) out->push_back(static_cast<uint8_t>(seq_ >> (8 * i)));
  }
  static bool Load(const std::vector<uint8_t>& in, size_t* at, std::vector<uint8_t>* secret,
                   uint64_t* seq) {
    if (*at >= in.size()) return false;
    size_t n = in[(*at)++];
    if (n > 64 || *at + n + 8 > in.size()) return false;
    secret->assign(in.begin() + static_cast<std::ptrdiff_t>(*at),
                   in.begin() + static_cast<std::ptrdiff_t>(*at + n));
    *at += n;
    *seq = 0;
    for (int i = 0; i < 8; ++i) *seq |= uint64_t{in[(*at)++]} << (8 * i);
    return true;
  }

 private:
  void Nonce(uint8_t nonce[12]) const {
    std::memcpy(nonce, iv_, 12);
    for (int i = 0; i < 8; ++i) nonce[11 - i] ^= static_cast<uint8_t>(seq_ >> (8 * i));
  }

  EVP_CIPHER_CTX* ctx_;
  Suite suite_ = Suite::kAes128GcmSha256;
  bool sealing_ = false;
  std::vector<uint8_t> secret_;
  uint8_t key_[32] = {};
  uint8_t iv_[12] = {};
  uint64_t seq_ = 0;
};

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// TLS 1.3 records on a socket, protected by this process (see the header).
class TlsRecordConnection final : public Connection {
 public:
  TlsRecordConnection(int fd, std::string peer, Suite suite)
      : fd_(fd), peer_(std::move(peer)), suite_(suite) {}
  ~TlsRecordConnection() override {
    if (fd_ >= 0) ::close(fd_);
  }

  bool Init(std::vector<uint8_t> read_secret, uint64_t read_seq, std::vector<uint8_t> write_secret,
            uint64_t write_seq) {
    return read_.Init(suite_, false, std::move(read_secret), read_seq) &&
           write_.Init(suite_, true, std::move(write_secret), write_seq);
  }
  void Preload(std::vector<uint8_t> plain, const std::vector<uint8_t>& raw) {
    plain_ = std::move(plain);
    plain_at_ = 0;
    Grow(raw.size() + kReadChunk);
    if (!raw.empty()) std::memcpy(raw_.get(), raw.data(), raw.size());
    raw_len_ = raw.size();
  }

  Status Send(const iovec* iov, int count) override {
    std::lock_guard lock(write_mu_);
    out_.clear();
    // Records of up to kMaxPlain bytes, each sealed straight from the caller's pieces.
    std::vector<iovec> record;
    size_t record_bytes = 0;
    for (int i = 0; i < count; ++i) {
      const auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
      size_t n = iov[i].iov_len;
      while (n > 0) {
        size_t take = kMaxPlain - record_bytes < n ? kMaxPlain - record_bytes : n;
        record.push_back({const_cast<uint8_t*>(p), take});
        record_bytes += take;
        p += take;
        n -= take;
        if (record_bytes == kMaxPlain) {
          if (!SealRecord(kApplicationData, record)) return Status::Error("TLS: cannot encrypt");
          record.clear();
          record_bytes = 0;
          if (out_.size() >= (size_t{1} << 20)) {
            Status st = Flush();
            if (!st.ok()) return st;
          }
        }
      }
    }
    if (record_bytes > 0 && !SealRecord(kApplicationData, record))
      return Status::Error("TLS: cannot encrypt");
    return Flush();
  }

  Status Receive(void* dst, size_t n) override {
    auto* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      if (plain_at_ < plain_.size()) {
        size_t take = plain_.size() - plain_at_ < n ? plain_.size() - plain_at_ : n;
        std::memcpy(out, plain_.data() + plain_at_, take);
        plain_at_ += take;
        out += take;
        n -= take;
        continue;
      }
      Status st = ReadRecord();
      if (!st.ok()) return st;
    }
    return Status::Ok();
  }

  void Shutdown() override {
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  }
  void AbandonAfterFork() override {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void SetReceiveTimeout(int timeout_ms) override {
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  std::string Peer() const override { return peer_; }

  Status Detach(DetachedConnection* out) override {
    if (fd_ < 0) return Status::Error("connection to " + peer_ + " is already closed");
    std::lock_guard lock(write_mu_);
    std::vector<uint8_t> s;
    s.push_back(static_cast<uint8_t>(suite_));
    read_.Save(&s);
    write_.Save(&s);
    auto put = [&s](const uint8_t* p, size_t n) {
      for (int i = 0; i < 4; ++i) s.push_back(static_cast<uint8_t>(n >> (8 * i)));
      s.insert(s.end(), p, p + n);
    };
    put(plain_.data() + plain_at_, plain_.size() - plain_at_);
    put(raw_.get() + raw_at_, raw_len_ - raw_at_);
    out->kind = DetachedConnection::Kind::kTls;
    out->fds = {fd_};
    out->state = std::move(s);
    out->peer = peer_;
    fd_ = -1;
    return Status::Ok();
  }

 private:
  // Appends one record (the pieces, then the content type) to out_.
  bool SealRecord(uint8_t type, std::vector<iovec>& pieces) {
    size_t plain_len = 1;
    for (const iovec& v : pieces) plain_len += v.iov_len;
    pieces.push_back({&type, 1});  // TLSInnerPlaintext: content, type, no padding
    const size_t cipher_len = plain_len + kTagBytes;
    const uint8_t header[5] = {kApplicationData, 3, 3, static_cast<uint8_t>(cipher_len >> 8),
                               static_cast<uint8_t>(cipher_len)};
    const size_t at = out_.size();
    out_.resize(at + 5 + cipher_len);
    std::memcpy(out_.data() + at, header, 5);
    bool ok =
        write_.Seal(header, pieces.data(), static_cast<int>(pieces.size()), out_.data() + at + 5);
    pieces.pop_back();
    return ok;
  }

  Status Flush() {
    size_t at = 0;
    while (at < out_.size()) {
      ssize_t w = ::send(fd_, out_.data() + at, out_.size() - at, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Status::Error(Errno("send to " + peer_));
      at += static_cast<size_t>(w);
    }
    out_.clear();
    return Status::Ok();
  }

  // At least `want` unread raw bytes, reading the socket as needed (a plain buffer: a
  // vector would zero what recv() is about to write).
  Status Fill(size_t want) {
    while (raw_len_ - raw_at_ < want) {
      if (raw_at_ > 0 && raw_cap_ - raw_len_ < kMaxCipher + 5) {
        std::memmove(raw_.get(), raw_.get() + raw_at_, raw_len_ - raw_at_);
        raw_len_ -= raw_at_;
        raw_at_ = 0;
      }
      if (raw_cap_ - raw_len_ < kMaxCipher + 5) Grow(raw_len_ + kReadChunk);
      ssize_t r = ::recv(fd_, raw_.get() + raw_len_, raw_cap_ - raw_len_, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) return Status::Error("connection closed by " + peer_);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return Status::Error("receive from " + peer_ + " timed out");
      if (r < 0) return Status::Error(Errno("receive from " + peer_));
      raw_len_ += static_cast<size_t>(r);
    }
    return Status::Ok();
  }
  void Grow(size_t cap) {
    std::unique_ptr<uint8_t[]> bigger(new uint8_t[cap]);
    if (raw_len_ > 0) std::memcpy(bigger.get(), raw_.get(), raw_len_);
    raw_ = std::move(bigger);
    raw_cap_ = cap;
  }

  // Reads, checks and decrypts one record; application data lands in plain_.
  Status ReadRecord() {
    Status st = Fill(5);
    if (!st.ok()) return st;
    uint8_t header[5];
    std::memcpy(header, raw_.get() + raw_at_, 5);
    const size_t len = (size_t{header[3]} << 8) | header[4];
    if (header[0] != kApplicationData || header[1] != 3 || len > kMaxCipher || len < kTagBytes + 1)
      return Status::Error("TLS: malformed record from " + peer_);
    st = Fill(5 + len);
    if (!st.ok()) return st;
    std::vector<uint8_t>& inner = plain_;  // decrypted in place of the consumed plaintext
    inner.resize(len - kTagBytes);
    plain_at_ = 0;
    if (!read_.Open(header, raw_.get() + raw_at_ + 5, len, inner.data()))
      return Status::Error("TLS: a record from " + peer_ + " failed authentication");
    raw_at_ += 5 + len;
    while (!inner.empty() && inner.back() == 0) inner.pop_back();  // padding
    if (inner.empty()) return Status::Error("TLS: record without a content type from " + peer_);
    const uint8_t type = inner.back();
    inner.pop_back();
    if (type == kApplicationData) return Status::Ok();
    // Not application data: nothing for Receive once it is understood.
    const std::vector<uint8_t> message(inner.begin(), inner.end());
    plain_.clear();
    if (type == kAlert) {
      if (message.size() == 2 && message[1] == 0)
        return Status::Error("connection closed by " + peer_);
      return Status::Error("TLS alert " + std::to_string(message.size() == 2 ? message[1] : 0) +
                           " from " + peer_);
    }
    if (type == kHandshake && message.size() == 5 && message[0] == kKeyUpdate && message[1] == 0 &&
        message[2] == 0 && message[3] == 1 && message[4] <= 1) {
      if (!read_.Update()) return Status::Error("TLS: key update failed");
      if (message[4] == 1) {  // update_requested: answer, then switch our own keys
        std::lock_guard lock(write_mu_);
        out_.clear();
        uint8_t msg[5] = {kKeyUpdate, 0, 0, 1, 0};
        std::vector<iovec> piece = {{msg, sizeof(msg)}};
        if (!SealRecord(kHandshake, piece)) return Status::Error("TLS: cannot encrypt");
        st = Flush();
        if (!st.ok()) return st;
        if (!write_.Update()) return Status::Error("TLS: key update failed");
      }
      return Status::Ok();
    }
    return Status::Error("TLS: unexpected message (type " + std::to_string(type) + ") from " +
                         peer_);
  }

  int fd_;
  std::string peer_;
  Suite suite_;
  Direction read_, write_;
  std::mutex write_mu_;  // Send, Detach and a KeyUpdate answer write
  std::vector<uint8_t> out_;
  std::vector<uint8_t> plain_;
  size_t plain_at_ = 0;
  std::unique_ptr<uint8_t[]> raw_;  // received, not yet decrypted: [raw_at_, raw_len_)
  size_t raw_cap_ = 0, raw_len_ = 0, raw_at_ = 0;
};

// Traffic secrets the key-log callback saw during one handshake.
struct Secrets {
  std::vector<uint8_t> client, server;
};

bool Unhex(const char* hex, std::vector<uint8_t>* out) {
  out->clear();
  for (const char* p = hex; p[0] != '\0' && p[0] != ' ' && p[1] != '\0'; p += 2) {
    auto v = [](char c) { return c >= 'a' ? c - 'a' + 10 : c >= 'A' ? c - 'A' + 10 : c - '0'; };
    out->push_back(static_cast<uint8_t>(v(p[0]) << 4 | v(p[1])));
  }
  return !out->empty() && out->size() <= 64;
}

void KeyLog(const SSL* ssl, const char* line) {
  auto* secrets = static_cast<Secrets*>(SSL_get_ex_data(ssl, 0));
  if (secrets == nullptr) return;
  const char* last = std::strrchr(line, ' ');
  if (last == nullptr) return;
  if (std::strncmp(line, "CLIENT_TRAFFIC_SECRET_0 ", 24) == 0) Unhex(last + 1, &secrets->client);
  if (std::strncmp(line, "SERVER_TRAFFIC_SECRET_0 ", 24) == 0) Unhex(last + 1, &secrets->server);
}

}  // namespace

class TlsServerContext {
 public:
  explicit TlsServerContext(SSL_CTX* ctx) : ctx_(ctx) {}
  ~TlsServerContext() { SSL_CTX_free(ctx_); }
  SSL_CTX* get() const { return ctx_; }

 private:
  SSL_CTX* ctx_;
};

Status MakeTlsServerContext(const TlsServerFiles& files, std::shared_ptr<TlsServerContext>* out) {
  if (files.cert.empty() || files.key.empty())
    return Status::Error("tls:// needs the server's certificate and key (--tls-cert, --tls-key)");
  SSL_CTX* raw = SSL_CTX_new(TLS_server_method());
  if (raw == nullptr) return Status::Error("TLS: " + OpenSslError());
  auto ctx = std::make_shared<TlsServerContext>(raw);
  SSL_CTX_set_min_proto_version(raw, TLS1_3_VERSION);
  SSL_CTX_set_num_tickets(raw, 0);
  if (SSL_CTX_set_ciphersuites(raw, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384") != 1)
    return Status::Error("TLS: " + OpenSslError());
  if (SSL_CTX_use_certificate_chain_file(raw, files.cert.c_str()) != 1)
    return Status::Error("TLS certificate " + files.cert + ": " + OpenSslError());
  if (SSL_CTX_use_PrivateKey_file(raw, files.key.c_str(), SSL_FILETYPE_PEM) != 1)
    return Status::Error("TLS key " + files.key + ": " + OpenSslError());
  if (SSL_CTX_check_private_key(raw) != 1)
    return Status::Error("TLS key " + files.key + " does not match certificate " + files.cert);
  if (!files.ca.empty()) {
    if (SSL_CTX_load_verify_locations(raw, files.ca.c_str(), nullptr) != 1)
      return Status::Error("TLS CA " + files.ca + ": " + OpenSslError());
    SSL_CTX_set_verify(raw, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  SSL_CTX_set_keylog_callback(raw, KeyLog);
  *out = std::move(ctx);
  return Status::Ok();
}

Status AcceptTls(const TlsServerContext& ctx, int timeout_ms, std::unique_ptr<Connection>* conn) {
  const std::string peer = (*conn)->Peer();
  DetachedConnection socket;
  Status st = (*conn)->Detach(&socket);
  conn->reset();
  if (!st.ok()) return st;
  if (socket.kind != DetachedConnection::Kind::kSocket || socket.fds.size() != 1 ||
      !socket.state.empty()) {
    CloseDetached(&socket);
    return Status::Error("TLS: " + peer + " is not a fresh TCP connection");
  }
  const int fd = socket.fds[0];
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  Secrets secrets;
  SSL* ssl = SSL_new(ctx.get());
  bool ok = ssl != nullptr && SSL_set_fd(ssl, fd) == 1 && SSL_set_ex_data(ssl, 0, &secrets) == 1;
  std::string why;
  if (ok && SSL_accept(ssl) != 1) {
    ok = false;
    why = OpenSslError();
    long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK) why += " (" + std::string(X509_verify_cert_error_string(verify)) + ")";
  }
  Suite suite = Suite::kAes128GcmSha256;
  if (ok) {
    const char* name = SSL_CIPHER_get_name(SSL_get_current_cipher(ssl));
    if (name != nullptr && std::strcmp(name, "TLS_AES_256_GCM_SHA384") == 0)
      suite = Suite::kAes256GcmSha384;
    ok = SSL_version(ssl) == TLS1_3_VERSION && !secrets.client.empty() && !secrets.server.empty();
    if (!ok) why = "no TLS 1.3 traffic secrets";
  }
  if (ssl != nullptr) SSL_free(ssl);  // no close_notify: the connection goes on
  ERR_clear_error();
  if (!ok) {
    ::close(fd);
    return Status::Error("TLS handshake with " + peer + " failed: " + why);
  }
  timeval none{0, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none));
  auto tls = std::make_unique<TlsRecordConnection>(fd, peer, suite);
  if (!tls->Init(std::move(secrets.client), 0, std::move(secrets.server), 0))
    return Status::Error("TLS: cannot derive the traffic keys");
  *conn = std::move(tls);
  return Status::Ok();
}

Status ReattachTls(DetachedConnection&& d, std::unique_ptr<Connection>* out) {
  const auto& s = d.state;
  size_t at = 1;
  std::vector<uint8_t> read_secret, write_secret, plain, raw;
  uint64_t read_seq = 0, write_seq = 0;
  auto get = [&s, &at](std::vector<uint8_t>* v) {
    if (at + 4 > s.size()) return false;
    size_t n = 0;
    for (int i = 0; i < 4; ++i) n |= size_t{s[at++]} << (8 * i);
    if (n > s.size() - at) return false;
    v->assign(s.begin() + static_cast<std::ptrdiff_t>(at),
              s.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
    return true;
  };
  bool ok = d.kind == DetachedConnection::Kind::kTls && d.fds.size() == 1 && d.fds[0] >= 0 &&
            !s.empty() && (s[0] == 1 || s[0] == 2) &&
            Direction::Load(s, &at, &read_secret, &read_seq) &&
            Direction::Load(s, &at, &write_secret, &write_seq) && get(&plain) && get(&raw) &&
            at == s.size();
  if (!ok) {
    CloseDetached(&d);
    return Status::Error("reattach: not a detached TLS connection");
  }
  auto conn = std::make_unique<TlsRecordConnection>(d.fds[0], d.peer, static_cast<Suite>(s[0]));
  d.fds.clear();
  if (!conn->Init(std::move(read_secret), read_seq, std::move(write_secret), write_seq))
    return Status::Error("reattach: cannot derive the TLS traffic keys");
  conn->Preload(std::move(plain), raw);
  *out = std::move(conn);
  return Status::Ok();
}

}  // namespace flyt::transport
