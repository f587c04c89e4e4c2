// flyt-client-manager: settings and start-up of the client manager
// (client_manager.h). Must not answer requests itself.
#include <signal.h>

#include <cstdio>

#include "client_manager/client_manager.h"
#include "common/client_manager_socket.h"
#include "common/log.h"
#include "control/config.h"

int main(int argc, char** argv) {
  using namespace flyt;
  log::SetProcessTag("flyt-client-manager");
  signal(SIGPIPE, SIG_IGN);
  client_manager::Options opt;
  opt.socket_path = ClientManagerSocket();
  opt.cluster_manager = "127.0.0.1:12400";
  std::string secret, secret_file = control::DefaultStateDir() + "/cluster.secret";
  control::Settings settings("flyt-client-manager", "client_manager", "CLM");
  settings.Add("socket", &opt.socket_path,
               "Unix socket the client library asks (its FLYT_CLIENT_MANAGER)");
  settings.Add("cluster_manager", &opt.cluster_manager, "host:port of flyt-cluster-manager");
  settings.Add("vm_ip", &opt.vm_ip,
               "this VM's IP as recorded in vm_required_resources (default: first non-loopback "
               "IPv4 address)");
  settings.Add("secret", &secret, "shared cluster secret (or FLYT_SECRET)");
  settings.Add("secret_file", &secret_file, "file holding the cluster secret");
  control::TlsFiles tls;
  control::AddTlsSettings(&settings, &tls);
  settings.Add("request_timeout_ms", &opt.request_timeout_ms,
               "how long an allocation (which may start a server) may take");
  if (int rc = 0; !settings.LoadForMain(argc, argv, &rc)) return rc;
  if (opt.vm_ip.empty()) opt.vm_ip = control::DefaultHostAddress();
  control::Credentials creds;
  Status st = control::LoadSecret(secret, secret_file, /*create=*/false, &creds);
  if (st.ok()) st = control::LoadTls(tls, &creds);
  if (!st.ok()) {
    std::fprintf(stderr, "flyt-client-manager: %s\n", st.message().c_str());
    return 1;
  }
  client_manager::ClientManager manager(opt, creds);
  std::fprintf(stderr, "flyt-client-manager: VM %s, cluster manager %s, socket %s\n",
               opt.vm_ip.c_str(), opt.cluster_manager.c_str(), opt.socket_path.c_str());
  st = manager.Serve();
  std::fprintf(stderr, "flyt-client-manager: %s\n", st.message().c_str());
  return 1;
}
