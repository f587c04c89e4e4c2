// The sim backend's CUPTI: records of the sim's kernels, copies and memsets.
//
// Owns: the activity kinds enabled in the sim, the per-thread external
// correlation stacks, the records not yet flushed and their buffer layout.
// The sim backend (server/sim_backend.cc) reports each operation it runs;
// the table in server/cupti_api.h reads them back as NVIDIA's CUPTI would.
// Must not know about sessions or the wire.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

namespace flyt::server::sim_cupti {

// Whether the operations below are recorded now (cheap; false until a
// profiled session enables a kind).
bool Recording();
// Timestamps as CUPTI's: nanoseconds of CLOCK_REALTIME.
uint64_t Now();
void RecordKernel(const std::string& name, const CUlaunchConfig& cfg, uint64_t start, uint64_t end);
// copy_kind: CUpti_ActivityMemcpyKind; memory kinds: CUpti_ActivityMemoryKind.
void RecordMemcpy(uint8_t copy_kind, uint8_t src_kind, uint8_t dst_kind, uint64_t bytes,
                  CUstream stream, uint64_t start, uint64_t end);
void RecordMemset(uint32_t value, uint64_t bytes, CUstream stream, uint64_t start, uint64_t end);

}  // namespace flyt::server::sim_cupti
