#include "cluster/http_endpoint.h"

#include <httplib.h>

namespace flyt::cluster {

struct HttpEndpoint::Impl {
  httplib::Server server;
};

HttpEndpoint::~HttpEndpoint() { Stop(); }

Status HttpEndpoint::Start(const std::string& address, std::vector<Route> routes,
                           std::unique_ptr<HttpEndpoint>* out) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return Status::Error("metrics_listen '" + address + "' is not HOST:PORT");
  const std::string host = address.substr(0, colon);
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(address.substr(colon + 1), &used);
    if (used != address.size() - colon - 1) port = -1;
  } catch (...) {
    port = -1;
  }
  if (port < 0 || port > 65535)
    return Status::Error("metrics_listen '" + address + "': the port must be 0 to 65535");
  auto endpoint = std::unique_ptr<HttpEndpoint>(new HttpEndpoint);
  endpoint->impl_ = std::make_unique<Impl>();
  httplib::Server& server = endpoint->impl_->server;
  for (Route& route : routes) {
    server.Get(route.path, [route](const httplib::Request&, httplib::Response& res) {
      res.set_content(route.render(), route.content_type);
    });
  }
  int bound =
      port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (bound <= 0)
    return Status::Error("cannot listen for metrics on " + address +
                         " (address in use or not this host's?); set metrics_listen, or 'off'");
  endpoint->url_ = "http://" + host + ":" + std::to_string(bound);
  endpoint->thread_ =
      std::thread([impl = endpoint->impl_.get()] { impl->server.listen_after_bind(); });
  *out = std::move(endpoint);
  return Status::Ok();
}

void HttpEndpoint::Stop() {
  if (impl_ != nullptr) impl_->server.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace flyt::cluster
