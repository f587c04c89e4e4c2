// The driver's compile cache as NVRTC uses it: private export table
// da9151d3-3ae6-cc41-a5c0-4f26d533e328, served inside the application's process.
//
// NVRTC 13 asks the driver for this table and, for each compile stage (NVVM bitcode to
// PTX, PTX to cubin), asks it for a key made of the stage's input and options, looks the
// key up, and on a miss compiles and stores the result. NVIDIA's driver keeps the entries
// under CUDA_CACHE_PATH. Without the table every compile pays full price (330-600 ms
// against 11-18 ms for a repeated compile on the H200), which is what made cuDNN's
// runtime-fused attention slow through Flyt. NVRTC runs in the application's process and
// the cache belongs to the machine it runs on, so Flyt serves the table there: entries live
// in this process's memory and under the client machine's CUDA_CACHE_PATH (subfolder
// "flyt"), never on the server.
//
// Owns: the table, key derivation, the in-memory entries and the on-disk store and its
// size limit. Must not touch: the server, transports, contexts or any other table.
#pragma once

#include <cstdint>
#include <string>

namespace flyt::client {

// The table's UUID.
extern const unsigned char kCompileCacheUuid[16];

// The table, or null when FLYT_COMPILE_CACHE=0 (then refused as before it was served).
const void* CompileCacheTable();

}  // namespace flyt::client
