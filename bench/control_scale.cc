// flyt-control-scale: placement at cluster scale (benchmark, not a test).
//
// Owns: a simulated cluster (N nodes x G GPUs, H200-like by default) fed to
// flyt::cluster::Placement, the VM request mix, latency/RSS measurement and the Markdown
// report on stdout. Touches no network and no real node; with --store it writes each
// allocation into that database (flyt::store), which must be a scratch one.
//
//   flyt-control-scale [--nodes 1000] [--gpus-per-node 8] [--vms 20000] [--churn 20000]
//                      [--remote-fraction 0.3] [--policy spread|pack|both] [--seed 1]
//                      [--store sqlite:PATH]
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cluster/placement.h"

#if defined(FLYT_BENCH_HAVE_STORE) && __has_include("store/store.h")
#include "store/store.h"
#define FLYT_BENCH_STORE 1
#else
#define FLYT_BENCH_STORE 0
#endif

namespace flyt::cluster {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kGiB = int64_t{1} << 30;

struct Args {
  int nodes = 1000;
  int gpus_per_node = 8;
  int sm_per_gpu = 132;
  int64_t memory_per_gpu = 141 * kGiB;
  int vms = 20000;
  int churn = 20000;
  double remote_fraction = 0.3;  // VMs whose host has no GPU (RPC-only)
  std::string policy = "both";
  uint64_t seed = 1;
  std::string store;  // "sqlite:PATH" or empty
};

[[noreturn]] void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--nodes N] [--gpus-per-node G] [--vms V] [--churn C]\n"
               "          [--remote-fraction F] [--policy spread|pack|both] [--seed S]\n"
               "          [--store sqlite:PATH]\n",
               argv0);
  std::exit(2);
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") Usage(argv[0]);
    if (i + 1 >= argc) Usage(argv[0]);
    const char* v = argv[++i];
    if (flag == "--nodes") {
      a.nodes = std::atoi(v);
    } else if (flag == "--gpus-per-node") {
      a.gpus_per_node = std::atoi(v);
    } else if (flag == "--vms") {
      a.vms = std::atoi(v);
    } else if (flag == "--churn") {
      a.churn = std::atoi(v);
    } else if (flag == "--remote-fraction") {
      a.remote_fraction = std::atof(v);
    } else if (flag == "--policy") {
      a.policy = v;
    } else if (flag == "--seed") {
      a.seed = std::strtoull(v, nullptr, 10);
    } else if (flag == "--store") {
      a.store = v;
    } else {
      Usage(argv[0]);
    }
  }
  if (a.nodes <= 0 || a.gpus_per_node <= 0 || a.vms < 0 || a.churn < 0) Usage(argv[0]);
  if (a.policy != "spread" && a.policy != "pack" && a.policy != "both") Usage(argv[0]);
  return a;
}

// kB value of a /proc/self/status line ("VmHWM", "VmRSS").
int64_t ProcStatusKb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') {
      return std::strtoll(line.c_str() + n + 1, nullptr, 10);
    }
  }
  return -1;
}

std::string NodeId(int i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "node-%04d", i);
  return buf;
}
std::string NodeHost(int i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "10.%d.%d.%d", 1 + i / 65536, (i / 256) % 256, i % 256);
  return buf;
}
std::string GpuUuid(int node, int gpu) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "GPU-%08x-%04x-4000-8000-%012x", 0x5eed0000 + node, gpu,
                node * 16 + gpu);
  return buf;
}

struct Vm {
  PlacementRequest request;
  bool local = false;  // its host has GPUs
};

// SMs in {8, 16, 32, 66}; memory 4-40 GiB in 1 GiB steps; host one of the GPU nodes, or
// (remote_fraction) a client-only host.
class VmGenerator {
 public:
  VmGenerator(const Args& args, uint64_t seed) : args_(args), rng_(seed) {}
  Vm Next() {
    static const int kSms[] = {8, 16, 32, 66};
    Vm vm;
    const int n = serial_++;
    char ip[32];
    std::snprintf(ip, sizeof(ip), "192.%d.%d.%d", 168 + n / 65536, (n / 256) % 256, n % 256);
    vm.request.vm_ip = ip;
    vm.request.sm = kSms[rng_() % 4];
    vm.request.memory_bytes = static_cast<int64_t>(4 + rng_() % 37) * kGiB;
    std::uniform_real_distribution<double> unit(0, 1);
    vm.local = unit(rng_) >= args_.remote_fraction;
    if (vm.local) {
      vm.request.host_ip = NodeHost(static_cast<int>(rng_() % args_.nodes));
    } else {
      std::snprintf(ip, sizeof(ip), "172.16.%d.%d", (n / 256) % 256, n % 256);
      vm.request.host_ip = ip;
    }
    return vm;
  }

