// Tests of src/control: framing, the HMAC handshake over real sockets, and the
// precedence of settings (file < environment < flag).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "control/channel.h"
#include "control/config.h"

namespace flyt::control {
namespace {

TEST(Hmac, Rfc4231Case2) {
  EXPECT_EQ(HmacSha256Hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(RandomHex, LengthAndVariety) {
  std::string a = RandomHex(32), b = RandomHex(32);
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
}

std::unique_ptr<Listener> EchoListener(const std::string& secret) {
  std::unique_ptr<Listener> l;
  Status s = Listener::Start(
      "tcp://127.0.0.1:0", Credentials{secret},
      [](const Peer& peer, const Json& req) {
        if (req["verb"] == "fail") return Error("no_capacity", "full");
        return Ok({{"role", peer.role}, {"name", peer.name}, {"echo", req.value("x", 0)}});
      },
      &l);
  EXPECT_TRUE(s.ok()) << s.message();
  return l;
}

TEST(Channel, AuthenticatedRoundTrip) {
  auto l = EchoListener("s3cret");
  std::unique_ptr<Channel> ch;
  Status s = Channel::Dial(l->Describe(), Credentials{"s3cret"}, "admin", "alice", 2000, &ch);
  ASSERT_TRUE(s.ok()) << s.message();
  Json answer;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(ch->Call("echo", {{"x", i}}, &answer).ok());
    EXPECT_EQ(answer["echo"], i);
    EXPECT_EQ(answer["role"], "admin");
    EXPECT_EQ(answer["name"], "alice");
  }
  s = ch->Call("fail", Json::object(), &answer);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "full");
  EXPECT_EQ(answer["code"], "no_capacity");
}

TEST(Channel, WrongSecretIsRefusedBothWays) {
  auto l = EchoListener("right");
  std::unique_ptr<Channel> ch;
  Status s = Channel::Dial(l->Describe(), Credentials{"wrong"}, "node", "n1", 2000, &ch);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("authentication failed"), std::string::npos) << s.message();
}

TEST(Channel, UnreachableNamesTheAddress) {
  std::unique_ptr<Channel> ch;
  Status s = Channel::Dial("127.0.0.1:1", Credentials{"x"}, "admin", "a", 1000, &ch);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("127.0.0.1:1"), std::string::npos) << s.message();
}

TEST(Channel, PlainUnixSocket) {
  std::string path = ::testing::TempDir() + "/ctl-" + std::to_string(::getpid()) + ".sock";
  std::unique_ptr<Listener> l;
  ASSERT_TRUE(Listener::Start(
                  "unix://" + path, Credentials{},
                  [](const Peer&, const Json&) {
                    return Ok({{"sessions", 2}});
                  },
                  &l)
                  .ok());
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  std::unique_ptr<Channel> ch;
  ASSERT_TRUE(Channel::Dial("unix://" + path, Credentials{}, "", "", 1000, &ch).ok());
  Json answer;
  ASSERT_TRUE(ch->Call("stats", Json::object(), &answer).ok());
  EXPECT_EQ(answer["sessions"], 2);
}

TEST(Secret, CreatedOnceThenReused) {
  std::string file = ::testing::TempDir() + "/flyt-secret-" + std::to_string(::getpid()) + "/s";
  std::filesystem::remove_all(std::filesystem::path(file).parent_path());
  Credentials a, b;
  ASSERT_FALSE(LoadSecret("", file, false, &a).ok());
  ASSERT_TRUE(LoadSecret("", file, true, &a).ok());
  ASSERT_TRUE(LoadSecret("", file, false, &b).ok());
  EXPECT_EQ(a.secret, b.secret);
  EXPECT_EQ(std::filesystem::status(file).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

TEST(Settings, FileThenEnvironmentThenFlag) {
  std::string file = ::testing::TempDir() + "/flyt-cfg-" + std::to_string(::getpid()) + ".toml";
  std::ofstream(file) << "[other]\nlisten = \"x\"\n[test_daemon]\nlisten = \"file:1\"\n"
                         "heartbeat_ms = 250\nratio = 1.5\nmps = true\nname = \"from-file\"\n";
  std::string listen = "default", name = "default";
  int64_t heartbeat = 1000;
  double ratio = 1;
  bool mps = false;
  Settings s("test", "test_daemon", "TD");
  s.Add("listen", &listen, "where");
  s.Add("heartbeat_ms", &heartbeat, "how often");
  s.Add("ratio", &ratio, "how much");
  s.Add("mps", &mps, "whether");
  s.Add("name", &name, "who");
  ::setenv("FLYT_TD_HEARTBEAT_MS", "500", 1);
  ::setenv("FLYT_TD_NAME", "from-env", 1);
  std::string cfg = file;
  const char* argv[] = {"test", "--config", cfg.c_str(), "--name", "from-flag", "--ratio=2.5"};
  bool help = false;
  Status st = s.Load(6, const_cast<char**>(argv), &help);
  ::unsetenv("FLYT_TD_HEARTBEAT_MS");
  ::unsetenv("FLYT_TD_NAME");
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(listen, "file:1");
  EXPECT_EQ(heartbeat, 500);
  EXPECT_EQ(name, "from-flag");
  EXPECT_DOUBLE_EQ(ratio, 2.5);
  EXPECT_TRUE(mps);
  EXPECT_NE(s.Usage().find("--heartbeat-ms (FLYT_TD_HEARTBEAT_MS"), std::string::npos);
}

TEST(Settings, ErrorsNameTheSource) {
  int64_t n = 0;
  Settings s("test", "t", "T");
  s.Add("count", &n, "a count");
  const char* bad_flag[] = {"test", "--count", "ten"};
  bool help = false;
  Status st = s.Load(3, const_cast<char**>(bad_flag), &help);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--count"), std::string::npos) << st.message();
  const char* unknown[] = {"test", "--colour", "red"};
  st = s.Load(3, const_cast<char**>(unknown), &help);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--colour"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace flyt::control
