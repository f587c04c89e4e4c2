// Implementation of transport/emulated_transport.h.
#include "transport/emulated_transport.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include "common/log.h"

namespace flyt::transport {
namespace {

using Clock = std::chrono::steady_clock;

// The delivery thread sleeps until this long before a message is due, then spins:
// a sleeping thread wakes up tens of microseconds late.
constexpr auto kSpin = std::chrono::microseconds(50);
// A destructor waits this long past the last message's due time for the queue to drain.
constexpr auto kDrainGrace = std::chrono::seconds(2);

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Splits "12.5ms" into 12.5 and "ms". Fails unless a non-negative finite number leads.
bool SplitNumber(const std::string& text, double* value, std::string* unit) {
  const char* begin = text.c_str();
  char* end = nullptr;
  double v = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(v) || v < 0) return false;
  *value = v;
  *unit = Lower(Trim(std::string(end)));
  return true;
}

Status ParseEntry(const std::string& key, const std::string& value, EmulationSettings* out) {
  double v = 0;
  std::string unit;
  if (key != "link" && !SplitNumber(value, &v, &unit)) {
    return Status::Error("emulation setting '" + key + "=" + value +
                         "': expected a non-negative number");
  }
  if (key == "link") {
    if (value == "rdma") {
      out->link = EmulationSettings::Link::kRdma;
    } else if (value == "serial" || value == "xpuremoting") {
      out->link = EmulationSettings::Link::kSerial;
    } else {
      return Status::Error("emulation setting 'link=" + value + "': expected serial or rdma");
    }
    return Status::Ok();
  }
  if (key == "per_message_us") {
    if (!unit.empty()) {
      return Status::Error("emulation setting 'per_message_us=" + value +
                           "': takes a plain number of microseconds");
    }
    out->per_message_us = v;
    return Status::Ok();
  }
  if (key == "rtt_us" || key == "bandwidth_gbit") {
    if (!unit.empty()) {
      return Status::Error("emulation setting '" + key + "=" + value + "': " + key +
                           " takes a plain number (use rtt= or bandwidth= for units)");
    }
    (key == "rtt_us" ? out->rtt_us : out->bandwidth_gbit) = v;
    return Status::Ok();
  }
  if (key == "rtt") {
    static const std::pair<const char*, double> kUnits[] = {
        {"ns", 1e-3}, {"us", 1}, {"ms", 1e3}, {"s", 1e6}};
    for (const auto& [name, scale] : kUnits) {
      if (unit == name) {
        out->rtt_us = v * scale;
        return Status::Ok();
      }
    }
    return Status::Error("emulation setting 'rtt=" + value +
                         "': needs a unit: ns, us, ms or s (e.g. rtt=100us)");
  }
  if (key == "bandwidth") {
    if (unit.size() > 2 && unit.compare(unit.size() - 2, 2, "/s") == 0) {
      unit.resize(unit.size() - 2);
    }
    static const std::pair<const char*, double> kUnits[] = {
        {"kbit", 1e-6}, {"mbit", 1e-3}, {"gbit", 1}};
    for (const auto& [name, scale] : kUnits) {
      if (unit == name) {
        out->bandwidth_gbit = v * scale;
        return Status::Ok();
      }
    }
    return Status::Error("emulation setting 'bandwidth=" + value +
                         "': needs a unit: kbit, mbit or gbit (e.g. bandwidth=1gbit)");
  }
  return Status::Error("unknown emulation setting '" + key +
                       "': expected rtt_us, bandwidth_gbit, rtt, bandwidth, link or "
                       "per_message_us");
}

class EmulatedConnection final : public Connection {
 public:
  EmulatedConnection(std::unique_ptr<Connection> inner, const EmulationSettings& settings,
                     const EmulationLimits& limits)
      : inner_(std::move(inner)), settings_(settings), limits_(limits) {
    if (limits_.chunk_bytes == 0) limits_.chunk_bytes = size_t{256} << 10;
    core_->thread = std::thread([this] { Deliver(); });
  }

