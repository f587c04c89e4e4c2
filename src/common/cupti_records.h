// CUPTI activity records as Flyt hands them to an app: the buffer layout that
// both of Flyt's CUPTIs use (the client's libcupti, src/cupti/, and the sim
// backend's, server/sim_cupti.cc), and the clock their timestamps start from.
//
// Owns: the layout (each record preceded by its size in a u64, records
// 8-byte aligned), filling the app's buffers through its callbacks, and
// walking a filled buffer (cuptiActivityGetNextRecord). Header-only: the
// client's libcupti links nothing of Flyt's. Must not know where records come from.
#pragma once

#include <cupti.h>
#include <time.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace flyt::cupti_records {

using Pending = std::vector<std::vector<uint8_t>>;

// Nanoseconds of CLOCK_REALTIME: CUPTI's own timestamp clock.
inline uint64_t RealtimeNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

template <typename Record>
void Append(Pending* pending, const Record& r) {
  std::vector<uint8_t> bytes(sizeof(Record));
  std::memcpy(bytes.data(), &r, sizeof(Record));
  pending->push_back(std::move(bytes));
}

// A buffer the app gave through its `requested` callback and has not had back.
struct AppBuffer {
  uint8_t* data = nullptr;
  size_t size = 0, max_records = 0;
};

inline AppBuffer Request(CUpti_BuffersCallbackRequestFunc requested) {
  AppBuffer b;
  requested(&b.data, &b.size, &b.max_records);
  return b.data != nullptr ? b : AppBuffer{};
}

// Hands `records` to the app: into `held` first when it holds a buffer (handed
// back even when empty), then into buffers from `requested`, each given back
// through `completed`. Returns how many records went out; fewer than all when
// the app gave no buffer, or one too small for the next record.
inline size_t Deliver(const Pending& records, AppBuffer held,
                      CUpti_BuffersCallbackRequestFunc requested,
                      CUpti_BuffersCallbackCompleteFunc completed) {
  size_t i = 0;
  while (i < records.size() || held.data != nullptr) {
    AppBuffer buf = held.data != nullptr ? held : Request(requested);
    held = AppBuffer{};
    if (buf.data == nullptr) return i;
    size_t used = 0, count = 0;
    while (i < records.size() && used + 8 + records[i].size() <= buf.size &&
           (buf.max_records == 0 || count < buf.max_records)) {
      uint64_t n = records[i].size();
      std::memcpy(buf.data + used, &n, 8);
      std::memcpy(buf.data + used + 8, records[i].data(), n);
      used += 8 + ((n + 7) & ~size_t{7});
      ++i;
      ++count;
    }
    completed(nullptr, 0, buf.data, buf.size, used);
    if (count == 0 && i < records.size()) return i;  // too small for the next record
  }
  return i;
}

// cuptiActivityGetNextRecord over a buffer Deliver filled.
inline CUptiResult Next(uint8_t* buffer, size_t valid, CUpti_Activity** record) {
  if (buffer == nullptr || record == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  size_t at = 0;
  if (*record != nullptr) {
    auto* cur = reinterpret_cast<uint8_t*>(*record);
    uint64_t n = 0;
    std::memcpy(&n, cur - 8, 8);
    at = static_cast<size_t>(cur - buffer) + ((n + 7) & ~uint64_t{7});
  }
  if (at + 8 > valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = reinterpret_cast<CUpti_Activity*>(buffer + at + 8);
  return CUPTI_SUCCESS;
}

}  // namespace flyt::cupti_records
