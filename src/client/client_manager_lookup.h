// Asking the VM's flyt-client-manager which flyt-server to use.
//
// Owns: the client library's side of the one-line protocol on the client
// manager's Unix socket (docs/control_plane.md). It is asked once per process,
// before the first connection, and again while a checkpointed process waits
// (its server may be restored on another node); the only state it keeps is the
// endpoint of the process's server as the cluster knows it.
#pragma once

#include <string>

#include "common/status.h"

namespace flyt::client {

// True when a client manager socket exists at the configured or default path.
bool ClientManagerPresent(std::string* socket_path);
// Asks for this VM's server; fills the endpoint and the allocation's token.
Status AskClientManager(const std::string& socket_path, int timeout_ms, std::string* endpoint,
                        std::string* token);
// The endpoint the client manager gave this process (or FLYT_SERVER's one address), or
// where its session moved since (empty: neither).
std::string ClientManagerEndpoint();
// A process given its server with FLYT_SERVER: that address is what a checkpoint's wait
// asks a client manager about, where the VM has one.
void NoteFixedEndpoint(const std::string& endpoint);
// The session moved to `endpoint` (a migration or a restore elsewhere): what a later
// checkpoint's wait asks about. Nothing for a process with neither of the above.
void NoteSessionEndpoint(const std::string& endpoint);
// Asks where the server this process waited at (`endpoint`, a checkpoint's) runs now:
// *now is the endpoint to dial, empty while the checkpoint waits for its restore.
Status LocateWithClientManager(const std::string& socket_path, const std::string& endpoint,
                               int timeout_ms, std::string* now);

}  // namespace flyt::client
