// Segment backings: POSIX shm, plain files, PCI BAR resource files.
#include "transport/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>

namespace flyt::transport {
namespace {

enum class Cleanup { kNone, kShmUnlink, kFileUnlink };

class MappedSegment final : public Segment {
 public:
  MappedSegment(void* base, size_t size, std::string name, Cleanup cleanup)
      : base_(base), size_(size), name_(std::move(name)), cleanup_(cleanup) {}
  ~MappedSegment() override {
    // Nothing useful can be done about a failure in a destructor; the checks
    // keep a failed unmap from being mistaken for success in a debugger.
    if (munmap(base_, size_) != 0) std::perror("flyt: munmap of a shared-memory segment");
    if (cleanup_ == Cleanup::kShmUnlink && shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
      std::perror("flyt: shm_unlink");
    }
    if (cleanup_ == Cleanup::kFileUnlink && unlink(name_.c_str()) != 0 && errno != ENOENT) {
      std::perror("flyt: unlink of a segment file");
    }
  }
  void* base() const override { return base_; }
  size_t size() const override { return size_; }
  const std::string& name() const override { return name_; }

 private:
  void* base_;
  size_t size_;
  std::string name_;
  Cleanup cleanup_;
};

std::string ErrnoText(int err) {
  std::string text = std::strerror(err);
  if (err == EACCES || err == EPERM) text += " (check the permissions of the file or object)";
  return text;
}

Status SysError(const char* what, const std::string& name, int err) {
  return Status::Error(std::string("shm segment: ") + what + " " + name + ": " + ErrnoText(err));
}

// Closes fd in every case; maps `size` bytes read-write, shared.
Status MapFd(int fd, size_t size, const std::string& name, void** base) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_err = errno;
  const bool close_ok = close(fd) == 0;
  const int close_err = errno;
  if (p == MAP_FAILED) return SysError("mmap", name, map_err);
  if (!close_ok) {
    munmap(p, size);  // already failing; the close error is the one to report
    return SysError("close", name, close_err);
  }
  *base = p;
  return Status::Ok();
}

Status SizeOf(int fd, const std::string& name, size_t* size) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return SysError("fstat", name, errno);
  if (st.st_size <= 0) {
    return Status::Error("shm segment: " + name + " has size 0 (not sized yet, or not mappable)");
  }
  if (static_cast<uint64_t>(st.st_size) > std::numeric_limits<size_t>::max()) {
    return Status::Error("shm segment: " + name + " is too large to map");
  }
  *size = static_cast<size_t>(st.st_size);
  return Status::Ok();
}

Status CheckSize(size_t size) {
  if (size == 0) return Status::Error("shm segment: size must be positive");
  if (size > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
    return Status::Error("shm segment: size " + std::to_string(size) + " is too large");
  }
  return Status::Ok();
}

Status Truncate(int fd, size_t size, const std::string& name) {
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int err = errno;
    std::string msg = "shm segment: cannot size " + name + " to " + std::to_string(size) +
                      " bytes: " + ErrnoText(err);
    if (err == EINVAL) msg += " (on hugetlbfs the size must be a multiple of the huge page size)";
    return Status::Error(msg);
  }
  return Status::Ok();
}

}  // namespace

// Maps an existing object at its whole size (at least min_size); closes fd in
// every case.
Status MapWhole(int fd, const std::string& name, size_t min_size, Cleanup cleanup,
                std::unique_ptr<Segment>* out) {
  size_t size = 0;
  Status st = SizeOf(fd, name, &size);
  if (st.ok() && size < min_size) {
    st = Status::Error("shm segment: " + name + " is " + std::to_string(size) +
                       " bytes, need at least " + std::to_string(min_size));
  }
  if (!st.ok()) {
    close(fd);
    return st;
  }
  void* base = nullptr;
  st = MapFd(fd, size, name, &base);
  if (!st.ok()) return st;
  out->reset(new MappedSegment(base, size, name, cleanup));
  return Status::Ok();
}

Status CreatePosixSegment(size_t size, std::unique_ptr<Segment>* out) {
  Status st = CheckSize(size);
  if (!st.ok()) return st;
  std::string name;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    uint64_t random = 0;
    if (getrandom(&random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
      return Status::Error(std::string("shm segment: getrandom: ") + std::strerror(errno));
    }
    char buf[64];
    std::snprintf(buf, sizeof(buf), "/flyt-%d-%016llx", static_cast<int>(getpid()),
                  static_cast<unsigned long long>(random));
    name = buf;
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) return SysError("shm_open", name, errno);
  }
  if (fd < 0) return Status::Error("shm segment: no unused name after 8 tries");
  st = Truncate(fd, size, name);
  void* base = nullptr;
  if (st.ok()) {
    st = MapFd(fd, size, name, &base);
  } else {
    close(fd);  // already failing; the unlink below is what matters
  }
  if (!st.ok()) {
    shm_unlink(name.c_str());  // already failing; nothing more to report
    return st;
  }
  out->reset(new MappedSegment(base, size, name, Cleanup::kShmUnlink));
  return Status::Ok();
}

