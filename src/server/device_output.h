// Attribution of device printf output to the session whose call flushed it.
//
// Owns: the calling thread's output sink and the stdio/write interposers that
// NVIDIA's driver, loaded into flyt-server, calls when it flushes the GPU's
// printf buffer on a synchronising call. While a session's thread executes a
// call, text the driver writes to stdout goes into that session's buffer and is
// sent with its reply; text written elsewhere goes to the stdout pipe as before
// (server/session.cc). Must not touch stderr (the server's logs).
#pragma once

#include <string>

namespace flyt::server {

// Sets (or clears with nullptr) the calling thread's sink for stdout text.
void SetDeviceOutputSink(std::string* sink);
std::string* DeviceOutputSink();

}  // namespace flyt::server
