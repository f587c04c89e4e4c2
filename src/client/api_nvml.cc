// Flyt's NVML library (src/nvml/, libnvidia-ml.so.1) reaches flyt-server
// through this process's connection: one exported function, not a CUDA entry
// point, that fetches the tenant's NVML view (ops::kOpNvmlSnapshot).
#include <cuda.h>

#include <cstring>
#include <vector>

#include "client/client.h"
#include "common/log.h"

using flyt::client::Client;

// Connects as cuInit does (no context is made) and asks for the snapshot.
// Copies it into buf when it fits in cap bytes; *len receives its size either
// way. CUDA_ERROR_INVALID_VALUE with *len > cap: call again with more room.
// Other errors: the server cannot be reached (cuInit's error) or is gone.
FLYT_API CUresult flyt_nvml_snapshot(void* buf, size_t cap, size_t* len) {
  if (len == nullptr || (buf == nullptr && cap != 0)) return CUDA_ERROR_INVALID_VALUE;
  *len = 0;
  Client& c = Client::Get();
  CUresult rc = c.Init();
  if (rc != CUDA_SUCCESS) return rc;
  flyt::wire::Writer w;
  w.Put<uint32_t>(0);  // flags
  std::vector<uint8_t> reply;
  rc = c.Call("nvmlSnapshot", flyt::ops::kOpNvmlSnapshot, w, flyt::client::ReplySink{&reply});
  if (rc != CUDA_SUCCESS) return rc;
  flyt::ops::NvmlHead head{};
  if (reply.size() < sizeof(head)) {
    FLYT_WARN("nvmlSnapshot: short reply (%zu bytes)", reply.size());
    return CUDA_ERROR_UNKNOWN;
  }
  // The CUDA version this process sees is the one cuDriverGetVersion answers.
  std::memcpy(&head, reply.data(), sizeof(head));
  head.cuda_driver_version = c.driver_version();
  std::memcpy(reply.data(), &head, sizeof(head));
  *len = reply.size();
  if (reply.size() > cap) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(buf, reply.data(), reply.size());
  return CUDA_SUCCESS;
}
