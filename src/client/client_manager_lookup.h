// Asking the VM's flyt-client-manager which flyt-server to use.
//
// Owns: the client library's side of the one-line protocol on the client
// manager's Unix socket (docs/control_plane.md). Must not keep state: it is
// asked once per process, before the first connection.
#pragma once

#include <string>

#include "common/status.h"

namespace flyt::client {

// True when a client manager socket exists at the configured or default path.
bool ClientManagerPresent(std::string* socket_path);
// Asks for this VM's server; fills the endpoint and the allocation's token.
Status AskClientManager(const std::string& socket_path, int timeout_ms, std::string* endpoint,
                        std::string* token);

}  // namespace flyt::client
