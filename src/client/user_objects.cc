// CUDA user objects in the client library (see user_objects.h).
#include "client/user_objects.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "client/client.h"

namespace flyt::client::user_objects {
namespace {

struct Object {
  void* ptr = nullptr;
  CUhostFn destroy = nullptr;
  uint64_t refs = 0;  // the app's, graphs' and executable graphs' together
};
using Refs = std::map<Object*, uint64_t>;

// Work for the destructor thread: wait for the events, then drop the references.
struct Release {
  std::vector<CUevent> wait_for;
  Refs refs;
};

struct Registry {
  std::mutex mu;
  std::set<Object*> objects;
  std::map<CUgraph, Refs> graphs;
  std::map<CUgraphExec, Refs> execs;
  std::map<CUgraphExec, std::set<std::pair<CUstream, bool>>> launched_on;
  std::deque<Release> queue;
  std::condition_variable wake;
  bool worker_started = false;
};

std::atomic<bool> g_any{false};

Registry& R() {
  static auto* r = new Registry;  // never destroyed: the worker may outlive main()
  return *r;
}

// Drops `refs` (lock held); the objects whose last reference went are returned, to be
// destroyed by the caller (the worker) once the lock is released.
std::vector<Object*> DropLocked(Registry& r, const Refs& refs) {
  std::vector<Object*> dead;
  for (const auto& [obj, n] : refs) {
    if (r.objects.count(obj) == 0) continue;
    obj->refs = obj->refs > n ? obj->refs - n : 0;
    if (obj->refs == 0) {
      r.objects.erase(obj);
      dead.push_back(obj);
    }
  }
  return dead;
}

void Worker() {
  Registry& r = R();
  for (;;) {
    Release job;
    {
      std::unique_lock<std::mutex> lock(r.mu);
      r.wake.wait(lock, [&] { return !r.queue.empty(); });
      job = std::move(r.queue.front());
      r.queue.pop_front();
    }
    for (CUevent e : job.wait_for) {
      cuEventSynchronize(e);  // an error (a fault, the server gone) ends the wait too
      cuEventDestroy_v2(e);
    }
    std::vector<Object*> dead;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      dead = DropLocked(r, job.refs);
    }
    for (Object* obj : dead) {
      obj->destroy(obj->ptr);
      delete obj;
    }
  }
}

// Hands a release to the destructor thread (lock held).
void QueueLocked(Registry& r, Release job) {
  if (job.refs.empty()) {
    for (CUevent e : job.wait_for) cuEventDestroy_v2(e);
    return;
  }
  r.queue.push_back(std::move(job));
  if (!r.worker_started) {
    r.worker_started = true;
    std::thread(Worker).detach();
  }
  r.wake.notify_one();
}

Object* Find(Registry& r, CUuserObject handle) {
  auto* obj = reinterpret_cast<Object*>(handle);
  return r.objects.count(obj) != 0 ? obj : nullptr;
}

// Copies `from`'s references to a new holder (a clone, a child node's copy, an
// executable graph): each counts once more.
void CopyRefsLocked(const Refs& from, Refs* to) {
  for (const auto& [obj, n] : from) {
    obj->refs += n;
    (*to)[obj] += n;
  }
}

}  // namespace

bool Any() { return g_any.load(std::memory_order_relaxed); }

void GraphCloned(CUgraph from, CUgraph clone) {
  Registry& r = R();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.graphs.find(from);
  if (it != r.graphs.end()) CopyRefsLocked(it->second, &r.graphs[clone]);
}

void ChildGraphAdded(CUgraph parent, CUgraph child) { GraphCloned(child, parent); }

void GraphDestroyed(CUgraph graph) {
  Registry& r = R();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.graphs.find(graph);
  if (it == r.graphs.end()) return;
  Release job;
  job.refs = std::move(it->second);
  r.graphs.erase(it);
  QueueLocked(r, std::move(job));
}

void Instantiated(CUgraph graph, CUgraphExec exec) {
  Registry& r = R();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.graphs.find(graph);
  if (it != r.graphs.end()) CopyRefsLocked(it->second, &r.execs[exec]);
}

void Launched(CUgraphExec exec, CUstream stream, bool per_thread) {
  Registry& r = R();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.execs.count(exec) != 0) r.launched_on[exec].insert({stream, per_thread});
}

