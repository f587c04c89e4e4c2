// Implementation of server/tenant_board.h.
#include "server/tenant_board.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <string>

namespace flyt::server {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "board atomics must be lock-free");

namespace {

constexpr size_t kBoardBytes = (sizeof(BoardLayout) + 4095) / 4096 * 4096;

Status Errno(const std::string& what) {
  return Status::Error("tenant board: " + what + ": " + std::strerror(errno));
}

}  // namespace

Status TenantBoard::Create(std::unique_ptr<TenantBoard>* out) {
  const int fd = memfd_create("flyt-tenant", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create");
  if (ftruncate(fd, kBoardBytes) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    Status st = Errno("size");
    close(fd);
    return st;
  }
  void* p = mmap(nullptr, kBoardBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    Status st = Errno("mmap");
    close(fd);
    return st;
  }
  out->reset(new TenantBoard(new (p) BoardLayout(), fd));
  return Status::Ok();
}

Status TenantBoard::Map(int fd, std::unique_ptr<TenantBoard>* out) {
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || static_cast<size_t>(sb.st_size) != kBoardBytes) {
    close(fd);
    return Status::Error("tenant board: the descriptor is not a board of this build");
  }
  void* p = mmap(nullptr, kBoardBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    errno = err;
    return Errno("mmap");
  }
  auto* layout = static_cast<BoardLayout*>(p);
  if (layout->magic != BoardLayout::kMagic || layout->version != BoardLayout::kVersion) {
    munmap(p, kBoardBytes);
    return Status::Error("tenant board: wrong magic or version");
  }
  out->reset(new TenantBoard(layout, -1));
  return Status::Ok();
}

TenantBoard::~TenantBoard() {
  munmap(layout_, kBoardBytes);
  if (fd_ >= 0) close(fd_);
}

}  // namespace flyt::server
