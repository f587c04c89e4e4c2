// Kernel parameter layouts read from CUDA code images, for the sim backend only.
//
// Owns: walking fatbins (including zstd- and LZ4-compressed entries), reading the
// .nv.info.<kernel> attributes of ELF cubins and the .entry parameter lists of PTX,
// so that the sim can answer cuFuncGetParamInfo / cuKernelGetParamInfo and record
// launch argument bytes. The real backend asks the driver instead and must not use
// this. Must not touch: anything outside [data, data + size); never loads or runs code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace flyt::sim {

// One kernel parameter: its byte offset in the argument buffer and its size.
struct ParamSlot {
  uint32_t offset;
  uint32_t size;
};

// An entry function (kernel) and its parameters in ordinal order.
struct KernelDesc {
  std::string name;  // as the module exports it (mangled for C++ kernels)
  std::vector<ParamSlot> params;
};

// `data` is a fatbin (one or several back to back, as in an executable's .nv_fatbin),
// an ELF cubin or PTX text (a trailing NUL is optional). Fatbin entries of every
// architecture are read; a kernel found in an ELF entry takes precedence over the
// same kernel found in PTX. Kernels appear once each, in the order first found.
// Returns true when at least one ELF or PTX image was read (the list may then be
// empty: a module without kernels is valid). Returns false with *error set when
// nothing usable is found.
bool DescribeKernels(const void* data, size_t size, std::vector<KernelDesc>* out,
                     std::string* error);

}  // namespace flyt::sim
