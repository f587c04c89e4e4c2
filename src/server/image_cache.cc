// Implementation of server/image_cache.h.
#include "server/image_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace flyt::server {

Status ImageBytes::Map(int fd, uint64_t size, std::shared_ptr<const ImageBytes>* out) {
  struct stat sb {};
  if (size == 0 || fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) != size)
    return Status::Error("code image: descriptor of the wrong size");
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status::Error(std::string("code image: mmap: ") + strerror(errno));
  out->reset(new ImageBytes(static_cast<const uint8_t*>(p), size, true));
  return Status::Ok();
}

std::shared_ptr<const ImageBytes> ImageBytes::Copy(const uint8_t* data, size_t size) {
  auto* copy = new uint8_t[size > 0 ? size : 1];
  std::memcpy(copy, data, size);
  return std::shared_ptr<const ImageBytes>(new ImageBytes(copy, size, false));
}

ImageBytes::~ImageBytes() {
  if (mapped_) {
    munmap(const_cast<uint8_t*>(data_), size_);
  } else {
    delete[] data_;
  }
}

int ImageToMemfd(const uint8_t* bytes, size_t size, Status* error) {
  const int fd = memfd_create("flyt-image", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    *error = Status::Error(std::string("code image: memfd_create: ") + strerror(errno));
    return -1;
  }
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = Status::Error(std::string("code image: write: ") + strerror(errno));
      close(fd);
      return -1;
    }
    done += static_cast<size_t>(n);
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    *error = Status::Error(std::string("code image: seal: ") + strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

ImageCache::~ImageCache() {
  for (auto& [key, e] : images_) close(e.fd);
}

int ImageCache::Find(uint64_t h0, uint64_t h1, uint64_t* size) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = images_.find({h0, h1});
  if (it == images_.end()) return -1;
  *size = it->second.size;
  return fcntl(it->second.fd, F_DUPFD_CLOEXEC, 3);
}

void ImageCache::Insert(uint64_t h0, uint64_t h1, int fd, uint64_t size) {
  // Only sealed images: a worker must not change bytes other workers load.
  const int seals = fcntl(fd, F_GET_SEALS);
  struct stat sb {};
  if (seals < 0 || (seals & F_SEAL_WRITE) == 0 || (seals & F_SEAL_SHRINK) == 0 ||
      fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) != size) {
    close(fd);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, fresh] = images_.emplace(std::make_pair(h0, h1), Entry{fd, size});
  if (!fresh) {
    close(fd);
    return;
  }
  bytes_ += size;
}

uint64_t ImageCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

size_t ImageCache::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return images_.size();
}

}  // namespace flyt::server
