// flyt-server: serves the CUDA calls of remote client processes on this host's GPU.
//
// Owns: the command line, the listeners (one accept thread each) and one
// thread per session. Must not execute CUDA calls itself: sessions do.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "server/session.h"
#include "transport/transport.h"

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: flyt-server [--listen ADDR]... [--backend cuda|sim] [--token TOKEN]\n"
               "                   [--sim-record FILE]\n"
               "  ADDR: tcp://HOST:PORT (default tcp://0.0.0.0:14833) or unix:///PATH\n"
               "  --token: credential clients must present (default: $FLYT_TOKEN, else none)\n"
               "  --backend sim: host memory, records launches, runs no kernel (testing only)\n"
               "  logging: FLYT_LOG=error|warn|info|debug|trace, FLYT_LOG_FILE=PATH\n");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flyt;
  log::SetProcessTag("flyt-server");
  signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> listens;
  std::string backend = "cuda";
  server::SimOptions sim;
  auto state = std::make_unique<server::ServerState>();
  for (int i = 0; i < argc; ++i) state->argv.push_back(argv[i]);
  if (const char* t = std::getenv("FLYT_TOKEN")) state->token = t;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* name) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "flyt-server: %s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--listen") {
      listens.push_back(value("--listen"));
    } else if (arg == "--backend") {
      backend = value("--backend");
    } else if (arg == "--token") {
      state->token = value("--token");
    } else if (arg == "--sim-record") {
      sim.record_path = value("--sim-record");
    } else if (arg == "-h" || arg == "--help") {
      Usage();
      return 0;
    } else {
      std::fprintf(stderr, "flyt-server: unknown argument '%s'\n", arg.c_str());
      Usage();
      return 2;
    }
  }
  if (listens.empty()) listens.push_back("tcp://0.0.0.0:14833");
  Status st;
  if (backend == "cuda") {
    st = server::LoadCudaDriver(&state->api);
  } else if (backend == "sim") {
    st = server::LoadSimDriver(sim, &state->api);
  } else {
    std::fprintf(stderr, "flyt-server: unknown backend '%s' (cuda or sim)\n", backend.c_str());
    return 2;
  }
  if (st.ok()) st = server::DescribeDevices(state.get());
  if (st.ok() && backend == "cuda") st = server::CaptureDeviceOutput(state.get());
  if (!st.ok()) {
    std::fprintf(stderr, "flyt-server: %s\n", st.message().c_str());
    return 1;
  }
  std::vector<std::unique_ptr<transport::Listener>> listeners;
  for (const auto& text : listens) {
    transport::Address addr;
    st = transport::ParseAddress(text, &addr);
    std::unique_ptr<transport::Listener> l;
    if (st.ok()) st = transport::Listen(addr, &l);
    if (!st.ok()) {
      std::fprintf(stderr, "flyt-server: %s\n", st.message().c_str());
      return 1;
    }
    listeners.push_back(std::move(l));
  }
  std::fprintf(stderr, "flyt-server: %s backend, %zu GPU(s), driver %d, listening on",
               backend.c_str(), state->devices.size(), state->driver_version);
  for (auto& l : listeners) std::fprintf(stderr, " %s", l->Describe().c_str());
  std::fprintf(stderr, "%s\n", state->token.empty() ? " (no token required)" : "");
  std::vector<std::thread> acceptors;
  server::ServerState* shared = state.get();
  for (auto& l : listeners) {
    acceptors.emplace_back([shared, listener = l.get()] {
      for (;;) {
        std::unique_ptr<transport::Connection> conn;
        Status s = listener->Accept(&conn);
        if (!s.ok()) {
          FLYT_ERROR("%s: %s", listener->Describe().c_str(), s.message().c_str());
          return;
        }
        std::thread([shared, c = std::move(conn)]() mutable {
          server::Session session(shared, std::move(c));
          session.Run();
        }).detach();
      }
    });
  }
  for (auto& t : acceptors) t.join();
  return 1;
}
