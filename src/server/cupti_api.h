// The CUPTI entry points flyt-server uses to time a profiled client's GPU work.
//
// Owns: the table and the two ways to fill it: from NVIDIA's libcupti on the
// GPU host (dlopen at the first profiled session, never at start-up: a host
// without CUPTI serves every other call) or from the sim backend
// (server/sim_cupti.cc, which records the sim's launches, copies and memsets
// as CUPTI would). The server reads the records through this table only, so
// CI exercises the same translation code as the GPU machine.
// Must not know about sessions or the wire (server/session_profiler.cc does).
#pragma once

#include <cupti.h>

#include <string>

#include "common/status.h"

namespace flyt::server {

#define FLYT_CUPTI_APIS(X)                  \
  X(cuptiGetVersion)                        \
  X(cuptiGetResultString)                   \
  X(cuptiGetTimestamp)                      \
  X(cuptiActivityEnable)                    \
  X(cuptiActivityDisable)                   \
  X(cuptiActivityRegisterCallbacks)         \
  X(cuptiActivityFlushAll)                  \
  X(cuptiActivityGetNextRecord)             \
  X(cuptiActivityGetNumDroppedRecords)      \
  X(cuptiActivityPushExternalCorrelationId) \
  X(cuptiActivityPopExternalCorrelationId)

struct CuptiApi {
#define FLYT_DECLARE_CUPTI(sym) decltype(&::sym) sym = nullptr;
  FLYT_CUPTI_APIS(FLYT_DECLARE_CUPTI)
#undef FLYT_DECLARE_CUPTI
  bool loaded = false;
  std::string from;  // the library it came from, or "sim"
};

// Loads NVIDIA's CUPTI: FLYT_CUPTI_LIBRARY, else libcupti.so.13 from the
// loader's path, else the CUDA toolkit's usual places. Fails with a message
// that names what was tried and how to point Flyt at the library.
Status LoadCupti(CuptiApi* api);

// Fills the table with the sim backend's CUPTI (server/sim_cupti.cc).
void FillSimCupti(CuptiApi* api);

}  // namespace flyt::server
