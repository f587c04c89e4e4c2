// flyt-emulator-validation: checks the network emulator (transport/emulated_transport.h)
// against its own model over real loopback TCP. Each row: a client sends ROUNDS
// messages of SIZE bytes and waits for a 4-byte reply each round; both sides wrap
// their connection with the same emulation settings (the client models the
// request direction, the server the reply direction). Prints a Markdown table of
// the predicted total (the model, replies included), the measured total and the
// error, plus the same exchange without emulation for reference.
// Usage: flyt-emulator-validation [--rounds-scale F]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "transport/emulated_transport.h"
#include "transport/transport.h"

namespace {

using flyt::Status;
using namespace flyt::transport;
using Clock = std::chrono::steady_clock;

struct Row {
  int rounds;
  size_t size;
  EmulationSettings emu;
};

constexpr size_t kReply = 4;

// One exchange of `rounds` round trips; returns seconds, or a negative value on failure.
double Exchange(const Row& row, bool emulate) {
  Address addr;
  std::unique_ptr<Listener> listener;
  Status st = ParseAddress("tcp://127.0.0.1:0", &addr);
  if (st.ok()) st = Listen(addr, &listener);
  if (!st.ok()) {
    std::fprintf(stderr, "listen: %s\n", st.message().c_str());
    return -1;
  }
  Address bound;
  ParseAddress(listener->Describe(), &bound);
  bool server_ok = true;
  std::thread server([&] {
    std::unique_ptr<Connection> conn;
    Status s = listener->Accept(&conn);
    if (s.ok() && emulate) conn = WrapEmulated(std::move(conn), row.emu);
    std::vector<uint8_t> buf(row.size);
    uint32_t reply = 0x600d;
    for (int i = 0; s.ok() && i < row.rounds; ++i) {
      s = conn->Receive(buf.data(), buf.size());
      iovec v{&reply, kReply};
      if (s.ok()) s = conn->Send(&v, 1);
    }
    if (!s.ok()) {
      std::fprintf(stderr, "server: %s\n", s.message().c_str());
      server_ok = false;
    }
    conn.reset();  // delivers the last reply before closing
  });
  std::unique_ptr<Connection> conn;
  st = Dial(bound, Liveness{}, &conn);
  if (st.ok() && emulate) conn = WrapEmulated(std::move(conn), row.emu);
  std::vector<uint8_t> msg(row.size, 0x5a);
  uint32_t reply = 0;
  Clock::time_point t0 = Clock::now();
  for (int i = 0; st.ok() && i < row.rounds; ++i) {
    iovec v{msg.data(), msg.size()};
    st = conn->Send(&v, 1);
    if (st.ok()) st = conn->Receive(&reply, kReply);
  }
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!st.ok()) std::fprintf(stderr, "client: %s\n", st.message().c_str());
  conn.reset();
  server.join();
  return st.ok() && server_ok ? seconds : -1;
}

std::string Size(size_t bytes) {
  if (bytes >= (1 << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1 << 10)) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

std::string Bandwidth(double gbit) {
  char b[32];
  if (gbit <= 0) return "unlimited";
  std::snprintf(b, sizeof(b), "%g Gbit/s", gbit);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  double scale = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds-scale") == 0 && i + 1 < argc) {
      scale = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--rounds-scale F]\n", argv[0]);
      return 2;
    }
  }
  auto rounds = [&](int n) { return std::max(1, static_cast<int>(std::lround(n * scale))); };
  const Row rows[] = {
      {rounds(100), size_t{16} << 20, {100, 1}},
      {rounds(100), size_t{16} << 20, {1000, 10}},
      {rounds(1000), 64, {100, 1}},
  };
  std::printf(
      "| rounds | size | reply | rtt | bandwidth | predicted total | measured total | error | "
      "unemulated loopback |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  int rc = 0;
  for (const Row& row : rows) {
    double predicted =
        row.rounds * (row.emu.TransitNs(row.size) + row.emu.TransitNs(kReply)) * 1e-9;
    double raw = Exchange(row, false);
    double measured = Exchange(row, true);
    if (raw < 0 || measured < 0) {
      rc = 1;
      continue;
    }
    double error = (measured - predicted) / predicted * 100;
    std::printf("| %d | %s | %zu B | %g us | %s | %.4f s | %.4f s | %+.2f %% | %.4f s |\n",
                row.rounds, Size(row.size).c_str(), kReply, row.emu.rtt_us,
                Bandwidth(row.emu.bandwidth_gbit).c_str(), predicted, measured, error, raw);
    std::fflush(stdout);
    if (std::fabs(error) > 5) rc = rc == 0 ? 3 : rc;
  }
  return rc;
}