Status OpenPosixSegment(const std::string& name, std::unique_ptr<Segment>* out) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return Status::Error("shm segment: bad POSIX shm name '" + name + "' (want /name)");
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return SysError("shm_open", name, errno);
  return MapWhole(fd, name, 0, Cleanup::kNone, out);
}

Status CreateFileSegment(const std::string& path, size_t size, std::unique_ptr<Segment>* out) {
  Status st = CheckSize(size);
  if (!st.ok()) return st;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return SysError("create", path, errno);
  st = Truncate(fd, size, path);
  void* base = nullptr;
  if (st.ok()) {
    st = MapFd(fd, size, path, &base);
  } else {
    close(fd);
  }
  if (!st.ok()) {
    unlink(path.c_str());  // already failing; nothing more to report
    return st;
  }
  out->reset(new MappedSegment(base, size, path, Cleanup::kFileUnlink));
  return Status::Ok();
}

Status OpenFileSegment(const std::string& path, size_t min_size, std::unique_ptr<Segment>* out) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return SysError("open", path, errno);
  return MapWhole(fd, path, min_size, Cleanup::kNone, out);
}

Status OpenPciBarSegment(const std::string& path, std::unique_ptr<Segment>* out) {
  // O_SYNC: sysfs maps the BAR uncached unless resourceN_wc is used; either
  // way the ring's atomics work, as the BAR is RAM on the host side.
  const int fd = open(path.c_str(), O_RDWR | O_SYNC | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    Status st = SysError("open PCI BAR", path, err);
    if (err == EACCES || err == EPERM) {
      st = Status::Error(st.message() + "; mapping a BAR needs root or a udev rule");
    }
    return st;
  }
  Status st = MapWhole(fd, path, 0, Cleanup::kNone, out);
  if (!st.ok() && st.message().find("mmap") != std::string::npos) {
    return Status::Error(st.message() +
                         " (an I/O-port BAR cannot be mapped; ivshmem's memory is BAR2)");
  }
  return st;
}

namespace {

// Ends the creation of a segment whose descriptor the caller hands on: when
// `st` (the creation so far) is ok, maps `fd` shared and passes it out in
// *fd_out; otherwise, or if the mapping fails, closes it.
Status MapCreated(int fd, size_t size, const std::string& name, Status st,
                  std::unique_ptr<Segment>* out, int* fd_out) {
  void* base = nullptr;
  if (st.ok()) {
    base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) st = SysError("mmap", name, errno);
  }
  if (!st.ok()) {
    close(fd);  // already failing; the first error is the one to report
    return st;
  }
  out->reset(new MappedSegment(base, size, name, Cleanup::kNone));
  *fd_out = fd;
  return Status::Ok();
}

}  // namespace

Status CreateMemfdSegment(size_t size, std::unique_ptr<Segment>* out, int* fd_out) {
  Status st = CheckSize(size);
  if (!st.ok()) return st;
  const std::string name = "memfd:flyt-shm";
  const int fd = memfd_create("flyt-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return SysError("memfd_create", name, errno);
  st = Truncate(fd, size, name);
  if (st.ok() && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    st = SysError("seal", name, errno);
  }
  return MapCreated(fd, size, name, st, out, fd_out);
}

Status CreateUnlinkedFileSegment(const std::string& dir, size_t size, std::unique_ptr<Segment>* out,
                                 int* fd_out) {
  Status st = CheckSize(size);
  if (!st.ok()) return st;
  static std::atomic<uint64_t> counter{0};
  const std::string path = dir + "/flyt-" + std::to_string(getpid()) + "-" +
                           std::to_string(counter.fetch_add(1)) + ".seg";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return SysError("create", path, errno);
  if (unlink(path.c_str()) != 0) st = SysError("unlink", path, errno);
  if (st.ok()) st = Truncate(fd, size, path);
  return MapCreated(fd, size, path, st, out, fd_out);
}

Status MapFdSegment(int fd, size_t expected_size, std::unique_ptr<Segment>* out,
                    bool allow_unsealed) {
  const std::string name = "memfd from the peer";
  size_t size = 0;
  Status st = SizeOf(fd, name, &size);
  if (st.ok() && size != expected_size) {
    st = Status::Error("shm segment: the peer's memfd is " + std::to_string(size) +
                       " bytes, its header says " + std::to_string(expected_size));
  }
  if (st.ok() && !allow_unsealed) {
    const int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0) {
      st = SysError("F_GET_SEALS on", name, errno);
    } else if ((seals & F_SEAL_SHRINK) == 0) {
      st = Status::Error("shm segment: the peer's memfd is not sealed against shrinking");
    }
  }
  if (!st.ok()) {
    close(fd);
    return st;
  }
  void* base = nullptr;
  st = MapFd(fd, size, name, &base);
  if (!st.ok()) return st;
  out->reset(new MappedSegment(base, size, name, Cleanup::kNone));
  return Status::Ok();
}

}  // namespace flyt::transport
