// GPU groups: how the cluster manager speaks of a VM that has several GPUs.
//
// Owns: the pure rules that turn a VM's servers (one flyt-server per GPU, in ordinal order)
// into what its client and the operator are told: the endpoint list the client library takes
// as FLYT_SERVER ("tcp://a:1,tcp://b:2"; one GPU keeps the single address) and the sentence
// that records where the GPUs went ("2 GPUs on node n1" / "3 GPUs across nodes n1, n2").
// It holds no state and makes no decision: Placement::PlaceGroup picks the GPUs and the
// cluster manager owns the allocations. RunEach runs one step per GPU of a group at once.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace flyt::cluster {

// The servers' endpoints in ordinal order, comma-separated; one endpoint is returned as is.
std::string JoinEndpoints(const std::vector<std::string>& endpoints);

// The distinct nodes of `node_ids` (one per GPU, ordinal order), in the order they first come.
std::vector<std::string> DistinctNodes(const std::vector<std::string>& node_ids);

// "1 GPU on node n1", "2 GPUs on node n1", "3 GPUs across nodes n1, n2": where a VM's GPUs
// are, from their nodes in ordinal order.
std::string DescribeGpuNodes(const std::vector<std::string>& node_ids);

// Runs fn(0) .. fn(n-1) at once, one thread each (n is one VM's GPU count), and waits for
// all: a VM's servers start, stop, resize and move in parallel.
void RunEach(size_t n, const std::function<void(size_t)>& fn);

}  // namespace flyt::cluster
