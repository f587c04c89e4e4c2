#include "client/query_cache.h"

namespace flyt::client {

QueryCache& QueryCache::Get() {
  static QueryCache* cache = new QueryCache();  // never destroyed: atexit order is unknown
  return *cache;
}

bool QueryCache::FindAttribute(uint64_t handle, bool kernel, int attr, int dev, int* value) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto& map = kernel ? kernel_attrs_ : function_attrs_;
  auto it = map.find(AttributeKey(handle, attr, kernel ? dev : -1));
  if (it == map.end()) return false;
  *value = it->second;
  return true;
}

void QueryCache::PutAttribute(uint64_t handle, bool kernel, int attr, int dev, int value) {
  std::lock_guard<std::mutex> lock(mu_);
  (kernel ? kernel_attrs_ : function_attrs_)[AttributeKey(handle, attr, kernel ? dev : -1)] = value;
}

void QueryCache::EraseAttributeLocked(std::unordered_map<Key, int, KeyHash>* map, int attr) {
  const auto a = static_cast<uint64_t>(static_cast<uint32_t>(attr));
  for (auto it = map->begin(); it != map->end();) it = it->first.b == a ? map->erase(it) : ++it;
}

void QueryCache::AttributeSet(uint64_t handle, bool kernel, int attr, int dev, int value) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& own = kernel ? kernel_attrs_ : function_attrs_;
  const Key key = AttributeKey(handle, attr, kernel ? dev : -1);
  auto it = own.find(key);
  if (it != own.end() && it->second == value) return;
  // A CUkernel and the CUfunctions made from it share their settings, and the
  // client does not know every pairing: the other kind forgets the attribute
  // for all handles.
  for (auto e = own.begin(); e != own.end();)
    e = e->first.a == handle && e->first.b == key.b ? own.erase(e) : ++e;
  EraseAttributeLocked(kernel ? &function_attrs_ : &kernel_attrs_, attr);
  occupancy_.clear();
}

bool QueryCache::FindFunction(uint64_t kernel, uint64_t ctx, uint64_t* function) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = functions_.find(Key{kernel, ctx, 0});
  if (it == functions_.end()) return false;
  *function = it->second;
  return true;
}

void QueryCache::PutFunction(uint64_t kernel, uint64_t ctx, uint64_t function) {
  std::lock_guard<std::mutex> lock(mu_);
  functions_[Key{kernel, ctx, 0}] = function;
}

bool QueryCache::FindOccupancy(uint64_t function, int block, size_t dynamic_smem, unsigned flags,
                               int* value) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = occupancy_.find(OccupancyKey(function, block, dynamic_smem, flags));
  if (it == occupancy_.end()) return false;
  *value = it->second;
  return true;
}

void QueryCache::PutOccupancy(uint64_t function, int block, size_t dynamic_smem, unsigned flags,
                              int value) {
  std::lock_guard<std::mutex> lock(mu_);
  occupancy_[OccupancyKey(function, block, dynamic_smem, flags)] = value;
}

void QueryCache::CacheConfigChanged() {
  std::lock_guard<std::mutex> lock(mu_);
  occupancy_.clear();
}

bool QueryCache::FindLimit(uint64_t ctx, int limit, size_t* value) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = limits_.find(Key{ctx, static_cast<uint64_t>(limit), 0});
  if (it == limits_.end()) return false;
  *value = it->second;
  return true;
}

void QueryCache::PutLimit(uint64_t ctx, int limit, size_t value) {
  std::lock_guard<std::mutex> lock(mu_);
  limits_[Key{ctx, static_cast<uint64_t>(limit), 0}] = value;
}

void QueryCache::LimitsChanged() {
  std::lock_guard<std::mutex> lock(mu_);
  limits_.clear();
}

void QueryCache::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  limits_.clear();
  function_attrs_.clear();
  kernel_attrs_.clear();
  functions_.clear();
  occupancy_.clear();
}

}  // namespace flyt::client
