// Shared-memory segments: memory two processes (or a VM and its host) map.
//
// Owns: creating, opening, mapping and unmapping a segment, and removing the
// name of one this process created (POSIX shm unlinks on destruction). Three
// backings: POSIX shared memory (/dev/shm), a plain file (tmpfs, hugetlbfs, a
// file a hypervisor shares) and a PCI BAR resource file (QEMU ivshmem as a
// guest sees it), plus anonymous sealed memfds (the shm:// transport passes
// their fd over a Unix socket). Must not touch: what lives inside the segment (see
// shm_ring.h) or who may attach (the control plane hands out names).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/status.h"

namespace flyt::transport {

class Segment {
 public:
  virtual ~Segment() = default;
  virtual void* base() const = 0;   // page-aligned
  virtual size_t size() const = 0;  // bytes mapped
  // POSIX shm name ("/flyt-<pid>-<hex>") or file path; what a peer opens.
  virtual const std::string& name() const = 0;
};

// Creates a new POSIX shared-memory object with a unique name
// "/flyt-<pid>-<random hex>" (mode 0600), sizes and maps it. The object's
// name is unlinked when the returned segment is destroyed; peers that mapped
// it keep their mapping.
Status CreatePosixSegment(size_t size, std::unique_ptr<Segment>* out);
// Opens and maps an existing POSIX shared-memory object; its size comes from
// the object. Destroying the segment unmaps it and leaves the name alone.
Status OpenPosixSegment(const std::string& name, std::unique_ptr<Segment>* out);

// Creates a new file (O_EXCL, mode 0600), sizes it with ftruncate and maps it
// MAP_SHARED; the file is removed when the segment is destroyed. On hugetlbfs
// `size` must be a multiple of the huge page size.
Status CreateFileSegment(const std::string& path, size_t size, std::unique_ptr<Segment>* out);
// Maps an existing file MAP_SHARED. `min_size` (0 = any) is the least size
// the file must have; the whole file is mapped. Never truncates or removes it.
Status OpenFileSegment(const std::string& path, size_t min_size, std::unique_ptr<Segment>* out);

// Maps a PCI BAR resource file read-write, e.g.
// /sys/bus/pci/devices/0000:00:05.0/resource2 (ivshmem's shared memory as a
// guest sees it). Its size comes from the file; nothing is created, resized
// or removed. Needs permission to open the file (root or a udev rule).
Status OpenPciBarSegment(const std::string& path, std::unique_ptr<Segment>* out);

// Creates an anonymous memfd (memfd_create, MFD_CLOEXEC | MFD_ALLOW_SEALING)
// of `size` bytes, maps it and seals its size (F_SEAL_SHRINK | F_SEAL_GROW |
// F_SEAL_SEAL), so whoever gets the fd can neither shrink it (SIGBUS on our
// side) nor grow it. No name exists anywhere: the memory goes away with the
// last fd and mapping. *fd is the caller's to pass on (SCM_RIGHTS) and close.
Status CreateMemfdSegment(size_t size, std::unique_ptr<Segment>* out, int* fd);
// Creates a file in `dir` (O_EXCL, mode 0600) and removes its name at once,
// then sizes and maps it: a segment on the filesystem of `dir` (hugetlbfs,
// a DAX mount, a size-limited tmpfs) that nothing can open by name and that
// no crash can leave behind. Files cannot be sealed: whoever gets *fd could
// shrink it. *fd is the caller's to pass on and close.
Status CreateUnlinkedFileSegment(const std::string& dir, size_t size, std::unique_ptr<Segment>* out,
                                 int* fd);
// Maps a memfd received from a peer: it must be exactly `expected_size` bytes
// and, unless `allow_unsealed` (a file segment), sealed against shrinking.
// Closes `fd` in every case.
Status MapFdSegment(int fd, size_t expected_size, std::unique_ptr<Segment>* out,
                    bool allow_unsealed = false);

}  // namespace flyt::transport