 private:
  const Args& args_;
  std::mt19937_64 rng_;
  int serial_ = 0;
};

struct Stats {
  Stats(std::string policy_name, std::string phase_name)
      : policy(std::move(policy_name)), phase(std::move(phase_name)) {}
  std::string policy, phase;
  std::vector<double> us;  // one latency per op
  int ok = 0, refused = 0, on_host = 0;
  double total_ms = 0;
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
}

double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

struct Live {
  std::string uuid;
  int sm;
  int64_t memory;
};

void BuildCluster(const Args& args, Placement* p) {
  for (int n = 0; n < args.nodes; ++n) {
    for (int g = 0; g < args.gpus_per_node; ++g) {
      p->AddGpu(
          GpuCapacity{GpuUuid(n, g), NodeId(n), NodeHost(n), args.sm_per_gpu, args.memory_per_gpu});
    }
  }
}

// One placement + reserve; records latency of the placement (and of place+reserve).
bool PlaceOne(Placement* p, const Vm& vm, Stats* place, Stats* place_reserve,
              std::vector<Live>* live) {
  std::string uuid;
  const Clock::time_point t0 = Clock::now();
  Status s = p->Place(vm.request, &uuid);
  const Clock::time_point t1 = Clock::now();
  if (s.ok()) p->Reserve(uuid, vm.request.sm, vm.request.memory_bytes);
  const Clock::time_point t2 = Clock::now();
  place->us.push_back(Micros(t0, t1));
  if (place_reserve != nullptr) place_reserve->us.push_back(Micros(t0, t2));
  if (!s.ok()) {
    place->refused++;
    return false;
  }
  place->ok++;
  if (p->Find(uuid)->capacity.host_ip == vm.request.host_ip) place->on_host++;
  live->push_back({uuid, vm.request.sm, vm.request.memory_bytes});
  return true;
}

void RunRefusals(const Args& args, const std::string& name, const Placement& p,
                 std::vector<Stats>* out) {
  std::vector<GpuUsage> gpus = p.List();
  int64_t max_memory = 0;
  for (const GpuUsage& u : gpus) {
    max_memory = std::max(max_memory, u.capacity.memory_total - u.memory_used);
  }
  struct Hard {
    std::string phase;
    int sm;
    int64_t memory;
  };
  std::vector<Hard> hard = {{"refuse: no SMs anywhere", args.sm_per_gpu + 1, kGiB},
                            {"refuse: no memory anywhere", 8, max_memory + kGiB}};
  for (int sm = 1; sm <= args.sm_per_gpu; ++sm) {
    int64_t best = -1;
    int walk = 0;
    for (const GpuUsage& u : gpus) {
      if (u.capacity.sm_total - u.sm_used < sm) continue;
      best = std::max(best, u.capacity.memory_total - u.memory_used);
      ++walk;
    }
    if (best >= 0 && best + kGiB <= max_memory) {
      char phase[128];
      std::snprintf(phase, sizeof(phase),
                    "refuse: %d SM%s + %.0f GiB, never on one GPU (%d GPUs have the SMs)", sm,
                    sm == 1 ? "" : "s", static_cast<double>(best + kGiB) / kGiB, walk);
      hard.push_back({phase, sm, best + kGiB});
      break;
    }
  }
  for (const Hard& h : hard) {
    Stats s{name, h.phase};
    PlacementRequest r{"192.0.2.1", "172.31.0.1", h.sm, h.memory};
    std::string uuid;
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < 1000; ++i) {
      const Clock::time_point a = Clock::now();
      Status st = p.Place(r, &uuid);
      s.us.push_back(Micros(a, Clock::now()));
      (st.ok() ? s.ok : s.refused)++;
    }
    s.total_ms = Micros(t0, Clock::now()) / 1000;
    out->push_back(s);
  }
}

