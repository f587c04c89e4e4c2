// The sim backend's NCCL: a test double of NVIDIA's NCCL for flyt-server's
// --backend sim. The sim's device memory is host memory of the worker process
// at the device address (server/sim_backend.cc), so a collective reads and
// writes the app's buffers with memcpy, synchronously at the call; streams are
// ignored (any value).
//
// Owns: the rendezvous hubs, the communicators of this process, the per-thread
// group state, the PreMulSum ops and the thread-local last error text.
// - ncclGetUniqueId starts a hub in the calling process: a thread listening on
//   127.0.0.1 (a port the kernel picks) and one thread per connected rank. The
//   id carries a magic, that port and a random nonce. A hub lives until its
//   process exits (its threads are detached, its state never freed), so ids of
//   a process stay valid for as long as it runs.
// - A communicator is one TCP connection to its hub. Ranks of one communicator
//   may live in different processes; everything they share goes through the
//   hub, which matches a communicator's collectives by a sequence number
//   (point-to-point: by sender, receiver and a per-pair number), checks that
//   the ranks agree (else ncclInvalidUsage on every rank), computes each rank's
//   result and sends it back. A rank whose connection closes (destroy, abort,
//   exit, a malformed message) breaks its communicator: the others' pending and
//   later operations fail with ncclRemoteError (and it becomes their sticky
//   asynchronous error). ncclCommSplit goes through the hub too: it hands out
//   new communicator keys, and each new rank joins its key on a new connection.
// - Handles are checked against a registry of live communicators, so a stale or
//   forged handle is ncclInvalidArgument rather than a crash.
// - ncclGroupStart/End: calls made inside a group (inits, splits, collectives,
//   send/recv) are deferred to the outermost ncclGroupEnd and then run
//   concurrently, one thread each. An init in a group hands out its handle at
//   the call; operations on it wait for the join.
// Limits: a collective moves at most 1 GiB per buffer (else ncclInvalidArgument),
// a communicator has at most 65536 ranks; an init waits for its peers at most
// FLYT_SIM_NCCL_TIMEOUT_MS (default 60000; then ncclSystemError). Not modelled:
// non-blocking communicators (config->blocking = 0 blocks as well),
// ncclCommInitRankScalable and ncclCommShrink (left null), the fp8 types.
//
// Must not touch: the sim's driver state (it asks only SimCurrentDevice),
// sessions or the wire.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/log.h"
#include "server/nccl_api.h"

namespace flyt::server {
namespace {

// ncclResult_t values as int, the type of every entry point's result.
constexpr int kSuccess = nccl::kSuccess;
constexpr int kSystemError = nccl::kSystemError;
constexpr int kInvalidArgument = nccl::kInvalidArgument;
constexpr int kInvalidUsage = nccl::kInvalidUsage;
constexpr int kRemoteError = nccl::kRemoteError;

constexpr uint32_t kIdMagic = 0x464c4e53;  // "SNLF"
constexpr uint64_t kMaxBytes = 1ull << 30;
constexpr uint32_t kMaxFrame = kMaxBytes + 256;
constexpr int kMaxRanks = 1 << 16;
constexpr int kNumTypes = 10;  // ncclInt8 .. ncclBfloat16
constexpr int kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4, kNumOps = 5;
constexpr int kPreMulWire = kNumOps;  // a PreMulSum, scaled by each rank before it sends
constexpr int kNoColor = -1;          // NCCL_SPLIT_NOCOLOR
constexpr int kVersion = 22809;       // 2.28.9

// Messages to the hub: u32 length, u8 kind, u64 request, then the fields below.
// Replies: u32 length, u64 request, i32 ncclResult_t, then the data.
enum Msg : uint8_t {
  kJoin = 1,  // u64 nonce, u64 communicator key, i32 nranks, i32 rank
  kColl = 2,  // u64 seq, u8 Kind, u64 count, i32 type, i32 op, i32 root, data
  kSend = 3,  // u64 seq, i32 peer, u64 count, i32 type, data
  kRecv = 4,  // u64 seq, i32 peer, u64 count, i32 type
};
// Collective kinds on the wire (kSplit: op carries the key, root the color;
// its reply is u64 new key (0: none), i32 rank, i32 nranks).
enum Kind : uint8_t {
  kAllReduce = 1,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAlltoAll,
  kSplit
};

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
int64_t TimeoutMs() {
  const char* s = std::getenv("FLYT_SIM_NCCL_TIMEOUT_MS");
  if (s == nullptr || *s == '\0') return 60000;
  char* end = nullptr;
  long long v = std::strtoll(s, &end, 10);
  return end != nullptr && *end == '\0' && v > 0 ? v : 60000;
}

// ---- bytes and sockets ------------------------------------------------------

struct Writer {
  std::vector<uint8_t> b;
  template <typename T>
  void Put(T v) {
    size_t n = b.size();
    b.resize(n + sizeof v);
    std::memcpy(b.data() + n, &v, sizeof v);
  }
};
struct Reader {
  const uint8_t* p;
  size_t n;
  bool ok = true;
  template <typename T>
  T Get() {
    T v{};
    if (n < sizeof v) {
      ok = false;
      return v;
    }
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    n -= sizeof v;
    return v;
  }
};

bool WriteAll(int fd, const void* data, size_t n) {
  auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
// deadline: NowMs() value, or -1 for none.
bool ReadAll(int fd, void* data, size_t n, int64_t deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    if (deadline >= 0) {
      int64_t left = deadline - NowMs();
      if (left <= 0) return false;
      pollfd pfd{fd, POLLIN, 0};
      int r = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return false;
      if (r == 0) continue;  // the loop's deadline check ends it
    }
    ssize_t got = recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}
bool ReadFrame(int fd, std::vector<uint8_t>* out, int64_t deadline) {
  uint32_t len = 0;
  if (!ReadAll(fd, &len, sizeof len, deadline) || len > kMaxFrame) return false;
  try {
    out->resize(len);
  } catch (const std::exception&) {
    return false;
  }
  return ReadAll(fd, out->data(), len, deadline);
}
void NoDelay(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
    FLYT_DEBUG("sim nccl: TCP_NODELAY: %s", std::strerror(errno));
}

// ---- element types and reductions -------------------------------------------

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, mant = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant != 0 ? 0x200u : 0));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    int shift = 14 - e;
    uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u) != 0)) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13), rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u) != 0)) ++half;  // may carry into inf
  return static_cast<uint16_t>(half);
}
float Bf16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

