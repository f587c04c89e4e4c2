// The cluster manager's HTTP endpoint (setting metrics_listen, default
// 0.0.0.0:12403): GET /metrics answers the Prometheus text the cluster
// manager renders; anything else is 404.
//
// Owns: the HTTP server (Debian's header-only cpp-httplib, confined to
// http_endpoint.cc) and its thread. Must not read the cluster's state itself:
// it calls the function it was given for each scrape.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"

namespace flyt::cluster {

class HttpEndpoint {
 public:
  using Render = std::function<std::string()>;
  ~HttpEndpoint();
  // address: HOST:PORT (PORT 0 picks a free port). Fails when it cannot bind.
  static Status Start(const std::string& address, Render metrics,
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
