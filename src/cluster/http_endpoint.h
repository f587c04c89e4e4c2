// The cluster manager's HTTP endpoint (setting metrics_listen, default
// 0.0.0.0:12403): GET of each route answers what its function renders
// (/metrics: Prometheus text; /: the dashboard; /api/cluster: its JSON);
// anything else is 404.
//
// Owns: the HTTP server (Debian's cpp-httplib, confined to http_endpoint.cc)
// and its thread. Must not read the cluster's state itself: it calls the
// functions it was given, once per request.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace flyt::cluster {

class HttpEndpoint {
 public:
  struct Route {
    std::string path, content_type;
    std::function<std::string()> render;
  };
  ~HttpEndpoint();
  // address: HOST:PORT (PORT 0 picks a free port). Fails when it cannot bind.
  static Status Start(const std::string& address, std::vector<Route> routes,
                      std::unique_ptr<HttpEndpoint>* out);
  void Stop();
  // "http://HOST:PORT" as bound.
  const std::string& url() const { return url_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  std::string url_;
};

}  // namespace flyt::cluster