template <typename T>
struct Plain {
  using Acc = T;
  static constexpr size_t kBytes = sizeof(T);
  static Acc Load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void Store(uint8_t* p, Acc v) { std::memcpy(p, &v, sizeof v); }
};
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
struct Short16 {
  using Acc = float;
  static constexpr size_t kBytes = 2;
  static Acc Load(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return ToF(v);
  }
  static void Store(uint8_t* p, Acc v) {
    uint16_t h = FromF(v);
    std::memcpy(p, &h, sizeof h);
  }
};
using Half = Short16<HalfToFloat, FloatToHalf>;
using Bf16 = Short16<Bf16ToFloat, FloatToBf16>;

// a op b; integers wrap (as on the GPU) instead of overflowing.
template <typename Acc>
Acc Combine(int op, Acc a, Acc b) {
  if constexpr (std::is_integral_v<Acc>) {
    using U = std::make_unsigned_t<Acc>;
    switch (op) {
      case kProd:
        return static_cast<Acc>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case kMax:
        return std::max(a, b);
      case kMin:
        return std::min(a, b);
      default:  // sum, avg, PreMulSum
        return static_cast<Acc>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    }
  } else {
    switch (op) {
      case kProd:
        return a * b;
      case kMax:
        return std::max(a, b);
      case kMin:
        return std::min(a, b);
      default:
        return a + b;
    }
  }
}
template <typename Acc>
Acc Average(Acc sum, int n) {
  if constexpr (std::is_integral_v<Acc> && std::is_signed_v<Acc>)
    return static_cast<Acc>(static_cast<int64_t>(sum) / n);
  else if constexpr (std::is_integral_v<Acc>)
    return static_cast<Acc>(static_cast<uint64_t>(sum) / static_cast<uint64_t>(n));
  else
    return sum / static_cast<Acc>(n);
}

template <typename E>
void ReduceT(int op, const std::vector<const uint8_t*>& src, size_t count, uint8_t* out) {
  const int n = static_cast<int>(src.size());
  for (size_t i = 0; i < count; ++i) {
    const size_t at = i * E::kBytes;
    typename E::Acc acc = E::Load(src[0] + at);
    for (int r = 1; r < n; ++r) acc = Combine(op, acc, E::Load(src[r] + at));
    if (op == kAvg) acc = Average(acc, n);
    E::Store(out + at, acc);
  }
}
template <typename E>
void ScaleT(const uint8_t* scalar, const uint8_t* in, size_t count, uint8_t* out) {
  typename E::Acc s = E::Load(scalar);
  for (size_t i = 0; i < count; ++i)
    E::Store(out + i * E::kBytes, Combine(kProd, E::Load(in + i * E::kBytes), s));
}

template <template <typename> class F, typename... A>
void ByType(int type, A&&... a) {
  switch (type) {
    case 0:
      F<Plain<int8_t>>::Run(std::forward<A>(a)...);
      break;
    case 1:
      F<Plain<uint8_t>>::Run(std::forward<A>(a)...);
      break;
    case 2:
      F<Plain<int32_t>>::Run(std::forward<A>(a)...);
      break;
    case 3:
      F<Plain<uint32_t>>::Run(std::forward<A>(a)...);
      break;
    case 4:
      F<Plain<int64_t>>::Run(std::forward<A>(a)...);
      break;
    case 5:
      F<Plain<uint64_t>>::Run(std::forward<A>(a)...);
      break;
    case 6:
      F<Half>::Run(std::forward<A>(a)...);
      break;
    case 7:
      F<Plain<float>>::Run(std::forward<A>(a)...);
      break;
    case 8:
      F<Plain<double>>::Run(std::forward<A>(a)...);
      break;
    case 9:
      F<Bf16>::Run(std::forward<A>(a)...);
      break;
    default:
      break;
  }
}
template <typename E>
struct ReduceFn {
  static void Run(int op, const std::vector<const uint8_t*>& src, size_t count, uint8_t* out) {
    ReduceT<E>(op, src, count, out);
  }
};
template <typename E>
struct ScaleFn {
  static void Run(const uint8_t* scalar, const uint8_t* in, size_t count, uint8_t* out) {
    ScaleT<E>(scalar, in, count, out);
  }
};

// count elements of `type` as bytes, or nullopt above kMaxBytes / for a bad type.
std::optional<uint64_t> Bytes(uint64_t count, int type, uint64_t times = 1) {
  if (type < 0 || type >= kNumTypes) return std::nullopt;
  uint64_t es = nccl::DataTypeBytes(type);
  if (count > kMaxBytes / es / std::max<uint64_t>(times, 1)) return std::nullopt;
  return count * es * times;
}

// ---- the hub ----------------------------------------------------------------

struct HubComm;
struct HubConn {
  explicit HubConn(int f) : fd(f) {}
  ~HubConn() { close(fd); }
  HubConn(const HubConn&) = delete;
  HubConn& operator=(const HubConn&) = delete;
  const int fd;
  std::mutex write_mu;
  // Set at its join (Hub::mu held).
  std::shared_ptr<HubComm> comm;
  int rank = -1;

  void Reply(uint64_t req, int result, const void* data = nullptr, size_t n = 0) {
    Writer w;
    w.Put<uint32_t>(static_cast<uint32_t>(sizeof(uint64_t) + sizeof(int32_t) + n));
    w.Put<uint64_t>(req);
    w.Put<int32_t>(result);
    std::lock_guard<std::mutex> lock(write_mu);
    if (!WriteAll(fd, w.b.data(), w.b.size()) || (n > 0 && !WriteAll(fd, data, n)))
      shutdown(fd, SHUT_RDWR);  // its reader sees the end and reports it gone
  }
};
struct Contribution {
  uint64_t req = 0;
  uint8_t kind = 0;
  uint64_t count = 0;
  int32_t type = 0, op = 0, root = 0;
  std::vector<uint8_t> data;
};
struct CollSlot {
  std::vector<std::optional<Contribution>> by_rank;
  int arrived = 0;
};
struct P2PSlot {
  std::optional<Contribution> send, recv;
};
struct HubComm {
  int nranks = 0;
  std::vector<std::shared_ptr<HubConn>> members;
  std::vector<uint64_t> join_reqs;
  int joined = 0;
  bool ready = false;
  bool broken = false;
  std::map<uint64_t, CollSlot> colls;
  std::map<std::tuple<int, int, uint64_t>, P2PSlot> p2p;  // (from, to, seq)
};
struct Hub {
  uint64_t nonce = 0;
  int listen_fd = -1;
  std::mutex mu;
  std::map<uint64_t, std::shared_ptr<HubComm>> comms;  // key 0: the id's own
  std::set<uint64_t> split_keys;
  uint64_t next_key = 1;
};
struct Out {
  std::shared_ptr<HubConn> to;
  uint64_t req;
  int result;
  std::vector<uint8_t> data;
};
void Send(std::vector<Out>& outs) {
  for (Out& o : outs)
    if (o.to != nullptr) o.to->Reply(o.req, o.result, o.data.data(), o.data.size());
}

