// libcuda's side of Flyt's libnccl.so.2 (common/nccl_abi.h): its NCCL calls
// go to the server of the communicator's GPU as ops::kOpNccl frames, in order
// with this process's other calls there.
//
// Owns: the table handed out by cuGetExportTable and which server a call, a
// stream or a device ordinal belongs to. Must not: interpret the NCCL calls
// (src/nccl/ and server/session_nccl.cc do).
#include <vector>

#include "client/client.h"
#include "client/export_tables.h"
#include "common/nccl_abi.h"

namespace flyt::client {

namespace {

CUresult Call(int server, const void* request, size_t n, nccl::ReplyFn reply, void* opaque,
              int* used) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  const int k = server < 0 ? c.RouteNow() : server;
  if (k >= c.server_count()) return CUDA_ERROR_INVALID_VALUE;
  Client::RouteScope scope(k);
  wire::Writer w;
  w.PutBytes(request, n);
  std::vector<uint8_t> out;
  CUresult rc = c.Call("nccl", ops::kOpNccl, w, ReplySink{&out});
  if (used != nullptr) *used = k;
  if (rc == CUDA_SUCCESS) reply(opaque, out.data(), out.size());
  return rc;
}

int StreamServer(CUstream stream, uint64_t* wire) {
  Client& c = Client::Get();
  const auto v = reinterpret_cast<uintptr_t>(stream);
  *wire = v;
  if (!c.multi()) return 0;
  if (v > 2) *wire = Client::WireValue(v);
  return c.StreamRoute(stream);
}

int DeviceServer(int device, int* local) {
  int count = 0;
  if (cuDeviceGetCount(&count) != CUDA_SUCCESS || device < 0 || device >= count) return -1;
  Client& c = Client::Get();
  *local = c.DeviceLocal(device);
  return c.DeviceServer(device);
}

int ServerCount() { return Client::Get().server_count(); }

}  // namespace

const void* NcclTable() {
  static const nccl::Table table{sizeof(nccl::Table), Call, StreamServer, DeviceServer,
                                 ServerCount};
  return &table;
}

}  // namespace flyt::client
