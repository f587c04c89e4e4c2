#include "client/client_manager_lookup.h"

#include <sys/stat.h>

#include <mutex>

#include "common/client_manager_socket.h"
#include "transport/transport.h"

namespace flyt::client {

bool ClientManagerPresent(std::string* socket_path) {
  *socket_path = ClientManagerSocket();
  struct stat st {};
  return ::stat(socket_path->c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

namespace {

std::mutex g_endpoint_mu;
std::string g_endpoint;  // the first endpoint ALLOCATE answered

// One request line, one answer line; *unreachable tells a manager that is not there.
Status AskLine(const std::string& socket_path, int timeout_ms, const std::string& request,
               std::string* line, bool* unreachable = nullptr) {
  transport::Address addr;
  addr.kind = transport::Address::Kind::kUnix;
  addr.path = socket_path;
  transport::Liveness live;
  live.connect_timeout_ms = 5000;
  live.refused_retry_ms = 0;
  std::unique_ptr<transport::Connection> conn;
  Status s = transport::Dial(addr, live, &conn);
  if (unreachable != nullptr) *unreachable = !s.ok();
  if (!s.ok())
    return Status::Error("cannot reach flyt-client-manager at " + socket_path + ": " + s.message());
  conn->SetReceiveTimeout(timeout_ms);
  iovec iov{const_cast<char*>(request.data()), request.size()};
  s = conn->Send(&iov, 1);
  char c = 0;
  while (s.ok() && line->size() < 4096) {
    s = conn->Receive(&c, 1);
    if (!s.ok() || c == '\n') break;
    *line += c;
  }
  return s;
}

}  // namespace

std::string ClientManagerEndpoint() {
  std::lock_guard<std::mutex> lock(g_endpoint_mu);
  return g_endpoint;
}

void NoteFixedEndpoint(const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(g_endpoint_mu);
  if (g_endpoint.empty()) g_endpoint = endpoint;
}

void NoteSessionEndpoint(const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(g_endpoint_mu);
  if (!g_endpoint.empty()) g_endpoint = endpoint;
}

Status LocateWithClientManager(const std::string& socket_path, const std::string& endpoint,
                               int timeout_ms, std::string* now) {
  std::string line;
  Status s = AskLine(socket_path, timeout_ms, "LOCATE " + endpoint + "\n", &line);
  if (!s.ok()) return s;
  now->clear();
  if (line.rfind("OK ", 0) == 0) {
    *now = line.substr(3);
    return Status::Ok();
  }
  if (line.rfind("WAIT", 0) == 0) return Status::Ok();
  return Status::Error("flyt-client-manager at " + socket_path + " answered '" + line + "'");
}

Status AskClientManager(const std::string& socket_path, int timeout_ms, std::string* endpoint,
                        std::string* token) {
  std::string line;
  bool unreachable = false;
  Status s = AskLine(socket_path, timeout_ms, "ALLOCATE\n", &line, &unreachable);
  if (unreachable)
    return Status::Error(s.message() + ". Start it, or set FLYT_SERVER to use a server directly");
  if (!s.ok()) return Status::Error("flyt-client-manager at " + socket_path + ": " + s.message());
  if (line.rfind("OK ", 0) == 0) {
    size_t sp = line.find(' ', 3);
    if (sp != std::string::npos) {
      *endpoint = line.substr(3, sp - 3);
      *token = line.substr(sp + 1);
      std::lock_guard<std::mutex> lock(g_endpoint_mu);
      if (g_endpoint.empty()) g_endpoint = *endpoint;
      return Status::Ok();
    }
  }
  if (line.rfind("ERR ", 0) == 0) {
    return Status::Error("the cluster refused this VM a GPU: " + line.substr(4));
  }
  return Status::Error("flyt-client-manager at " + socket_path + " answered '" + line + "'");
}

}  // namespace flyt::client
