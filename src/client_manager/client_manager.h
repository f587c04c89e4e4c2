// The client manager: one per client VM; tells the client library where its
// tenant's flyt-server is.
//
// Owns: the local Unix socket the client library asks ("ALLOCATE\n" ->
// "OK <endpoint> <token>\n" or "ERR <message>\n"; "LOCATE <endpoint>\n" -> "OK <endpoint>\n"
// or "WAIT <why>\n": where a checkpointed process's server is now, docs/control_plane.md) and
// the authenticated channel to the cluster manager (request-allocation for
// this VM's IP). Must not cache credentials beyond one answer: the cluster
// manager decides where the tenant runs each time a process starts.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "control/channel.h"
#include "transport/transport.h"

namespace flyt::client_manager {

struct Options {
  std::string socket_path;
  std::string cluster_manager;
  std::string vm_ip;
  int64_t request_timeout_ms = 60000;
};

class ClientManager {
 public:
  ClientManager(Options options, control::Credentials creds);
  // Binds the socket (0666: every process of the VM may ask) and serves forever.
  Status Serve();
  // One request-allocation round trip; "OK ..." or "ERR ..." line without newline.
  std::string Allocate();
  // Where the server a checkpointed process waited at (`endpoint`) runs now (a restore on
  // another node moved it): "OK <endpoint>", "WAIT <why>" or "ERR ...", without newline.
  std::string Locate(const std::string& endpoint);

 private:
  Status CallLocked(const std::string& verb, const control::Json& args, control::Json* answer);
  void ServeOne(std::unique_ptr<transport::Connection> conn);
  Options options_;
  control::Credentials creds_;
  std::mutex mu_;
  std::unique_ptr<control::Channel> channel_;
};

}  // namespace flyt::client_manager
