#include "common/client_manager_socket.h"

#include <unistd.h>

#include <cstdlib>

namespace flyt {

std::string ClientManagerSocket() {
  if (const char* e = std::getenv("FLYT_CLIENT_MANAGER"); e != nullptr && e[0] != '\0') return e;
  if (::geteuid() == 0) return "/run/flyt/client-manager.sock";
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x != nullptr && x[0] != '\0') {
    return std::string(x) + "/flyt/client-manager.sock";
  }
  return "/tmp/flyt-" + std::to_string(::geteuid()) + "/client-manager.sock";
}

}  // namespace flyt