  ~EmulatedConnection() override {
    if (getpid() != pid_) {  // a forked child: never speak on the parent's connection
      (void)core_.release();
      return;
    }
    bool drained;
    {
      std::unique_lock<std::mutex> lock(core_->mu);
      core_->closing = true;
      core_->wake.notify_all();
      Clock::time_point deadline = std::max(Clock::now(), core_->last_due) + kDrainGrace;
      drained = core_->done_cv.wait_until(lock, deadline, [&] { return core_->done; });
      core_->stop = true;
      core_->wake.notify_all();
      core_->space.notify_all();
    }
    if (!drained && !detached_) inner_->Shutdown();  // unblocks a delivery stuck in inner Send
    if (core_->thread.joinable()) core_->thread.join();
  }

  // Delivers what is queued first: the peer must see every byte sent before
  // the hand-over, in order, before the new owner speaks.
  Status Detach(DetachedConnection* out) override {
    {
      std::unique_lock<std::mutex> lock(core_->mu);
      core_->closing = true;
      core_->wake.notify_all();
      Clock::time_point deadline = std::max(Clock::now(), core_->last_due) + kDrainGrace;
      const bool drained = core_->done_cv.wait_until(lock, deadline, [&] { return core_->done; });
      core_->stop = true;
      core_->wake.notify_all();
      core_->space.notify_all();
      if (!drained || !core_->error.ok())
        return Status::Error("emulated link to " + inner_->Peer() + " did not drain");
    }
    core_->thread.join();
    detached_ = true;
    return inner_->Detach(out);
  }

  Status Send(const iovec* iov, int count) override {
    Clock::time_point now = Clock::now();
    size_t bytes = 0;
    for (int i = 0; i < count; ++i) bytes += iov[i].iov_len;
    if (bytes == 0) return Status::Ok();
    std::lock_guard<std::mutex> order(core_->send_mu);  // pieces of two Sends never interleave
    Clock::time_point base;
    {
      std::unique_lock<std::mutex> lock(core_->mu);
      core_->space.wait(lock, [&] {
        return core_->stop || !core_->error.ok() || core_->queued_bytes == 0 ||
               core_->queued_bytes + bytes <= limits_.max_queued_bytes;
      });
      if (core_->stop) return Status::Error("connection to " + inner_->Peer() + " was shut down");
      if (!core_->error.ok()) return core_->error;
      core_->queued_bytes += bytes;  // reserved; the copy below runs without the lock
      if (settings_.link == EmulationSettings::Link::kRdma) {
        // The wire is free again once this message's bytes are out; its latency
        // overlaps the next message's transfer.
        base = std::max(now, core_->wire_free);
        core_->wire_free = base + Ns(settings_.WireNs(bytes));
        core_->last_due = std::max(core_->last_due, base + Ns(settings_.TransitNs(bytes)));
      } else {
        base = std::max(now, core_->last_due);
        core_->last_due = base + Ns(settings_.TransitNs(bytes));
      }
    }
    // Queue the message piece by piece, each due when its last byte arrives under
    // the model, so that delivery starts before a large message is fully copied.
    Clock::duration half_rtt = Ns(settings_.rtt_us * 500.0 + settings_.per_message_us * 1000.0);
    int vec = 0;
    size_t vec_off = 0, done = 0;
    while (done < bytes) {
      Piece p;
      p.size = std::min(bytes - done, limits_.chunk_bytes);
      p.data = std::make_unique_for_overwrite<uint8_t[]>(p.size);
      for (size_t filled = 0; filled < p.size;) {
        size_t take = std::min(p.size - filled, iov[vec].iov_len - vec_off);
        std::memcpy(p.data.get() + filled, static_cast<const char*>(iov[vec].iov_base) + vec_off,
                    take);
        filled += take;
        vec_off += take;
        if (vec_off == iov[vec].iov_len) {
          ++vec;
          vec_off = 0;
        }
      }
      done += p.size;
      double wire_ns = settings_.bandwidth_gbit > 0 ? done * 8.0 / settings_.bandwidth_gbit : 0;
      p.due = base + half_rtt + Ns(wire_ns);
      std::lock_guard<std::mutex> lock(core_->mu);
      core_->queue.push_back(std::move(p));
      core_->wake.notify_all();
    }
    return Status::Ok();
  }

