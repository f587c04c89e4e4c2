// The client's side of a moved session (migration to another flyt-server, or
// a checkpoint that a restarted server restores).
//
// Owns: the park (ops::kOpPark) after the server asked for it, and the resume
// on the new connection (ops::kOpResume; tls:// with the process's TLS
// settings): the app's handles and device pointers stay what they were,
// because the server keeps them. A checkpointed process also asks its client
// manager, while it waits, whether the checkpoint was restored on another
// node (LOCATE), and resumes there. Must not
// touch: the app's calls in flight (there are none: the park happens while
// this process's connection lock is held, after every call sent was
// answered).
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "client/client.h"
#include "client/client_manager_lookup.h"
#include "client/query_cache.h"
#include "client/tls_client.h"
#include "common/log.h"
#include "transport/emulated_transport.h"

namespace flyt::client {
namespace {

// How long a checkpointed client waits for its session to be restored
// (FLYT_RESUME_TIMEOUT_MS), and a migrated one for the new server.
constexpr int kCheckpointWaitMs = 10 * 60 * 1000;
constexpr int kMigrateWaitMs = 60 * 1000;
constexpr int kRetryMs = 200;
// While a checkpointed process waits, how often it asks its client manager whether the
// checkpoint was restored on another node (every this many attempts: about a second).
constexpr int kLocateEvery = 5;
constexpr int kLocateTimeoutMs = 5000;

int64_t MonotonicMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// One request and its reply on a connection that is not the session's yet.
Status Exchange(transport::Connection* c, const wire::FrameHeader& h, const wire::Writer& w,
                wire::FrameHeader* rep, std::vector<uint8_t>* payload) {
  iovec iov[2] = {{const_cast<wire::FrameHeader*>(&h), sizeof(h)},
                  {const_cast<uint8_t*>(w.data()), w.size()}};
  Status st = c->Send(iov, w.size() > 0 ? 2 : 1);
  if (st.ok()) st = c->Receive(rep, sizeof(*rep));
  if (st.ok() && (rep->magic != wire::kMagic || rep->call_id != h.call_id ||
                  rep->payload_len > wire::kMaxPayload))
    st = Status::Error("malformed reply");
  if (st.ok()) {
    payload->resize(rep->payload_len);
    st = c->Receive(payload->data(), payload->size());
  }
  return st;
}

}  // namespace

void Client::ParkLocked() {
  if (parking_) {
    park_again_ = true;
    return;
  }
  do {
    park_again_ = false;
    parking_ = true;
    const uint64_t id = next_call_++;
    wire::FrameHeader h{wire::kMagic, ops::kOpPark, wire::kFlagWantReply, id, 0, 0, 0, 0};
    wire::Writer none;
    std::vector<uint8_t> reply;
    wire::FrameHeader rep{};
    CUresult rc = SendLocked(h, none, nullptr, 0);
    if (rc == CUDA_SUCCESS) rc = ReceiveReplyLocked("park", id, ReplySink{&reply}, &rep);
    parking_ = false;
    if (rc != CUDA_SUCCESS) return;  // the connection is marked lost already
    wire::Reader r(reply.data(), reply.size());
    uint8_t action = 0;
    std::string address;
    uint64_t key[2] = {0, 0};
    if (!r.Get(&action) || !r.GetString(&address) || !r.Get(&key[0]) || !r.Get(&key[1])) {
      MarkLostLocked("park", "malformed reply");
      return;
    }
    switch (static_cast<ops::ParkAction>(action)) {
      case ops::ParkAction::kContinue:
        break;
      case ops::ParkAction::kResumeAt:
        ResumeLocked(address, key, kMigrateWaitMs);
        break;
      case ops::ParkAction::kWaitResume: {
        FLYT_INFO(
            "flyt-server at %s checkpointed this process's GPU state; waiting for it to be "
            "restored there",
            server_.c_str());
        const char* wait = std::getenv("FLYT_RESUME_TIMEOUT_MS");
        int ms = wait != nullptr ? std::atoi(wait) : 0;
        ResumeLocked(server_, key, ms > 0 ? ms : kCheckpointWaitMs);
        break;
      }
      default:
        MarkLostLocked("park", "unknown park action " + std::to_string(action));
        return;
    }
  } while (park_again_ && broken_ == CUDA_SUCCESS);
}

void Client::ResumeLocked(const std::string& where, const uint64_t key[2], int deadline_ms) {
  std::string target = where;
  transport::Address addr;
  Status st = transport::ParseAddress(target, &addr);
  if (!st.ok()) {
    MarkLostLocked("resume", "the session moved to an unusable address: " + st.message());
    return;
  }
  // A checkpointed process waits at its own server's address; the checkpoint may be
  // restored on another node instead, which the VM's client manager then knows. It asks
  // by the endpoint its client manager gave it, or FLYT_SERVER's one address (server_ may
  // be the shm:// path it moved to on the server's host); with no client manager on the
  // VM it can only wait.
  std::string manager;
  const std::string given = ClientManagerEndpoint();
  const bool locate = where == server_ && !given.empty() && given.find(',') == std::string::npos &&
                      ClientManagerPresent(&manager);
  const int64_t t0 = MonotonicMs();
  const int64_t deadline = t0 + deadline_ms;
  std::string last_error;
  for (int attempt = 0;; ++attempt) {
    if (attempt > 0) {
      if (MonotonicMs() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(kRetryMs));
    }
    if (locate && attempt > 0 && attempt % kLocateEvery == 0) {
      std::string now;
      Status found = LocateWithClientManager(manager, given, kLocateTimeoutMs, &now);
      transport::Address moved;
      if (found.ok() && !now.empty() && now != given && now != target &&
          transport::ParseAddress(now, &moved).ok()) {
        FLYT_INFO("the checkpoint of this process was restored at flyt-server %s; going on there",
                  now.c_str());
        target = now;
        addr = moved;
      }
    }
    std::unique_ptr<transport::Connection> c;
    // A tls:// server is dialled with the trust the first one was (FLYT_TLS_CA, ...).
    st = addr.kind == transport::Address::Kind::kTls ? DialTls(addr, liveness_, &c)
                                                     : transport::Dial(addr, liveness_, &c);
    if (st.ok()) st = transport::WrapFromEnvironment(&c);
    if (!st.ok()) {
      last_error = st.message();
      continue;
    }
    wire::Writer w;
    w.Put(wire::HelloRequest{wire::kProtocolVersion, CUDA_VERSION, static_cast<uint32_t>(getpid()),
                             static_cast<uint32_t>(token_.size())});
    w.PutBytes(token_.data(), token_.size());
    w.Put(key[0]);
    w.Put(key[1]);
    wire::FrameHeader h{wire::kMagic,
                        ops::kOpResume,
                        wire::kFlagWantReply,
                        next_call_++,
                        static_cast<uint32_t>(w.size()),
                        0,
                        0,
                        0};
    wire::FrameHeader rep{};
    std::vector<uint8_t> payload;
    st = Exchange(c.get(), h, w, &rep, &payload);
    if (!st.ok()) {
      last_error = st.message();
      continue;
    }
    wire::Reader r(payload.data(), payload.size());
    wire::HelloReply hello{};
    std::string message;
    r.Get(&hello);
    r.GetString(&message);
    if (rep.status == CUDA_ERROR_NOT_READY) {  // not restored yet: ask again
      last_error = message;
      continue;
    }
    if (rep.status != CUDA_SUCCESS) {
      MarkLostLocked("resume", "flyt-server at " + target + " refused it: " + message);
      return;
    }
    std::vector<ops::DeviceInfo> devices;
    if (!ReadDeviceList(r, &devices)) {
      MarkLostLocked("resume", "malformed reply of flyt-server at " + target);
      return;
    }
    // The session is there: from now on every call goes to it.
    conn_->Shutdown();
    conn_ = std::move(c);
    ++conn_gen_;  // registrations of one-sided copies were the old connection's
    server_ = target;
    // What a later checkpoint's wait asks about (a process of one server: one of
    // several servers' links is not the process's endpoint).
    if (!member_ && !multi()) NoteSessionEndpoint(target);
    address_ = addr;
    session_id_ = hello.session_id;
    session_secret_ = hello.session_secret;
    // The new server's thread has no context current and the default mode.
    sent_ctx_ = nullptr;
    sent_capture_mode_ = CU_STREAM_CAPTURE_MODE_GLOBAL;
    drained_ = Drained{};
    if (devices.size() == devices_.size()) {
      UpdateDevicesLocked(devices);
    } else {
      FLYT_WARN("the session moved to a server with %zu GPU(s) where it had %zu", devices.size(),
                devices_.size());
    }
    QueryCache::Get().Clear();  // the new GPU answers for itself
    ReshareHostBuffersLocked();
    bool had_channel = false;
    {
      // Host functions come over a new callback channel.
      std::lock_guard<std::mutex> lock(callback_mu_);
      had_channel = callback_channel_;
      if (callback_conn_ != nullptr) callback_conn_->Shutdown();
      callback_conn_.reset();
      callback_channel_ = false;
      ++callback_generation_;
    }
    // Opened at once where there was one: graphs that moved with the session
    // run their host nodes (and copies to and from this process's memory)
    // over it, perhaps before this process makes another synchronous call.
    if (had_channel) {
      CUresult cb = EnsureCallbackChannel();
      if (cb != CUDA_SUCCESS)
        FLYT_WARN("no callback channel to the new server (error %d): host functions fail", cb);
    }
    FLYT_INFO(
        "this process's GPU state now lives at flyt-server %s (session %llu); resumed after "
        "%lld ms",
        target.c_str(), static_cast<unsigned long long>(session_id_),
        static_cast<long long>(MonotonicMs() - t0));
    return;
  }
  MarkLostLocked("resume", "the session did not come back at " + target + " within " +
                               std::to_string(deadline_ms) + " ms (" + last_error + ")");
}

void Client::ReshareHostBuffersLocked() {
  std::vector<HostBuffer> shared;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    for (const auto& [base, b] : host_buffers_)
      if (b.server_addr != 0 && !b.coherent) shared.push_back(b);
  }
  if (shared.empty()) return;
  const bool shm = conn_->SharesMemory();
  size_t again = 0, moved_device = 0;
  for (HostBuffer& b : shared) {
    const uint64_t old_device = b.device_ptr;
    b.server_addr = 0;
    b.device_ptr = 0;
    uint64_t id = 0;
    if (shm && b.share_fd >= 0 && conn_->ShareFd(b.share_fd, &id).ok()) {
      wire::Writer w;
      w.Put<uint64_t>(id);
      w.Put<uint64_t>(b.size);
      w.Put<uint32_t>(b.flags | ops::kHostShareMovable);
      w.Put<uint64_t>(b.base);  // where the new server maps it too, when it is free there
      std::vector<uint8_t> reply;
      CUresult rc = CallLocked("cuMemHostAlloc", ops::kOpHostShare, w, ReplySink{&reply}, 0, 0);
      wire::Reader r(reply.data(), reply.size());
      if (rc != CUDA_SUCCESS || !r.Get(&b.server_addr) || !r.Get(&b.device_ptr)) {
        FLYT_WARN("pinned buffer at 0x%llx: the new server did not map it (error %d)",
                  static_cast<unsigned long long>(b.base), rc);
        b.server_addr = 0;
        b.device_ptr = 0;
      }
    }
    if (b.server_addr != 0) ++again;
    // A buffer the GPU reached at its own address and that is private memory now is
    // mapped there again when a kernel or a memset gets a pointer into it
    // (MapPinnedIfUnmapped), as every pinned buffer over a socket; one mapped elsewhere
    // than before is not.
    const bool remapped_at_use = old_device == b.base && b.device_ptr == 0;
    if (old_device != 0 && b.device_ptr != old_device && !remapped_at_use) ++moved_device;
    // A device pointer apart from the buffer's address is known as device memory.
    if (old_device != 0 && old_device != b.base) RemoveDeviceRange(old_device);
    if (b.device_ptr != 0 && b.device_ptr != b.base) AddDeviceRange(b.device_ptr, b.size, true);
    AddHostBuffer(b);
  }
  if (again > 0) FLYT_INFO("%zu pinned buffers shared with the new server again", again);
  if (again < shared.size())
    FLYT_INFO(
        "%zu of %zu pinned buffers are this process's own memory after the move (the new "
        "server shares no memory with it): their copies take the socket, and a kernel or "
        "memset given a pointer into one maps it for the GPU again",
        shared.size() - again, shared.size());
  if (moved_device > 0)
    FLYT_WARN(
        "%zu pinned buffers have another device pointer on the new server: a kernel given one "
        "of their old device pointers (cudaHostGetDevicePointer) no longer reaches them",
        moved_device);
}

}  // namespace flyt::client
