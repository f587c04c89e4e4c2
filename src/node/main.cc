// flyt-node-manager: reports this host's GPUs to the cluster manager and runs
// the flyt-servers it asks for (docs/control_plane.md).
//
// Owns: the process — settings (control::Settings, section [node_manager],
// FLYT_NM_*), signal handling (SIGTERM/SIGINT: clean shutdown, exit 0) and
// the start-up line. Must not hold any logic of its own: NodeManager does.
#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/log.h"
#include "control/config.h"
#include "node/node_manager.h"

int main(int argc, char** argv) {
  using namespace flyt;
  log::SetProcessTag("flyt-node-manager");
  node::NodeConfig config;
  control::Settings settings("flyt-node-manager", "node_manager", "NM");
  node::RegisterSettings(&settings, &config);
  if (int rc = 0; !settings.LoadForMain(argc, argv, &rc)) return rc;
  Status st = node::ResolveDefaults(&config);
  if (!st.ok()) {
    std::fprintf(stderr, "flyt-node-manager: %s\n", st.message().c_str());
    return 2;
  }

  // Every thread inherits this mask: the signals are taken by sigwait below.
  // Children get an empty mask (node/process.cc).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  int rc = pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  if (rc != 0) {
    std::fprintf(stderr, "flyt-node-manager: pthread_sigmask: %s\n", std::strerror(rc));
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);

  node::NodeManager manager(config);
  st = manager.Start();
  if (!st.ok()) {
    std::fprintf(stderr, "flyt-node-manager: %s\n", st.message().c_str());
    manager.Shutdown();
    return 1;
  }
  std::fprintf(stderr,
               "flyt-node-manager: node %s, %zu GPU(s) (%s), listening on %s (advertised %s), "
               "cluster manager %s, MPS %s, servers in %s%s%s\n",
               config.node_id.c_str(), manager.gpus().size(), config.inventory.c_str(),
               manager.ListenAddress().c_str(), manager.AdvertisedAddress().c_str(),
               config.cluster_manager.c_str(), config.mps ? "on" : "off", config.run_dir.c_str(),
               settings.config_file().empty() ? "" : ", config ", settings.config_file().c_str());
  int sig = 0;
  for (;;) {
    rc = sigwait(&stop_signals, &sig);
    if (rc == 0) break;
    if (rc != EINTR) {
      std::fprintf(stderr, "flyt-node-manager: sigwait: %s\n", std::strerror(rc));
      break;
    }
  }
  FLYT_INFO("signal %d: stopping servers and exiting", sig);
  manager.Shutdown();
  std::fprintf(stderr, "flyt-node-manager: stopped\n");
  return 0;
}