  Status Receive(void* dst, size_t n) override { return inner_->Receive(dst, n); }

  void Shutdown() override {
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      core_->stop = true;
      core_->wake.notify_all();
      core_->space.notify_all();
    }
    inner_->Shutdown();
  }

  void AbandonAfterFork() override { inner_->AbandonAfterFork(); }
  void SetReceiveTimeout(int timeout_ms) override { inner_->SetReceiveTimeout(timeout_ms); }
  void SetSocketSpin(int spin_us) override { inner_->SetSocketSpin(spin_us); }
  std::string Peer() const override { return inner_->Peer(); }

 private:
  struct Piece {
    std::unique_ptr<uint8_t[]> data;
    size_t size = 0;
    Clock::time_point due;  // when its last byte is delivered under the model
  };

  static Clock::duration Ns(double ns) {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::nano>(ns));
  }

  // Sleeps until shortly before `due`, then spins. False when stopped meanwhile.
  bool WaitUntil(Clock::time_point due) {
    {
      std::unique_lock<std::mutex> lock(core_->mu);
      core_->wake.wait_until(lock, due - kSpin, [&] { return core_->stop.load(); });
      if (core_->stop) return false;
    }
    while (Clock::now() < due) {
      if (core_->stop.load(std::memory_order_relaxed)) return false;
    }
    return true;
  }

  void Deliver() {
    for (;;) {
      Piece p;
      {
        std::unique_lock<std::mutex> lock(core_->mu);
        core_->wake.wait(lock,
                         [&] { return core_->stop || core_->closing || !core_->queue.empty(); });
        if (core_->stop || core_->queue.empty()) break;  // stopped, or closing with nothing left
        p = std::move(core_->queue.front());
        core_->queue.pop_front();
      }
      Status st;
      if (WaitUntil(p.due)) {
        iovec v{p.data.get(), p.size};
        st = inner_->Send(&v, 1);
      } else {
        st = Status::Error("connection to " + inner_->Peer() + " was shut down");
      }
      std::lock_guard<std::mutex> lock(core_->mu);
      core_->queued_bytes -= p.size;
      core_->space.notify_all();
      if (!st.ok()) {
        if (core_->error.ok()) core_->error = Status::Error("emulated link: " + st.message());
        break;
      }
    }
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->queue.clear();
    core_->queued_bytes = 0;
    core_->done = true;
    core_->done_cv.notify_all();
    core_->space.notify_all();
  }

  // Everything the delivery thread shares. A child forked from this process
  // has no delivery thread and may have inherited a locked mutex: it abandons
  // the core (see the destructor) instead of destroying it.
  struct Core {
    std::mutex send_mu;  // serialises Send calls
    std::mutex mu;
    std::condition_variable wake;     // delivery thread: new message, stop
    std::condition_variable space;    // senders: queue drained below the limit, stop
    std::condition_variable done_cv;  // destructor: delivery thread finished
    std::deque<Piece> queue;
    size_t queued_bytes = 0;  // queued or being delivered
    Clock::time_point last_due{};
    Clock::time_point wire_free{};  // rdma model: when the sender's wire is free again
    Status error;
    std::atomic<bool> stop{false};
    bool closing = false;
    bool done = false;
    std::thread thread;
  };

  std::unique_ptr<Connection> inner_;
  const EmulationSettings settings_;
  EmulationLimits limits_;
  const pid_t pid_ = getpid();
  bool detached_ = false;
  std::unique_ptr<Core> core_ = std::make_unique<Core>();
};

}  // namespace

