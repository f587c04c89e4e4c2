// flyt-cluster-manager: the cluster's public endpoint (see cluster_manager.h).
//
// Owns: settings, opening the database, the control listener and signal
// handling. Must not decide anything itself: ClusterManager does.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "cluster/cluster_manager.h"
#include "cluster/dashboard_page.h"
#include "cluster/http_endpoint.h"
#include "common/log.h"
#include "control/config.h"

int main(int argc, char** argv) {
  using namespace flyt;
  log::SetProcessTag("flyt-cluster-manager");
  signal(SIGPIPE, SIG_IGN);
  std::string state_dir = control::DefaultStateDir();
  std::string listen = "0.0.0.0:12400";
  std::string metrics_listen = "0.0.0.0:12403";
  std::string database;
  std::string secret, secret_file;
  std::string policy = "spread";
  cluster::ClusterOptions opt;
  control::TlsFiles tls;
  bool over_sm = false, over_mem = false;
  control::Settings settings("flyt-cluster-manager", "cluster_manager", "CM");
  settings.Add("listen", &listen, "address node managers, client managers and flytctl dial");
  settings.Add("metrics_listen", &metrics_listen,
               "HOST:PORT of the HTTP endpoint: Prometheus /metrics and the dashboard (/), "
               "or off");
  settings.Add("state_dir", &state_dir, "folder of the default database and secret file");
  settings.Add("database", &database,
               "sqlite:PATH or postgresql://USER@HOST/DB (default sqlite:<state_dir>/flyt.db)");
  settings.Add("secret", &secret, "shared cluster secret (prefer secret_file; or FLYT_SECRET)");
  settings.Add("secret_file", &secret_file,
               "file holding the cluster secret, created when missing "
               "(default <state_dir>/cluster.secret)");
  control::AddTlsSettings(&settings, &tls);
  settings.Add("heartbeat_ms", &opt.heartbeat_ms, "how often node managers report");
  settings.Add("node_dead_after_heartbeats", &opt.node_dead_after_heartbeats,
               "missed heartbeats after which a node is declared down");
  settings.Add("idle_grace_ms", &opt.idle_grace_ms,
               "a share with no client for this long is stopped and returned; 0 = never");
  settings.Add("max_server_restarts", &opt.max_server_restarts,
               "times a dead server is restarted before its share is freed");
  settings.Add("node_call_timeout_ms", &opt.node_call_timeout_ms,
               "how long a node manager may take to start a server");
  settings.Add("migrate_wait_ms", &opt.migrate_wait_ms,
               "how long a migration, checkpoint or restore waits for a server's sessions");
  settings.Add("checkpoint_ship_max_bytes", &opt.checkpoint_ship_max_bytes,
               "the largest checkpoint (bytes, all its files) that a restore on another node "
               "ships from the node it was taken on");
  settings.Add("rebalance_interval_ms", &opt.rebalance_interval_ms,
               "run migrate-auto this often (move a VM off the most loaded node); 0 = never");
  settings.Add("placement_policy", &policy, "spread (most free GPU) or pack (fullest that fits)");
  settings.Add("oversubscribe_sm", &over_sm, "allow more SMs to be promised than a GPU has");
  settings.Add("oversubscribe_memory", &over_mem,
               "allow more memory to be promised than a GPU has");
  if (int rc = 0; !settings.LoadForMain(argc, argv, &rc)) return rc;
  if (policy != "spread" && policy != "pack") {
    std::fprintf(stderr, "flyt-cluster-manager: placement_policy must be spread or pack\n");
    return 2;
  }
  opt.placement.policy = policy == "pack" ? cluster::Policy::kPack : cluster::Policy::kSpread;
  opt.placement.oversubscribe_sm = over_sm;
  opt.placement.oversubscribe_memory = over_mem;
  if (opt.heartbeat_ms <= 0 || opt.node_dead_after_heartbeats <= 0) {
    std::fprintf(stderr, "flyt-cluster-manager: heartbeat settings must be positive\n");
    return 2;
  }
  std::error_code ec;
  if (database.empty() || secret_file.empty()) std::filesystem::create_directories(state_dir, ec);
  if (database.empty()) database = "sqlite:" + state_dir + "/flyt.db";
  if (secret_file.empty()) secret_file = state_dir + "/cluster.secret";
  control::Credentials creds;
  Status st = control::LoadSecret(secret, secret_file, /*create=*/true, &creds);
  if (st.ok()) st = control::LoadTls(tls, &creds);
  std::unique_ptr<store::Store> store;
  if (st.ok()) st = store::Store::Open(database, &store);
  if (!st.ok()) {
    std::fprintf(stderr, "flyt-cluster-manager: %s\n", st.message().c_str());
    return 1;
  }
  std::string dialect = store->dialect();
  int version = store->schema_version();
  cluster::ClusterManager manager(opt, std::move(store), creds);
  st = manager.Start();
  std::unique_ptr<control::Listener> listener;
  if (st.ok()) {
    st = control::Listener::Start(
        listen, creds,
        [&manager](const control::Peer& p, const control::Json& r) { return manager.Handle(p, r); },
        &listener);
  }
  std::unique_ptr<cluster::HttpEndpoint> http;
  if (st.ok() && metrics_listen != "off") {
    std::vector<cluster::HttpEndpoint::Route> routes = {
        {"/metrics", "text/plain; version=0.0.4; charset=utf-8",
         [&manager] { return manager.MetricsText(); }},
        {"/", "text/html; charset=utf-8", [] { return std::string(cluster::kDashboardPage); }},
        {"/api/cluster", "application/json", [&manager] { return manager.DashboardJson(); }},
    };
    st = cluster::HttpEndpoint::Start(metrics_listen, std::move(routes), &http);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "flyt-cluster-manager: %s\n", st.message().c_str());
    return 1;
  }
  if (http != nullptr)
    std::fprintf(stderr, "flyt-cluster-manager: metrics on %s/metrics, dashboard on %s/\n",
                 http->url().c_str(), http->url().c_str());
  std::fprintf(stderr,
               "flyt-cluster-manager: listening on %s, %s database (schema %d), heartbeat %lld ms, "
               "auto-deallocation %s\n",
               listener->Describe().c_str(), dialect.c_str(), version,
               static_cast<long long>(opt.heartbeat_ms),
               opt.idle_grace_ms > 0
                   ? ("after " + std::to_string(opt.idle_grace_ms) + " ms idle").c_str()
                   : "off");
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int sig = 0;
  sigwait(&set, &sig);
  std::fprintf(stderr, "flyt-cluster-manager: stopping (signal %d)\n", sig);
  if (http != nullptr) http->Stop();
  listener->Stop();
  manager.Stop();
  return 0;
}
