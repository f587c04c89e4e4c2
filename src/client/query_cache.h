// Answers to driver queries that do not change, kept on the client so that a
// repeated query costs no round trip (docs/architecture.md: hot calls are LOCAL).
//
// Owns: function and kernel attributes (cuFuncGetAttribute,
// cuKernelGetAttribute), the CUfunction of a CUkernel in a context
// (cuKernelGetFunction), and occupancy answers
// (cuOccupancyMaxActiveBlocksPerMultiprocessor[WithFlags]), with the rules
// that make each stale: setting an attribute forgets that attribute, a cache
// configuration change forgets occupancy, unloading code or destroying a
// context forgets everything. Only successful answers are kept.
// Must not touch: the connection (callers ask the server on a miss).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace flyt::client {

class QueryCache {
 public:
  // The process-wide cache; never destroyed.
  static QueryCache& Get();

  // kernel: the handle is a CUkernel (dev matters), else a CUfunction (dev -1).
  bool FindAttribute(uint64_t handle, bool kernel, int attr, int dev, int* value);
  void PutAttribute(uint64_t handle, bool kernel, int attr, int dev, int value);
  // cuFuncSetAttribute / cuKernelSetAttribute (dev -1 for a function). Setting
  // the value the cache already holds changes nothing (PyTorch sets the same
  // dynamic shared memory size before every launch of some kernels); another
  // value may read differently through this handle and through the other kind
  // of handle, and may change occupancy.
  void AttributeSet(uint64_t handle, bool kernel, int attr, int dev, int value);

  bool FindFunction(uint64_t kernel, uint64_t ctx, uint64_t* function);
  void PutFunction(uint64_t kernel, uint64_t ctx, uint64_t function);

  bool FindOccupancy(uint64_t function, int block, size_t dynamic_smem, unsigned flags, int* value);
  void PutOccupancy(uint64_t function, int block, size_t dynamic_smem, unsigned flags, int value);
  // A cache configuration changed (function, kernel or context).
  void CacheConfigChanged();

  // cuCtxGetLimit answers, per (context, limit). A limit changes only through
  // cuCtxSetLimit (LimitsChanged), except the stack size, which the driver
  // grows for a kernel that needs more: the caller never puts that one.
  bool FindLimit(uint64_t ctx, int limit, size_t* value);
  void PutLimit(uint64_t ctx, int limit, size_t value);
  void LimitsChanged();

  // Code was unloaded or a context destroyed or reset: handles may be reused.
  void Clear();

 private:
  QueryCache() = default;
  struct Key {
    uint64_t a = 0, b = 0, c = 0;
    bool operator==(const Key& o) const { return a == o.a && b == o.b && c == o.c; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return static_cast<size_t>(k.a * 0x9E3779B97F4A7C15ULL ^ (k.b + 0x632BE59BD9B4E019ULL) * 31 ^
                                 k.c);
    }
  };
  static Key AttributeKey(uint64_t handle, int attr, int dev) {
    return Key{handle, static_cast<uint64_t>(static_cast<uint32_t>(attr)),
               static_cast<uint64_t>(static_cast<int64_t>(dev))};
  }
  static Key OccupancyKey(uint64_t function, int block, size_t dynamic_smem, unsigned flags) {
    return Key{function, static_cast<uint32_t>(block) | static_cast<uint64_t>(flags) << 32,
               dynamic_smem};
  }
  void EraseAttributeLocked(std::unordered_map<Key, int, KeyHash>* map, int attr);

  std::mutex mu_;
  std::unordered_map<Key, int, KeyHash> function_attrs_;  // (function, attr, -1)
  std::unordered_map<Key, int, KeyHash> kernel_attrs_;    // (kernel, attr, dev)
  std::unordered_map<Key, uint64_t, KeyHash> functions_;  // (kernel, ctx, 0)
  std::unordered_map<Key, int, KeyHash> occupancy_;       // (function, block|flags<<32, smem)
  std::unordered_map<Key, size_t, KeyHash> limits_;       // (ctx, limit, 0)
};

}  // namespace flyt::client
