// GPU inventory of this host: the `Gpu` records the node manager reports in
// register-node (docs/control_plane.md).
//
// Owns: discovering the GPUs — NVML (libnvidia-ml.so.1) and NVIDIA's
// libcuda.so.1 for the SM counts, both loaded at run time so that the node
// manager starts on hosts without a driver — or a simulated list for hosts
// and tests without GPUs ("sim:N", "sim:FILE.json"), and their JSON form.
// Must not create CUDA contexts or change any GPU setting: it only reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace flyt::node {

struct GpuInfo {
  std::string uuid;            // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  int index = 0;               // NVML index
  std::string name;            // "NVIDIA H200"
  int sm_count = 0;            // streaming multiprocessors
  int64_t memory_bytes = 0;    // total device memory
  std::string driver_version;  // "580.65.06"
  std::string cuda_version;    // the driver's CUDA version: "13.0"
};

nlohmann::json ToJson(const GpuInfo& gpu);

// spec: "nvml" (the real GPUs), "sim:N" (N simulated H200s) or
// "sim:FILE.json" (simulated GPUs listed in a file, see ParseSimInventory).
// node_id seeds the simulated UUIDs so that they are stable across restarts
// and different between nodes.
Status LoadInventory(const std::string& spec, const std::string& node_id,
                     std::vector<GpuInfo>* out);

// True when `spec` asks for simulated GPUs.
bool IsSimulatedInventory(const std::string& spec);

// N simulated GPUs: "Simulated H200", 132 SMs, 141 GiB, driver "sim", CUDA "13.0".
std::vector<GpuInfo> SimulatedGpus(int count, const std::string& node_id);
// A UUID in NVIDIA's format derived from (node_id, index).
// "13.0" for 13000 (cuDriverGetVersion's encoding).
std::string CudaVersionText(int version);
std::string SimulatedUuid(const std::string& node_id, int index);

// A simulated inventory file: {"gpus":[...]} or a bare array, each entry an
// object with optional uuid, name, sm_count, memory_bytes (or memory_gb),
// driver_version, cuda_version ("13.0" or 13000); absent fields take the simulated defaults.
// `source` names the file in error messages.
Status ParseSimInventory(const std::string& json_text, const std::string& node_id,
                         const std::string& source, std::vector<GpuInfo>* out);

}  // namespace flyt::node
