#include "control/channel.h"

#include <algorithm>

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/log.h"

namespace flyt::control {
namespace {

constexpr const char* kProtocol = "flyt-control-v1";
constexpr int kHandshakeTimeoutMs = 5000;

std::string ToHex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out(n * 2, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  return out;
}

bool SameProof(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  return s.substr(i);
}

// Reads a string field, or "" when absent or of another type.
std::string Field(const Json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

transport::Liveness ControlLiveness(int timeout_ms) {
  transport::Liveness l;
  l.connect_timeout_ms = timeout_ms;
  l.refused_retry_ms = 0;  // callers decide whether and when to retry
  l.dead_peer_timeout_ms = 30000;
  return l;
}

}  // namespace

std::string HmacSha256Hex(const std::string& key, const std::string& data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac,
           &len) == nullptr) {
    return std::string();
  }
  return ToHex(mac, len);
}

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::string();  // callers treat an empty nonce as failure
    }
    got += static_cast<size_t>(n);
  }
  return ToHex(reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
}

Status LoadTls(const TlsFiles& files, Credentials* out) {
  if (!files.enabled()) {
    if (!files.cert.empty() || !files.key.empty())
      return Status::Error("TLS: tls_cert/tls_key are set but tls_ca is not: set all three");
    return Status::Ok();
  }
  Status s = MakeTlsContext(files, /*server=*/true, &out->tls_server);
  if (s.ok()) s = MakeTlsContext(files, /*server=*/false, &out->tls_client);
  return s;
}

Status LoadSecret(const std::string& secret, const std::string& secret_file, bool create,
                  Credentials* out) {
  if (!secret.empty()) {
    out->secret = secret;
    return Status::Ok();
  }
  if (const char* env = std::getenv("FLYT_SECRET"); env != nullptr && env[0] != '\0') {
    out->secret = env;
    return Status::Ok();
  }
  if (secret_file.empty()) {
    return Status::Error("no cluster secret: set `secret` or `secret_file` (or FLYT_SECRET)");
  }
  std::ifstream in(secret_file);
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    out->secret = Trim(ss.str());
    if (out->secret.empty()) return Status::Error("secret file " + secret_file + " is empty");
    return Status::Ok();
  }
  if (!create) {
    return Status::Error("cannot read the cluster secret file " + secret_file + ": " +
                         std::strerror(errno) +
                         "; copy it from the cluster manager's host or set `secret`");
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(secret_file).parent_path(), ec);
  std::string fresh = RandomHex(32);
  if (fresh.empty()) return Status::Error("cannot generate a secret: getrandom failed");
  int fd = ::open(secret_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Status::Error("cannot create the secret file " + secret_file + ": " +
                         std::strerror(errno));
  }
  std::string line = fresh + "\n";
  bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!ok) return Status::Error("cannot write the secret file " + secret_file);
  FLYT_INFO("created a new cluster secret in %s", secret_file.c_str());
  out->secret = fresh;
  return Status::Ok();
}

Status SendMessage(transport::Connection& conn, const Json& message) {
  std::string body = message.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (body.size() > kMaxMessage) return Status::Error("control message too large");
  uint32_t len = static_cast<uint32_t>(body.size());
  unsigned char hdr[4] = {static_cast<unsigned char>(len), static_cast<unsigned char>(len >> 8),
                          static_cast<unsigned char>(len >> 16),
                          static_cast<unsigned char>(len >> 24)};
  iovec iov[2] = {{hdr, 4}, {body.data(), body.size()}};
  return conn.Send(iov, 2);
}

Status ReceiveMessage(transport::Connection& conn, Json* out) {
  unsigned char hdr[4];
  Status s = conn.Receive(hdr, 4);
  if (!s.ok()) return s;
  uint32_t len = hdr[0] | (hdr[1] << 8) | (hdr[2] << 16) | (static_cast<uint32_t>(hdr[3]) << 24);
  if (len > kMaxMessage) {
    return Status::Error("control message of " + std::to_string(len) + " bytes from " +
                         conn.Peer() + " exceeds the limit");
  }
  std::string body(len, '\0');
  s = conn.Receive(body.data(), len);
  if (!s.ok()) return s;
  Json parsed = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return Status::Error("malformed control message from " + conn.Peer() + " (not a JSON object)");
  }
  *out = std::move(parsed);
  return Status::Ok();
}

Json Ok(Json fields) {
  if (!fields.is_object()) fields = Json::object();
  fields["ok"] = true;
  return fields;
}

