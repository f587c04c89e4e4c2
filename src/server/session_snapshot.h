// The byte stream a moved session travels as: to another flyt-server
// (migration) or to a checkpoint file, and back.
//
// Owns: the snapshot's framing (magic, version, typed fields) and the sinks
// and sources it is written to and read from (a connection, a file), with
// buffering so that small fields do not become small sends. What the fields
// mean is the session's (server/session_migrate.cc). Must not know about
// CUDA or sessions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace flyt::server {

// "FLYTSNAP" and the format's version: a reader refuses other versions.
inline constexpr uint64_t kSnapshotMagic = 0x50414e5354594c46ull;
// 3: pools; 4: streams among the code; 5: texture objects; 6: the placed slot of a
// client of several servers
inline constexpr uint32_t kSnapshotVersion = 6;
// Limits a reader enforces, so that a corrupt or hostile snapshot fails
// cleanly instead of asking for absurd amounts of memory.
inline constexpr uint64_t kSnapshotMaxString = 1 << 20;
inline constexpr uint64_t kSnapshotMaxCount = 1 << 24;

class SnapshotWriter {
 public:
  // To a connection (migration) or a file descriptor (checkpoint; not owned).
  explicit SnapshotWriter(transport::Connection* conn) : conn_(conn) {}
  explicit SnapshotWriter(int fd) : fd_(fd) {}
  ~SnapshotWriter() = default;
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  void Bytes(const void* p, size_t n);
  template <typename T>
  void Put(const T& v) {
    Bytes(&v, sizeof(v));
  }
  void String(const std::string& s);
  // Sends what is buffered; the first failure sticks.
  Status Flush();
  const Status& status() const { return status_; }
  uint64_t written() const { return written_; }

 private:
  transport::Connection* conn_ = nullptr;
  int fd_ = -1;
  std::vector<uint8_t> buf_;
  Status status_;
  uint64_t written_ = 0;
};

class SnapshotReader {
 public:
  explicit SnapshotReader(transport::Connection* conn) : conn_(conn) {}
  explicit SnapshotReader(int fd) : fd_(fd) {}
  SnapshotReader(const SnapshotReader&) = delete;
  SnapshotReader& operator=(const SnapshotReader&) = delete;

  // False once anything failed (short file, closed connection, a limit).
  bool Bytes(void* p, size_t n);
  template <typename T>
  bool Get(T* v) {
    return Bytes(v, sizeof(*v));
  }
  bool String(std::string* s);
  // A count of items that follow, at most kSnapshotMaxCount.
  bool Count(uint64_t* n);
  const Status& status() const { return status_; }

 private:
  transport::Connection* conn_ = nullptr;
  int fd_ = -1;
  std::vector<uint8_t> buf_;
  size_t at_ = 0;
  Status status_;
};

}  // namespace flyt::server