// Every rank's contribution to one collective is in; computes and answers.
void Complete(Hub* hub, std::vector<std::shared_ptr<HubConn>> members, CollSlot slot) {
  const int n = static_cast<int>(members.size());
  std::vector<Out> outs(n);
  const Contribution& c0 = *slot.by_rank[0];
  bool agree = true;
  for (int r = 0; r < n; ++r) {
    const Contribution& c = *slot.by_rank[r];
    outs[r].to = members[r];
    outs[r].req = c.req;
    outs[r].result = kSuccess;
    if (c.kind != c0.kind) agree = false;
    if (c0.kind != kSplit &&
        (c.count != c0.count || c.type != c0.type || c.op != c0.op || c.root != c0.root))
      agree = false;
  }
  if (!agree) {
    for (Out& o : outs) o.result = kInvalidUsage;
    Send(outs);
    return;
  }
  const uint64_t b = c0.count * nccl::DataTypeBytes(c0.type);  // checked at arrival
  auto reduce = [&](size_t offset, uint8_t* out) {
    std::vector<const uint8_t*> src(n);
    for (int r = 0; r < n; ++r) src[r] = slot.by_rank[r]->data.data() + offset;
    ByType<ReduceFn>(c0.type, c0.op, src, static_cast<size_t>(c0.count), out);
  };
  try {
    switch (c0.kind) {
      case kAllReduce:
        outs[0].data.resize(b);
        reduce(0, outs[0].data.data());
        for (int r = 1; r < n; ++r) outs[r].data = outs[0].data;
        break;
      case kReduce:
        outs[c0.root].data.resize(b);
        reduce(0, outs[c0.root].data.data());
        break;
      case kBroadcast:
        for (int r = 0; r < n; ++r) outs[r].data = slot.by_rank[c0.root]->data;
        break;
      case kAllGather:
        outs[0].data.reserve(b * n);
        for (int r = 0; r < n; ++r)
          outs[0].data.insert(outs[0].data.end(), slot.by_rank[r]->data.begin(),
                              slot.by_rank[r]->data.end());
        for (int r = 1; r < n; ++r) outs[r].data = outs[0].data;
        break;
      case kReduceScatter:
        for (int r = 0; r < n; ++r) {
          outs[r].data.resize(b);
          reduce(b * r, outs[r].data.data());
        }
        break;
      case kAlltoAll:
        for (int r = 0; r < n; ++r) {
          outs[r].data.reserve(b * n);
          for (int j = 0; j < n; ++j) {
            const uint8_t* from = slot.by_rank[j]->data.data() + b * r;
            outs[r].data.insert(outs[r].data.end(), from, from + b);
          }
        }
        break;
      case kSplit: {
        std::map<int, std::vector<std::pair<int, int>>> colors;  // color -> (key, rank)
        for (int r = 0; r < n; ++r)
          if (slot.by_rank[r]->root != kNoColor)
            colors[slot.by_rank[r]->root].emplace_back(slot.by_rank[r]->op, r);
        for (Out& o : outs) {
          Writer w;
          w.Put<uint64_t>(0);
          w.Put<int32_t>(-1);
          w.Put<int32_t>(0);
          o.data = std::move(w.b);
        }
        for (auto& [color, ranks] : colors) {
          std::sort(ranks.begin(), ranks.end());
          uint64_t key;
          {
            std::lock_guard<std::mutex> lock(hub->mu);
            key = hub->next_key++;
            hub->split_keys.insert(key);
          }
          for (size_t i = 0; i < ranks.size(); ++i) {
            Writer w;
            w.Put<uint64_t>(key);
            w.Put<int32_t>(static_cast<int32_t>(i));
            w.Put<int32_t>(static_cast<int32_t>(ranks.size()));
            outs[ranks[i].second].data = std::move(w.b);
          }
        }
        break;
      }
      default:
        for (Out& o : outs) o.result = kInvalidUsage;
    }
  } catch (const std::exception&) {  // out of memory
    for (Out& o : outs) {
      o.result = kSystemError;
      o.data.clear();
    }
  }
  Send(outs);
}

// The bytes a rank sends for a collective, or nullopt when the fields are bad.
std::optional<uint64_t> ContributionBytes(const Contribution& c, int nranks, int rank) {
  if (c.kind == kSplit) return c.root >= kNoColor ? std::optional<uint64_t>(0) : std::nullopt;
  if (c.kind < kAllReduce || c.kind > kAlltoAll) return std::nullopt;
  if ((c.kind == kBroadcast || c.kind == kReduce) && (c.root < 0 || c.root >= nranks))
    return std::nullopt;
  if (c.op < 0 || c.op > kPreMulWire) return std::nullopt;
  const bool wide = c.kind == kReduceScatter || c.kind == kAlltoAll;
  auto b = Bytes(c.count, c.type, wide ? static_cast<uint64_t>(nranks) : 1);
  if (!b) return std::nullopt;
  if (c.kind == kBroadcast && rank != c.root) return 0;
  return b;
}

// A connection ended: a rank of a joined communicator breaks it.
void Departed(Hub* hub, const std::shared_ptr<HubConn>& c) {
  shutdown(c->fd, SHUT_RDWR);
  std::vector<Out> outs;
  {
    std::lock_guard<std::mutex> lock(hub->mu);
    std::shared_ptr<HubComm> comm = std::move(c->comm);
    if (comm == nullptr) return;
    comm->members[c->rank] = nullptr;
    if (!comm->ready) {
      --comm->joined;
      return;
    }
    comm->broken = true;
    auto fail = [&](const std::optional<Contribution>& x, int rank) {
      if (x && rank != c->rank && comm->members[rank] != nullptr)
        outs.push_back({comm->members[rank], x->req, kRemoteError, {}});
    };
    for (auto& [seq, slot] : comm->colls)
      for (int r = 0; r < comm->nranks; ++r) fail(slot.by_rank[r], r);
    for (auto& [key, slot] : comm->p2p) {
      fail(slot.send, std::get<0>(key));
      fail(slot.recv, std::get<1>(key));
    }
    comm->colls.clear();
    comm->p2p.clear();
  }
  Send(outs);
}