Json Error(const std::string& code, const std::string& message) {
  return Json{{"ok", false}, {"code", code}, {"error", message}};
}

// ---------------------------------------------------------------- Channel

Status Channel::Dial(const std::string& address, const Credentials& creds, const std::string& role,
                     const std::string& name, int timeout_ms, std::unique_ptr<Channel>* out) {
  transport::Address addr;
  Status s = transport::ParseAddress(address, &addr);
  if (!s.ok()) return s;
  std::unique_ptr<transport::Connection> conn;
  s = transport::Dial(addr, ControlLiveness(timeout_ms), &conn);
  if (!s.ok()) return Status::Error("cannot connect to " + address + ": " + s.message());
  if (creds.tls_client) {
    s = TlsHandshake(*creds.tls_client, /*server=*/false, address,
                     timeout_ms > 0 ? timeout_ms : kHandshakeTimeoutMs, &conn);
    if (!s.ok()) return s;
  }
  conn->SetReceiveTimeout(timeout_ms > 0 ? timeout_ms : kHandshakeTimeoutMs);
  if (!creds.secret.empty()) {
    Json hello;
    s = ReceiveMessage(*conn, &hello);
    if (!s.ok()) {
      return Status::Error(
          "handshake with " + address + " failed: " + s.message() +
          (creds.tls_client
               ? ""
               : " (if that side uses TLS, set tls_ca, tls_cert and tls_key here too)"));
    }
    std::string n1 = Field(hello, "nonce");
    if (Field(hello, "flyt") != "control" || n1.size() < 32) {
      return Status::Error(address + " is not a Flyt control endpoint (unexpected greeting)");
    }
    std::string n2 = RandomHex(32);
    std::string proof = HmacSha256Hex(creds.secret, std::string(kProtocol) + "|dialer|" + role +
                                                        "|" + name + "|" + n1 + "|" + n2);
    s = SendMessage(*conn, Json{{"role", role}, {"name", name}, {"nonce", n2}, {"proof", proof}});
    Json verdict;
    if (s.ok()) s = ReceiveMessage(*conn, &verdict);
    if (!s.ok()) return Status::Error("handshake with " + address + " failed: " + s.message());
    if (!verdict.value("ok", false)) {
      return Status::Error(address + " refused us: " + verdict.value("error", "no reason given"));
    }
    std::string expect =
        HmacSha256Hex(creds.secret, std::string(kProtocol) + "|listener|" + n1 + "|" + n2);
    if (!SameProof(Field(verdict, "proof"), expect)) {
      return Status::Error(address +
                           " could not prove it knows the cluster secret: check `secret`/"
                           "`secret_file` on both sides");
    }
  }
  conn->SetReceiveTimeout(0);
  auto ch = std::unique_ptr<Channel>(new Channel());
  ch->conn_ = std::move(conn);
  ch->address_ = address;
  *out = std::move(ch);
  return Status::Ok();
}

Status Channel::Call(const std::string& verb, const Json& args, Json* answer, int timeout_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!conn_) return Status::Error("channel to " + address_ + " is closed");
  Json request = args.is_object() ? args : Json::object();
  uint64_t id = next_id_++;
  request["verb"] = verb;
  request["id"] = id;
  conn_->SetReceiveTimeout(timeout_ms);
  Status s = SendMessage(*conn_, request);
  Json reply;
  if (s.ok()) s = ReceiveMessage(*conn_, &reply);
  if (!s.ok()) {
    conn_->Shutdown();
    conn_.reset();  // the stream is out of step now: callers dial again
    return Status::Error(verb + " to " + address_ + ": " + s.message());
  }
  if (reply.value("id", uint64_t{0}) != id) {
    conn_.reset();
    return Status::Error(verb + " to " + address_ + ": answer out of order");
  }
  if (answer) *answer = reply;
  if (!reply.value("ok", false)) return Status::Error(reply.value("error", "request failed"));
  return Status::Ok();
}

void Channel::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (conn_) conn_->Shutdown();
  conn_.reset();
}

// ---------------------------------------------------------------- Listener

Status Listener::Start(const std::string& address, const Credentials& creds, Handler handler,
                       std::unique_ptr<Listener>* out) {
  transport::Address addr;
  Status s = transport::ParseAddress(address, &addr);
  if (!s.ok()) return s;
  auto l = std::unique_ptr<Listener>(new Listener());
  s = transport::Listen(addr, &l->listener_);
  if (!s.ok()) return s;
  if (addr.kind == transport::Address::Kind::kUnix) ::chmod(addr.path.c_str(), 0600);
  l->creds_ = creds;
  l->handler_ = std::move(handler);
  l->acceptor_ = std::thread([p = l.get()] { p->AcceptLoop(); });
  *out = std::move(l);
  return Status::Ok();
}

