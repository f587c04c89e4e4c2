// Code images (fatbins, cubins, PTX) by content hash, once per flyt-server.
//
// The main process keeps every image a client sent, each in a sealed memfd;
// a worker asks for an image by hash (server/worker.h) and maps the
// descriptor it gets, so that an image crosses the wire once per server, not
// once per client process, and is never copied between the processes.
// Owns: the cache (main process) and the read-only views of its images
// (workers). Must not load code: workers hand the bytes to the driver.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "common/status.h"

namespace flyt::server {

// An image's bytes, mapped read-only (or held in memory).
class ImageBytes {
 public:
  // Maps `size` bytes of `fd` (the descriptor stays the caller's).
  static Status Map(int fd, uint64_t size, std::shared_ptr<const ImageBytes>* out);
  // A private copy (when the image cannot be shared).
  static std::shared_ptr<const ImageBytes> Copy(const uint8_t* data, size_t size);
  ~ImageBytes();
  ImageBytes(const ImageBytes&) = delete;
  ImageBytes& operator=(const ImageBytes&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  ImageBytes(const uint8_t* data, size_t size, bool mapped)
      : data_(data), size_(size), mapped_(mapped) {}
  const uint8_t* data_;
  size_t size_;
  bool mapped_;
};

// A sealed memfd holding the bytes; -1 with *error set on failure.
int ImageToMemfd(const uint8_t* bytes, size_t size, Status* error);

class ImageCache {
 public:
  ImageCache() = default;
  ~ImageCache();
  ImageCache(const ImageCache&) = delete;
  ImageCache& operator=(const ImageCache&) = delete;
  // A new descriptor of the image (the caller closes it), or -1 if unknown.
  int Find(uint64_t h0, uint64_t h1, uint64_t* size);
  // Takes `fd`; an image already known keeps its first copy.
  void Insert(uint64_t h0, uint64_t h1, int fd, uint64_t size);
  uint64_t bytes() const;
  size_t count() const;

 private:
  struct Entry {
    int fd;
    uint64_t size;
  };
  mutable std::mutex mu_;
  std::map<std::pair<uint64_t, uint64_t>, Entry> images_;
  uint64_t bytes_ = 0;
};

}  // namespace flyt::server
