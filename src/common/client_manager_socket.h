// Where the client library finds its VM's flyt-client-manager.
//
// Owns: the one default path both sides agree on. Must not do I/O beyond
// reading the environment.
#pragma once

#include <string>

namespace flyt {

// $FLYT_CLIENT_MANAGER, else /run/flyt/client-manager.sock for root, else
// $XDG_RUNTIME_DIR/flyt/client-manager.sock, else /tmp/flyt-<uid>/client-manager.sock.
std::string ClientManagerSocket();

}  // namespace flyt
