// transport/tls_server.h's record layer against OpenSSL's own client over a socketpair:
// the handshake, data both ways in many records, a detach and reattach mid-stream (as
// when a worker takes the connection over), and a KeyUpdate the client asks an answer to.
#include "transport/tls_server.h"

#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

using flyt::transport::Connection;
using flyt::transport::DetachedConnection;

std::string MakeCertificate(const std::string& dir) {
  const std::string cmd = "cd " + dir +
                          " && openssl req -x509 -newkey ec -pkeyopt "
                          "ec_paramgen_curve:prime256v1 -nodes -keyout key.pem -out cert.pem "
                          "-days 1 -subj /CN=tls-record-test >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0 ? dir : "";
}

std::vector<uint8_t> Pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + 7);
  return v;
}

TEST(TlsRecord, HandshakeDataDetachAndKeyUpdate) {
  char tmpl[] = "/tmp/flyt-tls-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = MakeCertificate(tmpl);
  ASSERT_FALSE(dir.empty()) << "openssl could not make a certificate";
  std::shared_ptr<flyt::transport::TlsServerContext> ctx;
  ASSERT_TRUE(
      flyt::transport::MakeTlsServerContext({dir + "/cert.pem", dir + "/key.pem", ""}, &ctx).ok());
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  const size_t kBig = 300000;  // many records, several sends

  std::string server_error;
  std::thread server([&] {
    auto fail = [&](const std::string& what, const flyt::Status& st) {
      server_error = what + ": " + st.message();
    };
    DetachedConnection raw;
    raw.kind = DetachedConnection::Kind::kSocket;
    raw.fds = {fds[1]};
    raw.peer = "test client";
    std::unique_ptr<Connection> conn;
    flyt::Status st = flyt::transport::Reattach(std::move(raw), &conn);
    if (st.ok()) st = flyt::transport::AcceptTls(*ctx, 5000, &conn);
    if (!st.ok()) return fail("accept", st);
    char hello[5];
    st = conn->Receive(hello, sizeof(hello));
    iovec reply = {const_cast<char*>("world"), 5};
    if (st.ok()) st = conn->Send(&reply, 1);
    if (!st.ok()) return fail("hello", st);
    DetachedConnection moved;  // as the main process hands it to a worker
    st = conn->Detach(&moved);
    conn.reset();
    if (st.ok()) st = flyt::transport::ReattachTls(std::move(moved), &conn);
    if (!st.ok()) return fail("detach/reattach", st);
    std::vector<uint8_t> big(kBig);
    st = conn->Receive(big.data(), big.size());  // the client updated its keys first
    iovec echo = {big.data(), big.size()};
    if (st.ok()) st = conn->Send(&echo, 1);
    if (!st.ok()) return fail("echo", st);
    uint8_t byte;
    st = conn->Receive(&byte, 1);  // the client's close_notify
    if (st.ok() || st.message().find("closed") == std::string::npos)
      server_error = "want 'connection closed', got: " + st.message();
  });

  SSL_CTX* cctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_verify(cctx, SSL_VERIFY_NONE, nullptr);
  SSL* ssl = SSL_new(cctx);
  SSL_set_fd(ssl, fds[0]);
  ASSERT_EQ(SSL_connect(ssl), 1);
  EXPECT_EQ(SSL_version(ssl), TLS1_3_VERSION);
  ASSERT_EQ(SSL_write(ssl, "hello", 5), 5);
  char world[6] = {};
  ASSERT_EQ(SSL_read(ssl, world, 5), 5);
  EXPECT_STREQ(world, "world");
  ASSERT_EQ(SSL_key_update(ssl, SSL_KEY_UPDATE_REQUESTED), 1);
  const std::vector<uint8_t> sent = Pattern(kBig);
  ASSERT_EQ(SSL_write(ssl, sent.data(), static_cast<int>(sent.size())),
            static_cast<int>(sent.size()));
  std::vector<uint8_t> got(kBig);
  size_t have = 0;
  while (have < got.size()) {
    int r = SSL_read(ssl, got.data() + have, static_cast<int>(got.size() - have));
    ASSERT_GT(r, 0) << "SSL_read failed after the key update";
    have += static_cast<size_t>(r);
  }
  EXPECT_EQ(got, sent);
  SSL_shutdown(ssl);
  server.join();
  EXPECT_EQ(server_error, "");
  SSL_free(ssl);
  SSL_CTX_free(cctx);
  close(fds[0]);
  std::system(("rm -rf " + dir).c_str());
}

TEST(TlsRecord, PlainBytesAreRefused) {
  char tmpl[] = "/tmp/flyt-tls-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = MakeCertificate(tmpl);
  ASSERT_FALSE(dir.empty());
  std::shared_ptr<flyt::transport::TlsServerContext> ctx;
  ASSERT_TRUE(
      flyt::transport::MakeTlsServerContext({dir + "/cert.pem", dir + "/key.pem", ""}, &ctx).ok());
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ASSERT_EQ(write(fds[0], "FLYT not a TLS hello\n", 21), 21);
  DetachedConnection raw;
  raw.kind = DetachedConnection::Kind::kSocket;
  raw.fds = {fds[1]};
  std::unique_ptr<Connection> conn;
  ASSERT_TRUE(flyt::transport::Reattach(std::move(raw), &conn).ok());
  flyt::Status st = flyt::transport::AcceptTls(*ctx, 2000, &conn);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("TLS handshake"), std::string::npos) << st.message();
  EXPECT_EQ(conn, nullptr);
  close(fds[0]);
  std::system(("rm -rf " + dir).c_str());
}

TEST(TlsRecord, MissingFilesAreNamed) {
  std::shared_ptr<flyt::transport::TlsServerContext> ctx;
  flyt::Status st = flyt::transport::MakeTlsServerContext(
      {"/nonexistent/cert.pem", "/nonexistent/key.pem", ""}, &ctx);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/nonexistent/cert.pem"), std::string::npos) << st.message();
}

}  // namespace