void RunPolicy(const Args& args, Policy policy, std::vector<Stats>* out) {
  const std::string name = policy == Policy::kSpread ? "spread" : "pack";
  Placement p(PlacementOptions{policy});
  Stats build{name, "add " + std::to_string(args.nodes * args.gpus_per_node) + " GPUs"};
  Clock::time_point t0 = Clock::now();
  BuildCluster(args, &p);
  build.total_ms = Micros(t0, Clock::now()) / 1000;
  build.ok = static_cast<int>(p.gpu_count());
  out->push_back(build);

  VmGenerator gen(args, args.seed);
  std::vector<Live> live;
  live.reserve(args.vms + args.churn);
  Stats place{name, "place " + std::to_string(args.vms) + " VMs"};
  Stats place_reserve{name, "place + reserve"};
  t0 = Clock::now();
  for (int i = 0; i < args.vms; ++i) PlaceOne(&p, gen.Next(), &place, &place_reserve, &live);
  place.total_ms = place_reserve.total_ms = Micros(t0, Clock::now()) / 1000;
  place_reserve.ok = place.ok;
  place_reserve.refused = place.refused;
  out->push_back(place);
  out->push_back(place_reserve);

  // Steady state: each step frees a random live allocation and places a new VM.
  std::mt19937_64 rng(args.seed + 7);
  Stats churn{name, "churn: release + place"};
  t0 = Clock::now();
  for (int i = 0; i < args.churn && !live.empty(); ++i) {
    const size_t k = rng() % live.size();
    const Clock::time_point r0 = Clock::now();
    p.Release(live[k].uuid, live[k].sm, live[k].memory);
    const double release_us = Micros(r0, Clock::now());
    live[k] = live.back();
    live.pop_back();
    PlaceOne(&p, gen.Next(), &churn, nullptr, &live);
    churn.us.back() += release_us;
  }
  churn.total_ms = Micros(t0, Clock::now()) / 1000;
  out->push_back(churn);

  // Refusals: (a) more SMs than any GPU has free, (b) more memory than any has free (both
  // answered from the ends of the index), (c) SMs and memory each free somewhere but never
  // on one GPU: the worst case, a visit to every free-SM bucket with enough SMs. For (c) take the
  // smallest SM count s whose best memory M_s (most free memory among GPUs with >= s free
  // SMs) is below the cluster's most free memory, and ask for s SMs and M_s + 1 GiB.
  RunRefusals(args, name, p, out);

  // Fill: keep placing new VMs until 1,000 in a row are refused (utilisation near 100%).
  Stats fill{name, "fill until 1000 refusals in a row"};
  t0 = Clock::now();
  for (int in_a_row = 0; in_a_row < 1000;) {
    in_a_row = PlaceOne(&p, gen.Next(), &fill, nullptr, &live) ? 0 : in_a_row + 1;
  }
  fill.total_ms = Micros(t0, Clock::now()) / 1000;
  out->push_back(fill);
  int64_t sm_used = 0, memory_used = 0;
  for (const GpuUsage& u : p.List()) {
    sm_used += u.sm_used;
    memory_used += u.memory_used;
  }
  const double gpus = static_cast<double>(p.gpu_count());
  char buf[160];
  std::snprintf(
      buf, sizeof(buf), "after fill: %zu allocations, SMs %.1f%% used, memory %.1f%% used",
      live.size(), 100.0 * static_cast<double>(sm_used) / (gpus * args.sm_per_gpu),
      100.0 * static_cast<double>(memory_used) / (gpus * static_cast<double>(args.memory_per_gpu)));
  Stats note{name, buf};
  note.ok = static_cast<int>(live.size());
  out->push_back(note);
  RunRefusals(args, name + " (full)", p, out);
}

#if FLYT_BENCH_STORE
// A fresh cluster (spread) backed by the store: nodes, GPUs and the VMs' requirements are
// written first (not timed), then each VM is placed, reserved and its allocation written
// with one PutAllocation (timed together), as the cluster manager's allocate path does.
Status RunStore(const Args& args, std::vector<Stats>* out) {
  std::unique_ptr<store::Store> db;
  Status s = store::Store::Open(args.store, &db);
  if (!s.ok()) return s;
  Stats setup{"spread", "store setup: nodes, GPUs, VMs (not timed per op)"};
  Clock::time_point t0 = Clock::now();
  Placement p;
  BuildCluster(args, &p);
  for (int n = 0; n < args.nodes; ++n) {
    store::Node node;
    node.node_id = NodeId(n);
    node.hostname = node.node_id;
    node.address = NodeHost(n) + ":12401";
    node.host_ip = NodeHost(n);
    node.state = "up";
    if (!(s = db->UpsertNode(node)).ok()) return s;
    std::vector<store::Gpu> gpus(args.gpus_per_node);
    for (int g = 0; g < args.gpus_per_node; ++g) {
      gpus[g].uuid = GpuUuid(n, g);
      gpus[g].name = "NVIDIA H200 (simulated)";
      gpus[g].index = g;
      gpus[g].sm_count = args.sm_per_gpu;
      gpus[g].memory_bytes = args.memory_per_gpu;
    }
    if (!(s = db->ReplaceGpus(node.node_id, gpus)).ok()) return s;
  }
  std::vector<Vm> vms;
  std::vector<store::VmRequirement> rows;
  VmGenerator gen(args, args.seed);
  for (int i = 0; i < args.vms; ++i) {
    vms.push_back(gen.Next());
    const PlacementRequest& r = vms.back().request;
    rows.push_back({r.vm_ip, r.host_ip, r.sm, static_cast<double>(r.memory_bytes) / kGiB});
  }
  if (!(s = db->UpsertVms(rows)).ok()) return s;
  setup.total_ms = Micros(t0, Clock::now()) / 1000;
  out->push_back(setup);

  Stats place{"spread", "place + reserve + store PutAllocation"};
  t0 = Clock::now();
  for (int i = 0; i < args.vms; ++i) {
    const PlacementRequest& r = vms[i].request;
    std::string uuid;
    const Clock::time_point a = Clock::now();
    Status st = p.Place(r, &uuid);
    if (st.ok()) {
      p.Reserve(uuid, r.sm, r.memory_bytes);
      const GpuUsage* gpu = p.Find(uuid);
      store::Allocation alloc;
      alloc.alloc_id = "a-" + std::to_string(i);
      alloc.vm_ip = r.vm_ip;
      alloc.node_id = gpu->capacity.node_id;
      alloc.gpu_uuid = uuid;
      alloc.token = "t-" + std::to_string(i);
      alloc.state = "starting";
      alloc.sm = r.sm;
      alloc.memory_bytes = r.memory_bytes;
      alloc.created_ms = alloc.updated_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                                std::chrono::system_clock::now().time_since_epoch())
                                                .count();
      if (!(st = db->PutAllocation(alloc)).ok()) return st;
      if (gpu->capacity.host_ip == r.host_ip) place.on_host++;
    }
    place.us.push_back(Micros(a, Clock::now()));
    (st.ok() ? place.ok : place.refused)++;
  }
  place.total_ms = Micros(t0, Clock::now()) / 1000;
  out->push_back(place);
  return Status::Ok();
}
#endif

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  }
  return "unknown";
}

