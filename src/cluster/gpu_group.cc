#include "cluster/gpu_group.h"

#include <algorithm>

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

}  // namespace flyt::cluster
