// Network emulator: a Connection wrapper that delays every message as a link
// with a configured round-trip time and bandwidth would. Two link models:
//  - serial (XPURemoting's, the default): a message handed to Send at `now` is
//    delivered at  max(now, last) + per_message + rtt/2 + bytes*8/bandwidth
//    where `last` is the previous message's delivery time on this connection in
//    this direction (latency does not overlap);
//  - rdma: the wire is busy for per_message + bytes*8/bandwidth from
//    max(now, wire_free), and each message arrives rtt/2 after its last byte left,
//    so messages in flight overlap their latency (a NIC's queue pair; per_message
//    defaults to 0: no kernel cost per message).
// See docs/emulator.md.
//
// Owns: the emulation settings and their parsing (FLYT_EMULATE,
// FLYT_EMULATE_FILE, flyt-server --emulate), and, per wrapped connection, a
// bounded queue of copied messages plus one delivery thread that forwards each
// message to the inner connection when it is due. Large messages are forwarded
// in chunks as their bytes "arrive", so the real transfer overlaps the modelled
// one. Must not know about frames or CUDA, and must not touch the receive side
// of the inner connection: Receive passes straight through. It models only the
// direction its owner sends in; the peer wraps its end for the other one.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/transport.h"

namespace flyt::transport {

struct EmulationSettings {
  enum class Link { kSerial, kRdma };
  double rtt_us = 0;
  double bandwidth_gbit = 0;  // 0 = unlimited
  double per_message_us = 0;  // host (kernel) cost of each message on the wire
  Link link = Link::kSerial;
  bool enabled() const { return rtt_us > 0 || bandwidth_gbit > 0 || per_message_us > 0; }
  // Modelled one-way time of a message of `bytes` bytes on an idle link, in
  // nanoseconds: per_message + rtt/2 + bytes*8/bandwidth.
  double TransitNs(size_t bytes) const;
  // Time the message occupies the sending side (the next message's earliest start
  // under the rdma model): per_message + bytes*8/bandwidth.
  double WireNs(size_t bytes) const;
  // "rtt 100 us, bandwidth 1 Gbit/s" (for logs; "rdma link, ..." under that model).
  std::string ToString() const;
};

// Parses "rtt_us=100,bandwidth_gbit=1" or, with units, "rtt=100us,bandwidth=1gbit"
// (rtt units ns|us|ms|s; bandwidth units kbit|mbit|gbit, "/s" optional), plus
// "link=serial|rdma" and "per_message_us=N". Entries are separated by ',' ';' or
// newlines; '#' starts a comment to the end of the line. An empty spec, "off" or
// "none" disables emulation.
Status ParseEmulation(const std::string& spec, EmulationSettings* out);

// Reads FLYT_EMULATE (a spec) or FLYT_EMULATE_FILE (a file holding the same
// key=value lines). Neither set: emulation off. Both set: an error.
Status EmulationFromEnvironment(EmulationSettings* out);

struct EmulationLimits {
  // Send blocks while more than this many bytes wait for delivery (one message
  // larger than this is still accepted when nothing else is queued).
  size_t max_queued_bytes = size_t{64} << 20;
  // Large messages reach the inner connection in pieces of this size, each when
  // its last byte is due under the model.
  size_t chunk_bytes = size_t{256} << 10;
};

// Wraps `inner`. Send copies the message and returns at once (unless the queue
// is full); a failed delivery makes later Sends fail with its reason. Shutdown
// drops queued messages; destroying the wrapper without Shutdown first delivers
// what is queued (waiting at most until the last one is due plus 2 s).
std::unique_ptr<Connection> WrapEmulated(std::unique_ptr<Connection> inner,
                                         const EmulationSettings& settings,
                                         const EmulationLimits& limits = {});

// For the client library: wraps *conn when FLYT_EMULATE or FLYT_EMULATE_FILE is
// set (read once per process; the first wrap logs at info level). Fails when
// the setting cannot be parsed.
Status WrapFromEnvironment(std::unique_ptr<Connection>* conn);

}  // namespace flyt::transport