double EmulationSettings::WireNs(size_t bytes) const {
  double ns = per_message_us * 1000.0;
  if (bandwidth_gbit > 0) ns += static_cast<double>(bytes) * 8.0 / bandwidth_gbit;
  return ns;
}

double EmulationSettings::TransitNs(size_t bytes) const { return rtt_us * 500.0 + WireNs(bytes); }

std::string EmulationSettings::ToString() const {
  std::ostringstream s;
  if (link == Link::kRdma) s << "rdma link, ";
  if (per_message_us > 0) s << per_message_us << " us per message, ";
  s << "rtt " << rtt_us << " us, ";
  if (bandwidth_gbit > 0) {
    s << "bandwidth " << bandwidth_gbit << " Gbit/s";
  } else {
    s << "unlimited bandwidth";
  }
  return s.str();
}

Status ParseEmulation(const std::string& spec, EmulationSettings* out) {
  EmulationSettings result;
  std::string text;
  // Drop comments, then treat ';' and newlines like ','.
  bool comment = false;
  for (char c : spec) {
    if (c == '\n') comment = false;
    if (comment) continue;
    if (c == '#') {
      comment = true;
      continue;
    }
    text.push_back(c == '\n' || c == ';' || c == '\r' ? ',' : c);
  }
  std::string all = Lower(Trim(text));
  if (all.empty() || all == "off" || all == "none") {
    *out = result;
    return Status::Ok();
  }
  std::stringstream entries(text);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    entry = Trim(entry);
    if (entry.empty()) continue;
    size_t eq = entry.find('=');
    if (eq == std::string::npos) {
      return Status::Error("emulation setting '" + entry +
                           "': expected key=value, e.g. rtt_us=100,bandwidth_gbit=1");
    }
    Status st = ParseEntry(Lower(Trim(entry.substr(0, eq))), Trim(entry.substr(eq + 1)), &result);
    if (!st.ok()) return st;
  }
  *out = result;
  return Status::Ok();
}

Status EmulationFromEnvironment(EmulationSettings* out) {
  const char* spec = std::getenv("FLYT_EMULATE");
  const char* file = std::getenv("FLYT_EMULATE_FILE");
  if (spec != nullptr && spec[0] == '\0') spec = nullptr;
  if (file != nullptr && file[0] == '\0') file = nullptr;
  if (spec != nullptr && file != nullptr) {
    return Status::Error("both FLYT_EMULATE and FLYT_EMULATE_FILE are set: set only one");
  }
  if (spec != nullptr) {
    Status st = ParseEmulation(spec, out);
    return st.ok() ? st : Status::Error("FLYT_EMULATE: " + st.message());
  }
  if (file != nullptr) {
    std::ifstream in(file);
    if (!in) {
      return Status::Error("FLYT_EMULATE_FILE: cannot read '" + std::string(file) +
                           "': " + std::strerror(errno));
    }
    std::stringstream text;
    text << in.rdbuf();
    Status st = ParseEmulation(text.str(), out);
    return st.ok() ? st
                   : Status::Error("FLYT_EMULATE_FILE " + std::string(file) + ": " + st.message());
  }
  *out = EmulationSettings{};
  return Status::Ok();
}

std::unique_ptr<Connection> WrapEmulated(std::unique_ptr<Connection> inner,
                                         const EmulationSettings& settings,
                                         const EmulationLimits& limits) {
  return std::make_unique<EmulatedConnection>(std::move(inner), settings, limits);
}

Status WrapFromEnvironment(std::unique_ptr<Connection>* conn) {
  static std::once_flag once;
  static EmulationSettings settings;
  static Status status;
  std::call_once(once, [] {
    status = EmulationFromEnvironment(&settings);
    if (status.ok() && settings.enabled()) {
      FLYT_INFO("network emulation on for messages this process sends: %s",
                settings.ToString().c_str());
    }
  });
  if (!status.ok()) return status;
  if (settings.enabled()) *conn = WrapEmulated(std::move(*conn), settings);
  return Status::Ok();
}

}  // namespace flyt::transport
