// Flyt's NVML library (src/nvml/, libnvidia-ml.so.1) reaches flyt-server
// through this process's connection: one exported function, not a CUDA entry
// point, that fetches the tenant's NVML view (ops::kOpNvmlSnapshot).
#include <cuda.h>

#include <cstring>
#include <vector>

#include "client/client.h"
#include "common/log.h"

using flyt::client::Client;

namespace {

using flyt::ops::NvmlDevice;
using flyt::ops::NvmlHead;
using flyt::ops::NvmlProcess;

// One server's snapshot split into its parts; false when malformed.
bool Split(const std::vector<uint8_t>& buf, NvmlHead* head, std::vector<NvmlDevice>* devices,
           std::vector<NvmlProcess>* processes) {
  if (buf.size() < sizeof(NvmlHead)) return false;
  std::memcpy(head, buf.data(), sizeof(NvmlHead));
  if (head->head_size != sizeof(NvmlHead) || head->device_size != sizeof(NvmlDevice) ||
      head->process_size != sizeof(NvmlProcess) ||
      head->device_count > flyt::ops::kMaxNvmlDevices ||
      head->process_count > flyt::ops::kMaxNvmlProcesses ||
      buf.size() != sizeof(NvmlHead) + head->device_count * sizeof(NvmlDevice) +
                        head->process_count * sizeof(NvmlProcess))
    return false;
  devices->resize(head->device_count);
  processes->resize(head->process_count);
  const uint8_t* p = buf.data() + sizeof(NvmlHead);
  if (!devices->empty()) std::memcpy(devices->data(), p, devices->size() * sizeof(NvmlDevice));
  p += devices->size() * sizeof(NvmlDevice);
  if (!processes->empty())
    std::memcpy(processes->data(), p, processes->size() * sizeof(NvmlProcess));
  return true;
}

// Several servers (docs/architecture.md §8.4): every server's snapshot, its GPUs
// after the earlier servers' with the PCI domain and UUID CUDA shows, its
// processes' device indices moved along, and between GPUs of two servers what
// NVML says of GPUs without P2P on different systems (P2P not supported, common
// ancestor "system"). `reply` holds server 0's and gets the merged one.
CUresult MergeSnapshots(Client& c, const flyt::wire::Writer& w, std::vector<uint8_t>* reply) {
  constexpr uint8_t kP2pNotSupported = 5;  // NVML_P2P_STATUS_NOT_SUPPORTED
  constexpr uint8_t kLevelSystem = 5;      // NVML_TOPOLOGY_SYSTEM / 10
  NvmlHead head{};
  std::vector<NvmlDevice> all;
  std::vector<NvmlProcess> procs;
  std::vector<int> first;  // each server's first index in `all`
  for (int k = 0; k < c.server_count(); ++k) {
    std::vector<uint8_t> buf;
    if (k == 0) {
      buf = *reply;
    } else {
      CUresult rc = c.Link(k).Call("nvmlSnapshot", flyt::ops::kOpNvmlSnapshot, w,
                                   flyt::client::ReplySink{&buf});
      if (rc != CUDA_SUCCESS) return rc;
    }
    NvmlHead h{};
    std::vector<NvmlDevice> devs;
    std::vector<NvmlProcess> ps;
    if (!Split(buf, &h, &devs, &ps) || all.size() + devs.size() > flyt::ops::kMaxNvmlDevices ||
        procs.size() + ps.size() > flyt::ops::kMaxNvmlProcesses) {
      FLYT_WARN("nvmlSnapshot: malformed snapshot from server %d", k);
      return CUDA_ERROR_UNKNOWN;
    }
    if (k == 0) head = h;
    first.push_back(static_cast<int>(all.size()));
    for (auto& p : ps) p.device += static_cast<uint32_t>(all.size());
    procs.insert(procs.end(), ps.begin(), ps.end());
    for (auto& d : devs) {
      d.pci_domain += 0x1000u * static_cast<uint32_t>(k);  // as CUDA's (multi_server.cc)
      std::vector<const uint8_t*> earlier;
      for (const auto& e : all) earlier.push_back(e.uuid);
      flyt::client::DistinctUuid(d.uuid, k, earlier);
      all.push_back(d);
    }
  }
  first.push_back(static_cast<int>(all.size()));
  // Topology rows are indexed by the device's place in its own server's snapshot.
  for (int k = 0; k + 1 < static_cast<int>(first.size()); ++k) {
    for (int g = first[k]; g < first[k + 1]; ++g) {
      flyt::ops::NvmlTopology own = all[g].topology;
      flyt::ops::NvmlTopology& t = all[g].topology;
      for (int j = 0; j < static_cast<int>(all.size()); ++j) {
        const bool same = j >= first[k] && j < first[k + 1];
        const int local = j - first[k];
        for (uint32_t i = 0; i < flyt::ops::kNvmlP2pIndices; ++i) {
          t.p2p_rc[i][j] = same ? own.p2p_rc[i][local] : 0;
          t.p2p[i][j] = same ? own.p2p[i][local] : kP2pNotSupported;
        }
        t.level_rc[j] = same ? own.level_rc[local] : 0;
        t.level[j] = same ? own.level[local] : kLevelSystem;
      }
    }
  }
  head.device_count = static_cast<uint32_t>(all.size());
  head.process_count = static_cast<uint32_t>(procs.size());
  reply->resize(sizeof(NvmlHead) + all.size() * sizeof(NvmlDevice) +
                procs.size() * sizeof(NvmlProcess));
  uint8_t* p = reply->data();
  std::memcpy(p, &head, sizeof(head));
  p += sizeof(head);
  if (!all.empty()) std::memcpy(p, all.data(), all.size() * sizeof(NvmlDevice));
  p += all.size() * sizeof(NvmlDevice);
  if (!procs.empty()) std::memcpy(p, procs.data(), procs.size() * sizeof(NvmlProcess));
  return CUDA_SUCCESS;
}

}  // namespace

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
  if (c.multi()) {  // several servers: one snapshot of all their GPUs, in CUDA's order
    rc = MergeSnapshots(c, w, &reply);
    if (rc != CUDA_SUCCESS) return rc;
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
