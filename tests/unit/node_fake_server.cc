// A stand-in for flyt-server in the node manager's tests: takes the same flags,
// listens on TCP (accepting nothing) and answers `stats`, `set-share`, `migrate`
// (echoing what it was asked), `checkpoint` (writes DIR/session-1.flyt) and `restore`
// (counts DIR/*.flyt) on its control socket. FAKE_MODE chooses a misbehaviour:
//   ok (default) | crash (exit 3 at once) | hang (never opens its control socket)
//   | ignore_term (SIGTERM ignored) | die_after_ms:N (exit 5 N ms after start)
//   | no_port (stats name no TCP address).
// Its stats also show what a test checks about how it was started: the token
// it got from FLYT_TOKEN, CUDA_VISIBLE_DEVICES, the MPS variables, its argv,
// and whether the cluster secret leaked into its environment.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "control/channel.h"
#include "transport/transport.h"

namespace {

using flyt::control::Json;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "tcp://127.0.0.1:0", control, argv_text;
  int64_t memory = 0, sm = 0;
  for (int i = 0; i < argc; ++i) argv_text += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "fake: %s needs a value\n", a.c_str());
      return 2;
    }
    std::string v = argv[++i];
    if (a == "--listen") {
      // The data plane is TCP only here; a node manager also asks for shm://.
      if (v.rfind("tcp://", 0) == 0) listen = v;
    } else if (a == "--control")
      control = v;
    else if (a == "--memory-quota")
      memory = std::atoll(v.c_str());
    else if (a == "--sm-count")
      sm = std::atoll(v.c_str());
    else if (a != "--backend" && a != "--token") {
      std::fprintf(stderr, "fake: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  const std::string mode = Env("FAKE_MODE");
  std::fprintf(stderr, "fake: pid %d starting in mode '%s'\n", static_cast<int>(getpid()),
               mode.c_str());
  if (mode == "crash") {
    std::fprintf(stderr, "fake: crashing on purpose\n");
    return 3;
  }
  if (mode == "hang") {
    for (;;) pause();
  }
  if (mode == "ignore_term") signal(SIGTERM, SIG_IGN);
  flyt::transport::Address addr;
  std::unique_ptr<flyt::transport::Listener> data;
  flyt::Status st = flyt::transport::ParseAddress(listen, &addr);
  if (st.ok()) st = flyt::transport::Listen(addr, &data);
  if (!st.ok()) {
    std::fprintf(stderr, "fake: %s\n", st.message().c_str());
    return 1;
  }
  const std::string tcp = data->Describe();
  std::mutex mu;
  auto start = std::chrono::steady_clock::now();
  auto handler = [&](const flyt::control::Peer&, const Json& req) -> Json {
    std::lock_guard<std::mutex> lock(mu);
    const std::string verb = req.value("verb", "");
    if (verb == "stats") {
      Json listens = Json::array();
      if (mode != "no_port") listens.push_back(tcp);
      listens.push_back(control);
      int64_t idle = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now() - start)
                         .count();
      return flyt::control::Ok({{"pid", static_cast<int64_t>(getpid())},
                                {"listen", listens},
                                {"sessions", 0},
                                {"memory_used", 4096},
                                {"memory_quota", memory},
                                {"sm", sm},
                                {"sm_total", 132},
                                {"calls", 42},
                                {"idle_ms", idle},
                                {"token", Env("FLYT_TOKEN")},
                                {"visible", Env("CUDA_VISIBLE_DEVICES")},
                                {"mps_pipe", Env("CUDA_MPS_PIPE_DIRECTORY")},
                                {"mps_mem_limit", Env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")},
                                {"mps_percentage", Env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")},
                                {"secret_leaked", !Env("FLYT_SECRET").empty()},
                                {"argv", argv_text}});
    }
    if (verb == "set-share") {
      int64_t new_sm = req.value("sm", int64_t{-1});
      if (new_sm < 0 || new_sm > 132) return flyt::control::Error("bad_request", "too many SMs");
      sm = new_sm;
      memory = req.value("memory_bytes", memory);
      return flyt::control::Ok({{"pause_us", 7}});
    }
    if (verb == "migrate") {
      return flyt::control::Ok({{"asked", 1},
                                {"moved", 1},
                                {"stayed", 0},
                                {"pending", 0},
                                {"sessions", Json::array()},
                                {"to", req.value("to", "")},
                                {"token", req.value("token", "")},
                                {"wait_ms", req.value("wait_ms", int64_t{-1})}});
    }
    if (verb == "checkpoint") {
      const std::string dir = req.value("dir", "");
      FILE* f = std::fopen((dir + "/session-1.flyt").c_str(), "w");
      if (f == nullptr) return flyt::control::Error("bad_request", "cannot write " + dir);
      std::fclose(f);
      return flyt::control::Ok({{"asked", 1},
                                {"checkpointed", 1},
                                {"stayed", 0},
                                {"pending", 0},
                                {"leave_running", req.value("leave_running", false)}});
    }
    if (verb == "restore") {
      int files = 0;
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(req.value("dir", ""), ec))
        files += e.path().extension() == ".flyt";
      return flyt::control::Ok(
          {{"files", files}, {"restored", files}, {"failed", Json::array()}, {"pending", 0}});
    }
    return flyt::control::Error("bad_request", "unknown verb");
  };
  std::unique_ptr<flyt::control::Listener> ctl;
  st = flyt::control::Listener::Start(control, flyt::control::Credentials{}, handler, &ctl);
  if (!st.ok()) {
    std::fprintf(stderr, "fake: %s\n", st.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "fake: listening on %s, control %s\n", tcp.c_str(), control.c_str());
  if (mode.rfind("die_after_ms:", 0) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(mode.c_str() + 13)));
    std::fprintf(stderr, "fake: dying on purpose\n");
    std::_Exit(5);
  }
  for (;;) pause();
}
