// cuGetProcAddress lookup over the generated driver table, and the one-time warning of
// unsupported entry points.
//
// Owns: LookupDriverProc and ReportUnsupported (see proc_address.h). Must not touch the
// generated table (read-only data), the cuGetProcAddress entry points, or stdout; must not
// allocate.
#include "client/proc_address.h"

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>

#include "common/log.h"

namespace flyt::client {
namespace {

constexpr unsigned long long kKnownFlags =
    CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

// Rows [first, last) of the table whose base name is `symbol`.
void EqualRange(const char* symbol, const DriverProcEntry** first, const DriverProcEntry** last) {
  const DriverProcEntry* begin = kDriverProcTable;
  const DriverProcEntry* end = kDriverProcTable + kDriverProcTableSize;
  const DriverProcEntry* lo = begin;
  std::size_t count = kDriverProcTableSize;
  while (count > 0) {  // lower bound
    std::size_t half = count / 2;
    if (std::strcmp(lo[half].base, symbol) < 0) {
      lo += half + 1;
      count -= half + 1;
    } else {
      count = half;
    }
  }
  const DriverProcEntry* hi = lo;
  while (hi != end && std::strcmp(hi->base, symbol) == 0) ++hi;
  *first = lo;
  *last = hi;
}

// Names already reported, as 64-bit FNV-1a hashes in a lock-free open-addressing set. No
// allocation and no std container: template instances of those would be exported from
// the library despite -fvisibility=hidden. A hash collision only drops a log line.
constexpr std::size_t kReportedSlots = 4096;  // power of two, well above the table size
std::atomic<std::uint64_t> g_reported[kReportedSlots];

bool FirstReport(const char* symbol) {
  std::uint64_t h = 14695981039346656037ull;
  for (const char* p = symbol; *p != '\0'; ++p) {
    h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  }
  if (h == 0) h = 1;  // 0 marks an empty slot
  for (std::size_t i = 0; i < kReportedSlots; ++i) {
    std::atomic<std::uint64_t>& slot = g_reported[(h + i) & (kReportedSlots - 1)];
    std::uint64_t seen = slot.load(std::memory_order_acquire);
    if (seen == 0 && slot.compare_exchange_strong(seen, h, std::memory_order_acq_rel)) {
      return true;
    }
    if (seen == h) return false;  // reported before (or by a racing thread just now)
  }
  return true;  // set full: keep logging rather than go quiet
}

}  // namespace

CUresult LookupDriverProc(const char* symbol, int version, unsigned long long flags, void** pfn,
                          CUdriverProcAddressQueryResult* found, int driver_version) {
  if (symbol == nullptr || pfn == nullptr || (flags & ~kKnownFlags) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (driver_version > 0 && version > driver_version) return CUDA_ERROR_INVALID_VALUE;
  if (version < 0) version = INT_MAX;  // the driver answers -1 with the newest ABI

  const DriverProcEntry* first;
  const DriverProcEntry* last;
  EqualRange(symbol, &first, &last);
  if (first == last) {
    *pfn = nullptr;
    if (found != nullptr) *found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS;
  }
  // Rows are ordered legacy (per_thread 0) before per-thread (1), each by version.
  const DriverProcEntry* per_thread = first;
  while (per_thread != last && per_thread->per_thread == 0) ++per_thread;
  const bool want_per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const DriverProcEntry* lo = first;
  const DriverProcEntry* hi = per_thread;
  if (want_per_thread && per_thread != last) {
    lo = per_thread;  // never fall back to a legacy-stream ABI
    hi = last;
  }
  const DriverProcEntry* best = nullptr;
  for (const DriverProcEntry* e = lo; e != hi && e->version <= version; ++e) best = e;
  if (best == nullptr) {
    *pfn = nullptr;
    if (found != nullptr) *found = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return CUDA_SUCCESS;
  }
  *pfn = best->fn;
  if (found != nullptr) *found = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

int ReportUnsupported(const char* symbol) {
  if (symbol == nullptr) symbol = "(unnamed driver entry point)";
  if (FirstReport(symbol)) FLYT_WARN("%s is not supported by Flyt yet", symbol);
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace flyt::client