// One message from a rank; false: malformed (the connection is closed).
bool Handle(Hub* hub, const std::shared_ptr<HubConn>& c, const std::vector<uint8_t>& frame) {
  Reader in{frame.data(), frame.size()};
  const auto msg = in.Get<uint8_t>();
  const auto req = in.Get<uint64_t>();
  if (!in.ok) return false;
  if (msg == kJoin) {
    const auto nonce = in.Get<uint64_t>();
    const auto key = in.Get<uint64_t>();
    const auto nranks = in.Get<int32_t>();
    const auto rank = in.Get<int32_t>();
    if (!in.ok || in.n != 0) return false;
    std::vector<Out> outs;
    {
      std::lock_guard<std::mutex> lock(hub->mu);
      if (c->comm != nullptr) return false;
      if (nonce != hub->nonce || (key != 0 && hub->split_keys.count(key) == 0) || nranks < 1 ||
          nranks > kMaxRanks || rank < 0 || rank >= nranks) {
        outs.push_back({c, req, kInvalidArgument, {}});
      } else {
        std::shared_ptr<HubComm>& comm = hub->comms[key];
        if (comm == nullptr) {
          comm = std::make_shared<HubComm>();
          comm->nranks = nranks;
          comm->members.resize(nranks);
          comm->join_reqs.resize(nranks);
        }
        if (comm->ready || comm->nranks != nranks || comm->members[rank] != nullptr) {
          outs.push_back({c, req, kInvalidUsage, {}});
        } else {
          comm->members[rank] = c;
          comm->join_reqs[rank] = req;
          c->comm = comm;
          c->rank = rank;
          if (++comm->joined == nranks) {
            comm->ready = true;
            for (int r = 0; r < nranks; ++r)
              outs.push_back({comm->members[r], comm->join_reqs[r], kSuccess, {}});
            if (key != 0) hub->split_keys.erase(key);  // joined for good: not again
          }
        }
      }
    }
    Send(outs);
    return outs.empty() || outs[0].result == kSuccess;
  }
  if (msg == kColl) {
    Contribution x;
    x.req = req;
    const auto seq = in.Get<uint64_t>();
    x.kind = in.Get<uint8_t>();
    x.count = in.Get<uint64_t>();
    x.type = in.Get<int32_t>();
    x.op = in.Get<int32_t>();
    x.root = in.Get<int32_t>();
    if (!in.ok) return false;
    std::shared_ptr<HubComm> comm;
    int rank;
    {
      std::lock_guard<std::mutex> lock(hub->mu);
      comm = c->comm;
      rank = c->rank;
    }
    if (comm == nullptr) return false;
    auto bytes = ContributionBytes(x, comm->nranks, rank);
    if (!bytes || *bytes != in.n) return false;
    x.data.assign(in.p, in.p + in.n);
    std::optional<CollSlot> done;
    std::vector<std::shared_ptr<HubConn>> members;
    bool broken = false;
    {
      std::lock_guard<std::mutex> lock(hub->mu);
      if (!comm->ready) return false;
      if (comm->broken) {
        broken = true;
      } else {
        CollSlot& slot = comm->colls[seq];
        if (slot.by_rank.empty()) slot.by_rank.resize(comm->nranks);
        if (slot.by_rank[rank]) return false;
        slot.by_rank[rank] = std::move(x);
        if (++slot.arrived == comm->nranks) {
          done = std::move(slot);
          comm->colls.erase(seq);
          members = comm->members;
        }
      }
    }
    if (broken) c->Reply(req, kRemoteError);  // outside the lock: it may block
    if (done) Complete(hub, std::move(members), std::move(*done));
    return true;
  }
  if (msg == kSend || msg == kRecv) {
    Contribution x;
    x.req = req;
    x.kind = msg;
    const auto seq = in.Get<uint64_t>();
    const auto peer = in.Get<int32_t>();
    x.count = in.Get<uint64_t>();
    x.type = in.Get<int32_t>();
    if (!in.ok) return false;
    std::shared_ptr<HubComm> comm;
    int rank;
    {
      std::lock_guard<std::mutex> lock(hub->mu);
      comm = c->comm;
      rank = c->rank;
    }
    auto bytes = Bytes(x.count, x.type);
    if (comm == nullptr || peer < 0 || peer >= comm->nranks || !bytes ||
        in.n != (msg == kSend ? *bytes : 0))
      return false;
    x.data.assign(in.p, in.p + in.n);
    std::vector<Out> outs;
    {
      std::lock_guard<std::mutex> lock(hub->mu);
      if (comm->broken) {
        outs.push_back({c, req, kRemoteError, {}});
      } else {
        auto key = msg == kSend ? std::make_tuple(rank, static_cast<int>(peer), seq)
                                : std::make_tuple(static_cast<int>(peer), rank, seq);
        P2PSlot& slot = comm->p2p[key];
        std::optional<Contribution>& mine = msg == kSend ? slot.send : slot.recv;
        if (mine) return false;
        mine = std::move(x);
        if (slot.send && slot.recv) {
          const int from = std::get<0>(key), to = std::get<1>(key);
          const bool agree =
              slot.send->count == slot.recv->count && slot.send->type == slot.recv->type;
          const int rc = agree ? kSuccess : kInvalidUsage;
          outs.push_back({comm->members[from], slot.send->req, rc, {}});
          outs.push_back({comm->members[to], slot.recv->req, rc,
                          agree ? std::move(slot.send->data) : std::vector<uint8_t>{}});
          comm->p2p.erase(key);
        }
      }
    }
    Send(outs);
    return true;
  }
  return false;
}

