#include "client_manager/client_manager.h"

#include <sys/stat.h>

#include <filesystem>
#include <thread>

#include "common/log.h"

namespace flyt::client_manager {

ClientManager::ClientManager(Options options, control::Credentials creds)
    : options_(std::move(options)), creds_(std::move(creds)) {}

Status ClientManager::CallLocked(const std::string& verb, const control::Json& args,
                                 control::Json* answer) {
  Status s;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!channel_) {
      s = control::Channel::Dial(options_.cluster_manager, creds_, "client", options_.vm_ip, 5000,
                                 &channel_);
      if (!s.ok()) {
        return Status::Error("cannot reach the cluster manager at " + options_.cluster_manager +
                             ": " + s.message());
      }
    }
    *answer = control::Json();
    s = channel_->Call(verb, args, answer, static_cast<int>(options_.request_timeout_ms));
    if (s.ok() || answer->contains("ok")) break;
    channel_.reset();  // the manager restarted: dial again once
  }
  return s;
}

std::string ClientManager::Locate(const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  control::Json answer;
  Status s = CallLocked("locate-server",
                        control::Json{{"vm_ip", options_.vm_ip}, {"endpoint", endpoint}}, &answer);
  if (!s.ok()) return "ERR " + s.message();
  const std::string now = answer.value("endpoint", "");
  if (now.empty()) return "WAIT " + answer.value("reason", std::string("not restored yet"));
  return "OK " + now;
}

std::string ClientManager::Allocate() {
  std::lock_guard<std::mutex> lock(mu_);
  control::Json answer;
  Status s = CallLocked("request-allocation", control::Json{{"vm_ip", options_.vm_ip}}, &answer);
  if (!s.ok()) return "ERR " + s.message();
  std::string endpoint = answer.value("endpoint", "");
  std::string token = answer.value("token", "");
  if (endpoint.empty() || token.empty()) return "ERR the cluster manager gave no endpoint";
  FLYT_INFO("VM %s -> %s (allocation %s)", options_.vm_ip.c_str(), endpoint.c_str(),
            answer.value("alloc_id", "").c_str());
  return "OK " + endpoint + " " + token;
}

void ClientManager::ServeOne(std::unique_ptr<transport::Connection> conn) {
  conn->SetReceiveTimeout(5000);
  std::string line;
  char c = 0;
  bool got_newline = false;
  while (line.size() < 256 && conn->Receive(&c, 1).ok()) {
    if (c == '\n') {
      got_newline = true;
      break;
    }
    line += c;
  }
  if (!got_newline && line.empty()) return;  // a probe that connected and left
  std::string reply;
  if (line == "ALLOCATE") {
    reply = Allocate();
  } else if (line.rfind("LOCATE ", 0) == 0) {
    reply = Locate(line.substr(7));
  } else {
    reply = "ERR unknown request '" + line + "' (expected ALLOCATE or LOCATE ENDPOINT)";
  }
  reply += "\n";
  iovec iov{reply.data(), reply.size()};
  Status s = conn->Send(&iov, 1);
  if (!s.ok()) FLYT_WARN("answering a client: %s", s.message().c_str());
}

Status ClientManager::Serve() {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(options_.socket_path).parent_path(),
                                      ec);
  transport::Address addr;
  addr.kind = transport::Address::Kind::kUnix;
  addr.path = options_.socket_path;
  std::unique_ptr<transport::Listener> listener;
  Status s = transport::Listen(addr, &listener);
  if (!s.ok()) return s;
  ::chmod(options_.socket_path.c_str(), 0666);
  for (;;) {
    std::unique_ptr<transport::Connection> conn;
    s = listener->Accept(&conn);
    if (!s.ok()) return s;
    std::thread([this, c = std::move(conn)]() mutable { ServeOne(std::move(c)); }).detach();
  }
}

}  // namespace flyt::client_manager