Listener::~Listener() { Stop(); }

std::string Listener::Describe() const { return listener_ ? listener_->Describe() : ""; }

void Listener::Stop() {
  if (stopping_.exchange(true)) return;
  listener_->Close();
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* c : open_) c->Shutdown();
  }
  while (serving_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

void Listener::AcceptLoop() {
  while (!stopping_.load()) {
    std::unique_ptr<transport::Connection> conn;
    Status s = listener_->Accept(&conn);
    if (!s.ok()) {
      if (!stopping_.load())
        FLYT_ERROR("control listener %s: %s", Describe().c_str(), s.message().c_str());
      return;
    }
    serving_.fetch_add(1);
    std::thread([this, c = std::move(conn)]() mutable {
      Serve(std::move(c));
      serving_.fetch_sub(1);
    }).detach();
  }
}

void Listener::Serve(std::unique_ptr<transport::Connection> conn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.load()) return;
    open_.push_back(conn.get());
  }
  Peer peer;
  peer.address = conn->Peer();
  if (creds_.tls_server) {
    // The handshake replaces the connection: Stop() must not shut down the old
    // one meanwhile (the handshake has its own timeout).
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_.erase(std::remove(open_.begin(), open_.end(), conn.get()), open_.end());
    }
    Status s =
        TlsHandshake(*creds_.tls_server, /*server=*/true, peer.address, kHandshakeTimeoutMs, &conn);
    if (!s.ok()) {
      FLYT_WARN("control %s: refused %s: %s", Describe().c_str(), peer.address.c_str(),
                s.message().c_str());
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.load()) return;
    open_.push_back(conn.get());
  }
  bool authenticated = creds_.secret.empty();
  if (!authenticated) {
    conn->SetReceiveTimeout(kHandshakeTimeoutMs);
    std::string n1 = RandomHex(32);
    Json hello;
    Status s = SendMessage(*conn, Json{{"flyt", "control"}, {"version", 1}, {"nonce", n1}});
    if (s.ok()) s = ReceiveMessage(*conn, &hello);
    if (s.ok()) {
      peer.role = Field(hello, "role");
      peer.name = Field(hello, "name");
      std::string n2 = Field(hello, "nonce");
      std::string expect =
          HmacSha256Hex(creds_.secret, std::string(kProtocol) + "|dialer|" + peer.role + "|" +
                                           peer.name + "|" + n1 + "|" + n2);
      if (n2.size() >= 32 && !n1.empty() && SameProof(Field(hello, "proof"), expect)) {
        authenticated = true;
        std::string proof =
            HmacSha256Hex(creds_.secret, std::string(kProtocol) + "|listener|" + n1 + "|" + n2);
        s = SendMessage(*conn, Json{{"ok", true}, {"proof", proof}});
        if (!s.ok()) authenticated = false;
      } else {
        FLYT_WARN("control %s: refused %s (%s/%s): wrong cluster secret", Describe().c_str(),
                  peer.address.c_str(), peer.role.c_str(), peer.name.c_str());
        SendMessage(*conn, Json{{"ok", false},
                                {"error",
                                 "authentication failed: the cluster secret does not match "
                                 "(check `secret`/`secret_file`)"}});
      }
    } else {
      FLYT_WARN("control %s: handshake with %s failed: %s", Describe().c_str(),
                peer.address.c_str(), s.message().c_str());
    }
    conn->SetReceiveTimeout(0);
  }
  while (authenticated && !stopping_.load()) {
    Json request;
    Status s = ReceiveMessage(*conn, &request);
    if (!s.ok()) {
      FLYT_DEBUG("control %s: %s", Describe().c_str(), s.message().c_str());
      break;
    }
    Json answer;
    if (!request.contains("verb") || !request["verb"].is_string()) {
      answer = Error("bad_request", "request without a verb");
    } else {
      try {
        answer = handler_(peer, request);
      } catch (const std::exception& e) {  // e.g. a field of the wrong JSON type
        answer = Error("bad_request", std::string("bad request: ") + e.what());
      }
    }
    if (request.contains("id")) answer["id"] = request["id"];
    if (!SendMessage(*conn, answer).ok()) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < open_.size(); ++i) {
    if (open_[i] == conn.get()) {
      open_.erase(open_.begin() + static_cast<long>(i));
      break;
    }
  }
}

}  // namespace flyt::control
