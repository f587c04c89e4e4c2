// Implementation of server/device_output.h: the per-thread sink. The
// interposers live in device_output_interpose.cc, linked into flyt-server only.
#include "server/device_output.h"

namespace flyt::server {
namespace {
thread_local std::string* t_sink = nullptr;
}  // namespace

void SetDeviceOutputSink(std::string* sink) { t_sink = sink; }
std::string* DeviceOutputSink() { return t_sink; }

}  // namespace flyt::server