void ServeConn(Hub* hub, std::shared_ptr<HubConn> c) {
  std::vector<uint8_t> frame;
  bool first = true;
  while (ReadFrame(c->fd, &frame, first ? NowMs() + TimeoutMs() : -1)) {
    first = false;
    if (!Handle(hub, c, frame)) break;
  }
  Departed(hub, c);
}
void Accept(Hub* hub) {
  for (;;) {
    int fd = accept4(hub->listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EINTR && errno != ECONNABORTED) {
        FLYT_WARN("sim nccl: hub accept: %s", std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      continue;
    }
    NoDelay(fd);
    auto c = std::make_shared<HubConn>(fd);
    try {
      std::thread(ServeConn, hub, c).detach();
    } catch (const std::exception&) {
      FLYT_WARN("sim nccl: hub cannot start a thread for a rank");
    }
  }
}

// ---- ranks --------------------------------------------------------------------

// This process's end of one communicator's connection: requests are numbered,
// and whichever waiting thread reads a reply hands it to its owner, so that the
// concurrent operations of a group can share it.
struct RankConn {
  explicit RankConn(int f) : fd(f) {}
  ~RankConn() { close(fd); }
  RankConn(const RankConn&) = delete;
  RankConn& operator=(const RankConn&) = delete;
  const int fd;
  std::mutex write_mu;
  std::mutex mu;
  std::condition_variable cv;
  bool reading = false;
  bool dead = false;
  std::map<uint64_t, std::pair<int, std::vector<uint8_t>>> replies;
  std::atomic<uint64_t> next_req{1};

  // Sends a message (kind, fields, then `n` bytes at `data`) and waits for its
  // answer: the hub's result (and *out its data), or kSystemError when the
  // connection failed or the deadline (NowMs(), -1: none) passed.
  int Call(uint8_t kind, const Writer& fields, const void* data, size_t n,
           std::vector<uint8_t>* out, int64_t deadline = -1) {
    const uint64_t req = next_req++;
    Writer w;
    w.Put<uint32_t>(static_cast<uint32_t>(1 + sizeof req + fields.b.size() + n));
    w.Put<uint8_t>(kind);
    w.Put<uint64_t>(req);
    w.b.insert(w.b.end(), fields.b.begin(), fields.b.end());
    {
      std::lock_guard<std::mutex> lock(write_mu);
      if (!WriteAll(fd, w.b.data(), w.b.size()) || (n > 0 && !WriteAll(fd, data, n))) {
        shutdown(fd, SHUT_RDWR);
        return kSystemError;
      }
    }
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (auto it = replies.find(req); it != replies.end()) {
        int rc = it->second.first;
        if (out != nullptr) *out = std::move(it->second.second);
        replies.erase(it);
        return rc;
      }
      if (dead) return kSystemError;
      if (reading) {
        cv.wait(lock);
        continue;
      }
      reading = true;
      lock.unlock();
      std::vector<uint8_t> frame;
      bool ok = ReadFrame(fd, &frame, deadline);
      Reader in{frame.data(), frame.size()};
      const auto id = in.Get<uint64_t>();
      const auto rc = in.Get<int32_t>();
      lock.lock();
      reading = false;
      if (!ok || !in.ok) {
        dead = true;
        shutdown(fd, SHUT_RDWR);
      } else {
        replies[id] = {rc, std::vector<uint8_t>(in.p, in.p + in.n)};
      }
      cv.notify_all();
    }
  }
};

struct RedOp {
  int type = 0;
  bool device = false;
  uint8_t value[8] = {};      // host-immediate: the scalar's bytes
  const void* ptr = nullptr;  // device: read at each collective
};

struct Comm {
  int nranks = 0, rank = 0, device = 0;
  uint16_t port = 0;
  uint64_t nonce = 0;
  std::shared_ptr<RankConn> conn;  // set by the join
  std::atomic<int> async_error{kSuccess};

  std::mutex mu;
  std::condition_variable cv;
  enum State { kPending, kReady, kFailed } state = kPending;
  uint64_t coll_seq = 0;
  std::map<int, uint64_t> send_seq, recv_seq;
  std::map<int, RedOp> redops;
  std::set<uintptr_t> registrations;
  uintptr_t next_registration = 1;

  void Shutdown() {
    std::lock_guard<std::mutex> lock(mu);
    if (conn != nullptr) shutdown(conn->fd, SHUT_RDWR);
  }
};