void ExecDestroying(CUgraphExec exec) {
  Registry& r = R();
  std::set<std::pair<CUstream, bool>> streams;
  Refs refs;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.execs.find(exec);
    if (it == r.execs.end()) return;
    refs = std::move(it->second);
    r.execs.erase(it);
    auto launched = r.launched_on.find(exec);
    if (launched != r.launched_on.end()) {
      streams = std::move(launched->second);
      r.launched_on.erase(launched);
    }
  }
  // Behind the launches: an event on each stream it was launched on (outside the lock:
  // these are calls to the server).
  Release job;
  job.refs = std::move(refs);
  for (const auto& [stream, per_thread] : streams) {
    CUevent e = nullptr;
    if (cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) continue;
    CUstream s = stream == nullptr && per_thread ? CU_STREAM_PER_THREAD : stream;
    if (cuEventRecord(e, s) == CUDA_SUCCESS)
      job.wait_for.push_back(e);
    else
      cuEventDestroy_v2(e);  // the stream is gone: nothing of it to wait for
  }
  std::lock_guard<std::mutex> lock(r.mu);
  QueueLocked(r, std::move(job));
}

}  // namespace flyt::client::user_objects

using flyt::client::Client;
namespace uo = flyt::client::user_objects;

FLYT_API CUresult cuUserObjectCreate(CUuserObject* out, void* ptr, CUhostFn destroy,
                                     unsigned int initial, unsigned int flags) {
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (out == nullptr || destroy == nullptr || initial == 0 ||
      flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
    return CUDA_ERROR_INVALID_VALUE;
  auto* obj = new uo::Object{ptr, destroy, initial};
  uo::Registry& r = uo::R();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.objects.insert(obj);
  }
  uo::g_any.store(true, std::memory_order_relaxed);
  *out = reinterpret_cast<CUuserObject>(obj);
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuUserObjectRetain(CUuserObject handle, unsigned int count) {
  if (count == 0) return CUDA_ERROR_INVALID_VALUE;
  uo::Registry& r = uo::R();
  std::lock_guard<std::mutex> lock(r.mu);
  uo::Object* obj = uo::Find(r, handle);
  if (obj == nullptr) return CUDA_ERROR_INVALID_VALUE;
  obj->refs += count;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuUserObjectRelease(CUuserObject handle, unsigned int count) {
  if (count == 0) return CUDA_ERROR_INVALID_VALUE;
  uo::Registry& r = uo::R();
  std::lock_guard<std::mutex> lock(r.mu);
  uo::Object* obj = uo::Find(r, handle);
  if (obj == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uo::Release job;
  job.refs[obj] = count;
  uo::QueueLocked(r, std::move(job));
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuGraphRetainUserObject(CUgraph graph, CUuserObject handle, unsigned int count,
                                          unsigned int flags) {
  if (graph == nullptr || count == 0 || (flags & ~CU_GRAPH_USER_OBJECT_MOVE) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  uo::Registry& r = uo::R();
  std::lock_guard<std::mutex> lock(r.mu);
  uo::Object* obj = uo::Find(r, handle);
  if (obj == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // MOVE: the caller's references become the graph's; otherwise new ones.
  if ((flags & CU_GRAPH_USER_OBJECT_MOVE) == 0) obj->refs += count;
  r.graphs[graph][obj] += count;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuGraphReleaseUserObject(CUgraph graph, CUuserObject handle, unsigned int count) {
  if (graph == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  uo::Registry& r = uo::R();
  std::lock_guard<std::mutex> lock(r.mu);
  uo::Object* obj = uo::Find(r, handle);
  auto g = r.graphs.find(graph);
  if (obj == nullptr || g == r.graphs.end()) return CUDA_ERROR_INVALID_VALUE;
  auto held = g->second.find(obj);
  if (held == g->second.end() || held->second < count)
    return CUDA_ERROR_INVALID_VALUE;  // more than the graph holds
  if ((held->second -= count) == 0) g->second.erase(held);
  uo::Release job;
  job.refs[obj] = count;
  uo::QueueLocked(r, std::move(job));
  return CUDA_SUCCESS;
}