int Main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  const int64_t rss_start_kb = ProcStatusKb("VmRSS");
  std::vector<Stats> stats;
  if (args.policy != "pack") RunPolicy(args, Policy::kSpread, &stats);
  if (args.policy != "spread") RunPolicy(args, Policy::kPack, &stats);
  std::string store_note;
  if (!args.store.empty()) {
#if FLYT_BENCH_STORE
    Status s = RunStore(args, &stats);
    if (!s.ok()) {
      std::fprintf(stderr, "flyt-control-scale: store %s: %s\n", args.store.c_str(),
                   s.message().c_str());
      return 1;
    }
    store_note = "store: " + args.store + " (one PutAllocation per placed VM)";
#else
    std::fprintf(stderr, "flyt-control-scale: built without flyt_store; --store unavailable\n");
    return 2;
#endif
  }

  std::printf("## flyt-control-scale\n\n");
  std::printf("- cluster: %d nodes x %d GPUs = %d GPUs, %d SMs and %.1f GiB each\n", args.nodes,
              args.gpus_per_node, args.nodes * args.gpus_per_node, args.sm_per_gpu,
              static_cast<double>(args.memory_per_gpu) / kGiB);
  std::printf(
      "- VMs: %d placed then reserved one by one, then %d churn steps (release a random "
      "allocation, place a new VM); SMs in {8,16,32,66}, memory 4-40 GiB, %.0f%% from hosts "
      "without GPUs, seed %" PRIu64 "\n",
      args.vms, args.churn, args.remote_fraction * 100, args.seed);
  std::printf("- CPU: %s; latencies from steady_clock around each call, single thread\n",
              CpuModel().c_str());
  if (!store_note.empty()) std::printf("- %s\n", store_note.c_str());
  std::printf(
      "\n| policy | phase | ok | refused | on VM's host | median µs | p99 µs | max µs | "
      "total ms |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Stats& s : stats) {
    if (s.us.empty()) {  // a step without per-op latencies, or a note
      char total[32] = "";
      if (s.total_ms > 0) std::snprintf(total, sizeof(total), "%.1f", s.total_ms);
      std::printf("| %s | %s | %d | | | | | | %s |\n", s.policy.c_str(), s.phase.c_str(), s.ok,
                  total);
      continue;
    }
    std::string on_host = s.ok > 0 && s.on_host > 0 ? std::to_string(s.on_host) : "";
    std::printf("| %s | %s | %d | %d | %s | %.2f | %.2f | %.1f | %.1f |\n", s.policy.c_str(),
                s.phase.c_str(), s.ok, s.refused, on_host.c_str(), Percentile(s.us, 0.5),
                Percentile(s.us, 0.99), Percentile(s.us, 1.0), s.total_ms);
  }
  std::printf("\n| memory | MiB |\n|---|---:|\n");
  std::printf("| VmRSS at start | %.1f |\n", static_cast<double>(rss_start_kb) / 1024);
  std::printf("| VmRSS at end | %.1f |\n", static_cast<double>(ProcStatusKb("VmRSS")) / 1024);
  std::printf("| peak (VmHWM) | %.1f |\n", static_cast<double>(ProcStatusKb("VmHWM")) / 1024);
  return 0;
}

}  // namespace
}  // namespace flyt::cluster

int main(int argc, char** argv) { return flyt::cluster::Main(argc, argv); }