struct Registry {
  std::mutex mu;
  std::map<void*, std::shared_ptr<Comm>> comms;
};
Registry& Reg() {
  static auto* r = new Registry;
  return *r;
}
std::shared_ptr<Comm> Lookup(NcclComm h) {
  if (h == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(Reg().mu);
  auto it = Reg().comms.find(h);
  return it != Reg().comms.end() ? it->second : nullptr;
}
NcclComm Register(const std::shared_ptr<Comm>& c) {
  std::lock_guard<std::mutex> lock(Reg().mu);
  Reg().comms[c.get()] = c;
  return c.get();
}
std::shared_ptr<Comm> Unregister(NcclComm h) {
  std::lock_guard<std::mutex> lock(Reg().mu);
  auto it = Reg().comms.find(h);
  if (it == Reg().comms.end()) return nullptr;
  auto c = std::move(it->second);
  Reg().comms.erase(it);
  return c;
}

thread_local std::string t_last_error;

int Fail(int rc, std::string* error, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
int Fail(int rc, std::string* error, const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  *error = buf;
  return rc;
}
// An argument error of an entry point: the thread's last error.
int Bad(int rc, const char* what) {
  t_last_error = what;
  return rc;
}

// ---- groups -------------------------------------------------------------------

using Task = std::function<int(std::string* error)>;
struct GroupState {
  int depth = 0;
  std::vector<Task> tasks;
};
thread_local GroupState t_group;

int RunAll(std::vector<Task> tasks) {
  std::vector<int> rcs(tasks.size(), kSuccess);
  std::vector<std::string> errors(tasks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (i + 1 == tasks.size()) {
      rcs[i] = tasks[i](&errors[i]);  // the last on this thread
      break;
    }
    try {
      threads.emplace_back([&, i] { rcs[i] = tasks[i](&errors[i]); });
    } catch (const std::exception&) {
      rcs[i] = Fail(kSystemError, &errors[i], "cannot start a thread for a group's call");
    }
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < tasks.size(); ++i)
    if (rcs[i] != kSuccess) {
      t_last_error = errors[i];
      return rcs[i];
    }
  return kSuccess;
}
// Runs now, or at the outermost ncclGroupEnd inside a group.
int Submit(Task task) {
  if (t_group.depth > 0) {
    t_group.tasks.push_back(std::move(task));
    return kSuccess;
  }
  std::string error;
  int rc = task(&error);
  if (rc != kSuccess) t_last_error = error;
  return rc;
}

// ---- communicators --------------------------------------------------------------

struct IdFields {
  uint32_t magic;
  uint32_t port;
  uint64_t nonce;
};
std::optional<IdFields> ParseId(const nccl::UniqueId& id) {
  IdFields f;
  std::memcpy(&f, id.internal, sizeof f);
  if (f.magic != kIdMagic || f.port == 0 || f.port > 65535) return std::nullopt;
  return f;
}

// Connects `c` to its hub as (key, nranks, rank) and waits for every rank.
int Join(Comm* c, uint64_t key, std::string* error) {
  int rc = kSystemError;
  std::shared_ptr<RankConn> conn;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    rc = Fail(kSystemError, error, "socket: %s", std::strerror(errno));
  } else {
    conn = std::make_shared<RankConn>(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(c->port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int r;
    do {
      r = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    } while (r != 0 && errno == EINTR);
    if (r != 0) {
      rc = Fail(kSystemError, error, "cannot reach the id's rendezvous (127.0.0.1:%u): %s",
                static_cast<unsigned>(c->port), std::strerror(errno));
    } else {
      NoDelay(fd);
      {
        std::lock_guard<std::mutex> lock(c->mu);
        c->conn = conn;
      }
      Writer w;
      w.Put<uint64_t>(c->nonce);
      w.Put<uint64_t>(key);
      w.Put<int32_t>(c->nranks);
      w.Put<int32_t>(c->rank);
      const int64_t timeout = TimeoutMs();
      rc = conn->Call(kJoin, w, nullptr, 0, nullptr, NowMs() + timeout);
      if (rc == kInvalidUsage)
        Fail(rc, error, "rank %d of %d joined twice, or with another rank count", c->rank,
             c->nranks);
      else if (rc == kInvalidArgument)
        Fail(rc, error, "the unique id is not this rendezvous's");
      else if (rc != kSuccess)
        Fail(rc, error, "rank %d of %d: not every rank joined within %lld ms", c->rank, c->nranks,
             static_cast<long long>(timeout));
    }
  }
  std::lock_guard<std::mutex> lock(c->mu);
  c->state = rc == kSuccess ? Comm::kReady : Comm::kFailed;
  if (rc != kSuccess) {
    c->async_error = rc;
    if (conn != nullptr) shutdown(conn->fd, SHUT_RDWR);
  }
  c->cv.notify_all();
  return rc;
}

// The connection of a communicator once its join is done (inside a group the
// join may run beside this call); null with *rc set when it failed.
std::shared_ptr<RankConn> Ready(Comm* c, int* rc, std::string* error) {
  std::unique_lock<std::mutex> lock(c->mu);
  c->cv.wait(lock, [c] { return c->state != Comm::kPending; });
  if (c->state == Comm::kReady && c->conn != nullptr) return c->conn;
  *rc = Fail(kInvalidUsage, error, "the communicator's init failed");
  return nullptr;
}
// A failure of the transport or a peer: the communicator's sticky error.
int Remote(Comm* c, int rc, std::string* error) {
  if (rc == kRemoteError || rc == kSystemError) {
    int expected = kSuccess;
    c->async_error.compare_exchange_strong(expected, rc);
    Fail(rc, error,
         rc == kRemoteError ? "a peer rank of the communicator left (destroyed, aborted or exited)"
                            : "the connection to the communicator's rendezvous failed");
  } else if (rc == kInvalidUsage) {
    Fail(rc, error, "the ranks called different collectives (kind, count, type, op or root)");
  } else if (rc != kSuccess) {
    Fail(rc, error, "the collective failed (%d)", rc);
  }
  return rc;
}

std::shared_ptr<Comm> NewComm(int nranks, int rank, int device, const IdFields& id) {
  auto c = std::make_shared<Comm>();
  c->nranks = nranks;
  c->rank = rank;
  c->device = device;
  c->port = static_cast<uint16_t>(id.port);
  c->nonce = id.nonce;
  return c;
}

// ---- entry points -----------------------------------------------------------

int simGetVersion(int* version) {
  if (version == nullptr) return Bad(kInvalidArgument, "version is null");
  *version = kVersion;
  return kSuccess;
}

int simGetUniqueId(nccl::UniqueId* id) {
  if (id == nullptr) return Bad(kInvalidArgument, "id is null");
  auto* hub = new Hub;  // lives until the process exits (its threads use it)
  uint64_t nonce = 0;
  while (nonce == 0) {
    ssize_t got = getrandom(&nonce, sizeof nonce, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got != static_cast<ssize_t>(sizeof nonce)) {
      delete hub;
      return Bad(kSystemError, "getrandom failed");
    }
  }
  hub->nonce = nonce;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    delete hub;
    return Bad(kSystemError, "socket failed");
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    FLYT_WARN("sim nccl: cannot listen on 127.0.0.1: %s", std::strerror(errno));
    close(fd);
    delete hub;
    return Bad(kSystemError, "cannot listen on 127.0.0.1 for the rendezvous");
  }
  hub->listen_fd = fd;
  try {
    std::thread(Accept, hub).detach();
  } catch (const std::exception&) {
    close(fd);
    delete hub;
    return Bad(kSystemError, "cannot start the rendezvous thread");
  }
  IdFields f{kIdMagic, ntohs(addr.sin_port), nonce};
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, &f, sizeof f);
  return kSuccess;
}

// An init (now, or in a group at its end): the handle is handed out at once.
int InitRank(NcclComm* out, int nranks, const nccl::UniqueId& id, int rank, int device) {
  if (out == nullptr) return Bad(kInvalidArgument, "comm is null");
  if (nranks < 1 || nranks > kMaxRanks) return Bad(kInvalidArgument, "nranks is out of range");
  if (rank < 0 || rank >= nranks) return Bad(kInvalidArgument, "rank is out of range");
  auto f = ParseId(id);
  if (!f) return Bad(kInvalidArgument, "not a unique id of this NCCL");
  auto c = NewComm(nranks, rank, device, *f);
  NcclComm h = Register(c);
  *out = h;
  if (t_group.depth > 0) return Submit([c](std::string* error) { return Join(c.get(), 0, error); });
  std::string error;
  int rc = Join(c.get(), 0, &error);
  if (rc != kSuccess) {
    Unregister(h);
    *out = nullptr;
    t_last_error = error;
  }
  return rc;
}
int simCommInitRankConfig(NcclComm* comm, int nranks, nccl::UniqueId id, int rank, void*) {
  return InitRank(comm, nranks, id, rank, SimCurrentDevice());
}

int simCommInitAll(NcclComm* comms, int ndev, const int* devices) {
  if (comms == nullptr) return Bad(kInvalidArgument, "comms is null");
  if (ndev < 1 || ndev > kMaxRanks) return Bad(kInvalidArgument, "ndev is out of range");
  if (devices != nullptr)
    for (int i = 0; i < ndev; ++i)
      if (devices[i] < 0) return Bad(kInvalidArgument, "a device is negative");
  nccl::UniqueId id;
  if (int rc = simGetUniqueId(&id); rc != kSuccess) return rc;
  auto f = ParseId(id);
  std::vector<std::shared_ptr<Comm>> made;
  std::vector<Task> tasks;
  for (int i = 0; i < ndev; ++i) {
    made.push_back(NewComm(ndev, i, devices != nullptr ? devices[i] : i, *f));
    tasks.push_back([c = made.back()](std::string* error) { return Join(c.get(), 0, error); });
  }
  int rc = RunAll(std::move(tasks));
  if (rc != kSuccess) {
    for (auto& c : made) c->Shutdown();
    return rc;
  }
  for (int i = 0; i < ndev; ++i) comms[i] = Register(made[i]);
  return kSuccess;
}

int simCommSplit(NcclComm comm, int color, int key, NcclComm* out, void*) {
  auto c = Lookup(comm);
  if (c == nullptr) return Bad(kInvalidArgument, "comm is not a communicator");
  if (out == nullptr) return Bad(kInvalidArgument, "newcomm is null");
  if (color < kNoColor) return Bad(kInvalidArgument, "color is negative");
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    seq = c->coll_seq++;
  }
  return Submit([c, color, key, out, seq](std::string* error) {
    int rc = kSuccess;
    auto conn = Ready(c.get(), &rc, error);
    if (conn == nullptr) return rc;
    Writer w;
    w.Put<uint64_t>(seq);
    w.Put<uint8_t>(kSplit);
    w.Put<uint64_t>(0);
    w.Put<int32_t>(0);
    w.Put<int32_t>(key);
    w.Put<int32_t>(color);
    std::vector<uint8_t> reply;
    rc = conn->Call(kColl, w, nullptr, 0, &reply);
    if (rc != kSuccess) return Remote(c.get(), rc, error);
    Reader in{reply.data(), reply.size()};
    const auto new_key = in.Get<uint64_t>();
    const auto rank = in.Get<int32_t>();
    const auto nranks = in.Get<int32_t>();
    if (!in.ok) return Remote(c.get(), kSystemError, error);
    if (new_key == 0) {
      *out = nullptr;
      return kSuccess;
    }
    auto n = NewComm(nranks, rank, c->device, IdFields{kIdMagic, c->port, c->nonce});
    rc = Join(n.get(), new_key, error);
    *out = rc == kSuccess ? Register(n) : nullptr;
    return rc;
  });
}

