#include "cluster/gpu_group.h"

#include <algorithm>
#include <thread>

namespace flyt::cluster {

std::string JoinEndpoints(const std::vector<std::string>& endpoints) {
  std::string out;
  for (const std::string& e : endpoints) {
    if (!out.empty()) out += ',';
    out += e;
  }
  return out;
}

std::vector<std::string> DistinctNodes(const std::vector<std::string>& node_ids) {
  std::vector<std::string> out;
  for (const std::string& n : node_ids) {
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
  return out;
}

std::string DescribeGpuNodes(const std::vector<std::string>& node_ids) {
  const std::vector<std::string> nodes = DistinctNodes(node_ids);
  std::string out = std::to_string(node_ids.size()) + (node_ids.size() == 1 ? " GPU" : " GPUs");
  if (nodes.size() <= 1) return out + " on node " + (nodes.empty() ? "-" : nodes[0]);
  out += " across nodes ";
  for (size_t i = 0; i < nodes.size(); ++i) out += (i ? ", " : "") + nodes[i];
  return out;
}

void RunEach(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 1) {
    fn(0);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) threads.emplace_back(fn, i);
  for (auto& t : threads) t.join();
}

}  // namespace flyt::cluster
