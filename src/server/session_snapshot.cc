// Implementation of server/session_snapshot.h.
#include "server/session_snapshot.h"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace flyt::server {
namespace {
constexpr size_t kBufferBytes = 4u << 20;
}  // namespace

void SnapshotWriter::Bytes(const void* p, size_t n) {
  if (!status_.ok()) return;
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    if (buf_.size() >= kBufferBytes && !Flush().ok()) return;
    size_t take = std::min(n, kBufferBytes - buf_.size());
    buf_.insert(buf_.end(), b, b + take);
    b += take;
    n -= take;
  }
}

void SnapshotWriter::String(const std::string& s) {
  Put<uint64_t>(s.size());
  Bytes(s.data(), s.size());
}

Status SnapshotWriter::Flush() {
  if (!status_.ok() || buf_.empty()) return status_;
  if (conn_ != nullptr) {
    iovec iov{buf_.data(), buf_.size()};
    status_ = conn_->Send(&iov, 1);
  } else {
    size_t done = 0;
    while (done < buf_.size()) {
      ssize_t w = ::write(fd_, buf_.data() + done, buf_.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        status_ = Status::Error(std::string("writing the snapshot: ") + std::strerror(errno));
        break;
      }
      done += static_cast<size_t>(w);
    }
  }
  written_ += buf_.size();
  buf_.clear();
  return status_;
}

bool SnapshotReader::Bytes(void* p, size_t n) {
  if (!status_.ok()) return false;
  auto* b = static_cast<uint8_t*>(p);
  if (conn_ != nullptr) {
    status_ = conn_->Receive(b, n);
    return status_.ok();
  }
  while (n > 0) {
    if (at_ == buf_.size()) {
      buf_.resize(kBufferBytes);
      ssize_t r;
      do {
        r = ::read(fd_, buf_.data(), buf_.size());
      } while (r < 0 && errno == EINTR);
      if (r <= 0) {
        buf_.clear();
        at_ = 0;
        status_ =
            Status::Error(r == 0 ? "the snapshot ends early (a truncated file?)"
                                 : std::string("reading the snapshot: ") + std::strerror(errno));
        return false;
      }
      buf_.resize(static_cast<size_t>(r));
      at_ = 0;
    }
    size_t take = std::min(n, buf_.size() - at_);
    std::memcpy(b, buf_.data() + at_, take);
    at_ += take;
    b += take;
    n -= take;
  }
  return true;
}

bool SnapshotReader::String(std::string* s) {
  uint64_t n = 0;
  if (!Get(&n)) return false;
  if (n > kSnapshotMaxString) {
    status_ = Status::Error("the snapshot holds a string of " + std::to_string(n) + " bytes");
    return false;
  }
  s->resize(n);
  return Bytes(s->data(), n);
}

bool SnapshotReader::Count(uint64_t* n) {
  if (!Get(n)) return false;
  if (*n > kSnapshotMaxCount) {
    status_ = Status::Error("the snapshot claims " + std::to_string(*n) + " items");
    return false;
  }
  return true;
}

}  // namespace flyt::server