int simCommFinalize(NcclComm comm) {
  return Lookup(comm) != nullptr ? kSuccess : Bad(kInvalidArgument, "comm is not a communicator");
}
int simCommDestroy(NcclComm comm) {
  if (comm == nullptr) return kSuccess;  // as NCCL
  auto c = Unregister(comm);
  if (c == nullptr) return Bad(kInvalidArgument, "comm is not a communicator");
  c->Shutdown();
  return kSuccess;
}
int simCommGetAsyncError(NcclComm comm, int* result) {
  auto c = Lookup(comm);
  if (c == nullptr) return Bad(kInvalidArgument, "comm is not a communicator");
  if (result == nullptr) return Bad(kInvalidArgument, "result is null");
  *result = c->async_error.load();
  return kSuccess;
}
const char* simGetLastError(NcclComm) { return t_last_error.c_str(); }

template <typename F>
int Query(NcclComm comm, int* out, F f) {
  auto c = Lookup(comm);
  if (c == nullptr) return Bad(kInvalidArgument, "comm is not a communicator");
  if (out == nullptr) return Bad(kInvalidArgument, "the output is null");
  *out = f(*c);
  return kSuccess;
}
int simCommCount(NcclComm comm, int* n) {
  return Query(comm, n, [](const Comm& c) { return c.nranks; });
}
int simCommCuDevice(NcclComm comm, int* d) {
  return Query(comm, d, [](const Comm& c) { return c.device; });
}
int simCommUserRank(NcclComm comm, int* r) {
  return Query(comm, r, [](const Comm& c) { return c.rank; });
}

// One collective: checks the arguments now, runs now or at the group's end.
int Collective(Kind kind, const void* send, void* recv, size_t count, int type, int op, int root,
               NcclComm comm) {
  auto c = Lookup(comm);
  if (c == nullptr) return Bad(kInvalidArgument, "comm is not a communicator");
  if (type < 0 || type >= kNumTypes) return Bad(kInvalidArgument, "bad data type");
  const int n = c->nranks;
  if ((kind == kBroadcast || kind == kReduce) && (root < 0 || root >= n))
    return Bad(kInvalidArgument, "root is out of range");
  const bool reduces = kind == kAllReduce || kind == kReduce || kind == kReduceScatter;
  std::optional<RedOp> premul;
  auto one = Bytes(count, type);
  auto wide = Bytes(count, type, static_cast<uint64_t>(n));
  if (!one || !wide) return Bad(kInvalidArgument, "the collective exceeds 1 GiB");
  uint64_t send_bytes = *one, recv_bytes = *one;
  const bool root_here = c->rank == root;
  switch (kind) {
    case kBroadcast:
      send_bytes = root_here ? *one : 0;
      break;
    case kReduce:
      recv_bytes = root_here ? *one : 0;
      break;
    case kAllGather:
      recv_bytes = *wide;
      break;
    case kReduceScatter:
      send_bytes = *wide;
      break;
    case kAlltoAll:
      send_bytes = recv_bytes = *wide;
      break;
    default:
      break;
  }
  if ((send_bytes > 0 && send == nullptr) || (recv_bytes > 0 && recv == nullptr))
    return Bad(kInvalidArgument, "a buffer is null");
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    if (reduces && (op < 0 || op >= kNumOps)) {
      auto it = c->redops.find(op);
      if (it == c->redops.end()) return Bad(kInvalidArgument, "bad reduction op");
      if (it->second.type != type)
        return Bad(kInvalidArgument, "the PreMulSum op was made for another data type");
      premul = it->second;
    }
    seq = c->coll_seq++;
  }
  const int wire_op = premul ? kPreMulWire : (reduces ? op : 0);
  return Submit([=](std::string* error) {
    int rc = kSuccess;
    auto conn = Ready(c.get(), &rc, error);
    if (conn == nullptr) return rc;
    const void* data = send;
    std::vector<uint8_t> scaled;
    if (premul && send_bytes > 0) {
      try {
        scaled.resize(send_bytes);
      } catch (const std::exception&) {
        return Fail(kSystemError, error, "out of memory");
      }
      uint8_t scalar[8] = {};
      std::memcpy(scalar, premul->device ? premul->ptr : premul->value, nccl::DataTypeBytes(type));
      ByType<ScaleFn>(type, scalar, static_cast<const uint8_t*>(send),
                      static_cast<size_t>(send_bytes / nccl::DataTypeBytes(type)), scaled.data());
      data = scaled.data();
    }
    Writer w;
    w.Put<uint64_t>(seq);
    w.Put<uint8_t>(kind);
    w.Put<uint64_t>(count);
    w.Put<int32_t>(type);
    w.Put<int32_t>(wire_op);
    w.Put<int32_t>(kind == kBroadcast || kind == kReduce ? root : 0);
    std::vector<uint8_t> reply;
    rc = conn->Call(kColl, w, data, send_bytes, &reply);
    if (rc != kSuccess) return Remote(c.get(), rc, error);
    if (reply.size() != recv_bytes) return Remote(c.get(), kSystemError, error);
    if (recv_bytes > 0) std::memmove(recv, reply.data(), recv_bytes);
    return kSuccess;
  });
}

