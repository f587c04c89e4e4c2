// A Status value instead of exceptions (LevelDB style).
//
// Owns: the success/failure result of non-CUDA operations (I/O, parsing,
// configuration) with a human-readable message that says what went wrong and
// what to do. CUDA calls return CUresult instead; this type never crosses the wire.
#pragma once

#include <string>
#include <utility>

namespace flyt {

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string msg) { return Status(std::move(msg)); }
  bool ok() const { return !failed_; }
  const std::string& message() const { return msg_; }

 private:
  explicit Status(std::string msg) : failed_(true), msg_(std::move(msg)) {}
  bool failed_ = false;
  std::string msg_;
};

}  // namespace flyt