int simAllReduce(const void* s, void* r, size_t n, int type, int op, NcclComm comm, CUstream) {
  return Collective(kAllReduce, s, r, n, type, op, 0, comm);
}
int simBroadcast(const void* s, void* r, size_t n, int type, int root, NcclComm comm, CUstream) {
  return Collective(kBroadcast, s, r, n, type, 0, root, comm);
}
int simReduce(const void* s, void* r, size_t n, int type, int op, int root, NcclComm comm,
              CUstream) {
  return Collective(kReduce, s, r, n, type, op, root, comm);
}
int simAllGather(const void* s, void* r, size_t n, int type, NcclComm comm, CUstream) {
  return Collective(kAllGather, s, r, n, type, 0, 0, comm);
}
int simReduceScatter(const void* s, void* r, size_t n, int type, int op, NcclComm comm, CUstream) {
  return Collective(kReduceScatter, s, r, n, type, op, 0, comm);
}
int simAlltoAll(const void* s, void* r, size_t n, int type, NcclComm comm, CUstream) {
  return Collective(kAlltoAll, s, r, n, type, 0, 0, comm);
}

int PointToPoint(bool sending, const void* send, void* recv, size_t count, int type, int peer,
                 NcclComm comm) {
  auto c = Lookup(comm);
  if (c == nullptr) return Bad(kInvalidArgument, "comm is not a communicator");
  if (type < 0 || type >= kNumTypes) return Bad(kInvalidArgument, "bad data type");
  if (peer < 0 || peer >= c->nranks) return Bad(kInvalidArgument, "peer is out of range");
  auto bytes = Bytes(count, type);
  if (!bytes) return Bad(kInvalidArgument, "the transfer exceeds 1 GiB");
  if (*bytes > 0 && (sending ? send == nullptr : recv == nullptr))
    return Bad(kInvalidArgument, "the buffer is null");
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    seq = (sending ? c->send_seq : c->recv_seq)[peer]++;
  }
  const uint64_t n = *bytes;
  return Submit([=](std::string* error) {
    int rc = kSuccess;
    auto conn = Ready(c.get(), &rc, error);
    if (conn == nullptr) return rc;
    Writer w;
    w.Put<uint64_t>(seq);
    w.Put<int32_t>(peer);
    w.Put<uint64_t>(count);
    w.Put<int32_t>(type);
    std::vector<uint8_t> reply;
    rc = conn->Call(sending ? kSend : kRecv, w, send, sending ? n : 0, &reply);
    if (rc != kSuccess) return Remote(c.get(), rc, error);
    if (reply.size() != (sending ? 0 : n)) return Remote(c.get(), kSystemError, error);
    if (!sending && n > 0) std::memmove(recv, reply.data(), n);
    return kSuccess;
  });
}
int simSend(const void* s, size_t n, int type, int peer, NcclComm comm, CUstream) {
  return PointToPoint(true, s, nullptr, n, type, peer, comm);
}
int simRecv(void* r, size_t n, int type, int peer, NcclComm comm, CUstream) {
  return PointToPoint(false, nullptr, r, n, type, peer, comm);
}

int simGroupStart() {
  ++t_group.depth;
  return kSuccess;
}
int simGroupEnd() {
  if (t_group.depth == 0) return Bad(kInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group.depth > 0) return kSuccess;
  std::vector<Task> tasks = std::move(t_group.tasks);
  t_group.tasks.clear();
  return RunAll(std::move(tasks));
}

int simRedOpCreatePreMulSum(int* op, void* scalar, int type, int residence, NcclComm comm) {
  auto c = Lookup(comm);
  if (c == nullptr) return Bad(kInvalidArgument, "comm is not a communicator");
  if (op == nullptr || scalar == nullptr) return Bad(kInvalidArgument, "op or scalar is null");
  if (type < 0 || type >= kNumTypes) return Bad(kInvalidArgument, "bad data type");
  RedOp r;
  r.type = type;
  if (residence == nccl::kScalarHostImmediate) {
    std::memcpy(r.value, scalar, nccl::DataTypeBytes(type));
  } else if (residence == nccl::kScalarDevice) {
    r.device = true;
    r.ptr = scalar;
  } else {
    return Bad(kInvalidArgument, "bad scalar residence");
  }
  std::lock_guard<std::mutex> lock(c->mu);
  int id = kNumOps;
  while (c->redops.count(id) != 0) ++id;
  c->redops[id] = r;
  *op = id;
  return kSuccess;
}
int simRedOpDestroy(int op, NcclComm comm) {
  auto c = Lookup(comm);
  if (c == nullptr) return Bad(kInvalidArgument, "comm is not a communicator");
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->redops.erase(op) == 0) return Bad(kInvalidArgument, "not an op of ncclRedOpCreate*");
  return kSuccess;
}

int simCommRegister(NcclComm comm, void*, size_t, void** handle) {
  auto c = Lookup(comm);
  if (c == nullptr) return Bad(kInvalidArgument, "comm is not a communicator");
  if (handle == nullptr) return Bad(kInvalidArgument, "handle is null");
  std::lock_guard<std::mutex> lock(c->mu);
  uintptr_t h = c->next_registration++;
  c->registrations.insert(h);
  *handle = reinterpret_cast<void*>(h);
  return kSuccess;
}
int simCommDeregister(NcclComm comm, void* handle) {
  auto c = Lookup(comm);
  if (c == nullptr) return Bad(kInvalidArgument, "comm is not a communicator");
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->registrations.erase(reinterpret_cast<uintptr_t>(handle)) == 0)
    return Bad(kInvalidArgument, "not a handle of ncclCommRegister");
  return kSuccess;
}

}  // namespace

void LoadSimNccl(NcclApi* a) {
  *a = NcclApi{};
  a->ncclGetVersion = simGetVersion;
  a->ncclGetUniqueId = simGetUniqueId;
  a->ncclCommInitRankConfig = simCommInitRankConfig;
  a->ncclCommInitAll = simCommInitAll;
  a->ncclCommSplit = simCommSplit;
  a->ncclCommFinalize = simCommFinalize;
  a->ncclCommDestroy = simCommDestroy;
  a->ncclCommAbort = simCommDestroy;
  a->ncclCommGetAsyncError = simCommGetAsyncError;
  a->ncclGetLastError = simGetLastError;
  a->ncclCommCount = simCommCount;
  a->ncclCommCuDevice = simCommCuDevice;
  a->ncclCommUserRank = simCommUserRank;
  a->ncclAllReduce = simAllReduce;
  a->ncclBroadcast = simBroadcast;
  a->ncclReduce = simReduce;
  a->ncclAllGather = simAllGather;
  a->ncclReduceScatter = simReduceScatter;
  a->ncclAlltoAll = simAlltoAll;
  a->ncclSend = simSend;
  a->ncclRecv = simRecv;
  a->ncclGroupStart = simGroupStart;
  a->ncclGroupEnd = simGroupEnd;
  a->ncclRedOpCreatePreMulSum = simRedOpCreatePreMulSum;
  a->ncclRedOpDestroy = simRedOpDestroy;
  a->ncclCommRegister = simCommRegister;
  a->ncclCommDeregister = simCommDeregister;
}

}  // namespace flyt::server
