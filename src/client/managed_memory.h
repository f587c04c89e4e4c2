// Managed memory's host side: the application's view of each managed
// allocation, kept coherent with the GPU's by Flyt. The same machinery keeps
// pinned host memory that the GPU maps over a socket transport coherent
// (cudaHostAllocMapped, cudaHostRegisterMapped, cuMemHostGetDevicePointer):
// the server holds pinned, mapped memory at the same address, and this
// process's pages of it are a view like a managed range's ("host" ranges).
//
// Owns: for each managed range, a mapping at the device address (a memfd, so
// that a second, private mapping can fill pages before the app may see them),
// per 64 KiB granule a state (absent, clean copy, written by the host) and the
// twin of each written granule; the SIGSEGV handler that turns the app's
// first touch of a granule into a fetch or a write grant; the pager thread
// that serves those faults over its own connection to each server that holds
// managed memory (ops::kOpAttachPagingChannel; with FLYT_SERVER "A,B,..." a
// range is served by the server of the GPU it was allocated on, host ranges
// by server 0), and the coherence points:
//   - before any device work is sent, bytes the host changed go to the GPU
//     (only the changed bytes: a twin diff, so concurrent device writes to
//     other bytes of the granule survive);
//   - when device work is known complete (synchronize, a query that says
//     done, a copy back to the host, a host function starting), copies the
//     device may have changed since they were fetched are dropped, and
//     prefetches to the host are fetched in bulk.
// The handler is async-signal-safe: it only hands the address to the pager
// thread and waits on a futex. It chains to the application's handler for
// addresses that are not managed, and in a forked child.
// Must not: take the client's connection lock while holding its own, touch a
// managed page through the app's mapping, or write to stdout.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace flyt::client::managed {

// Maps [base, base+size) as the host view of a managed range of server
// `server` of FLYT_SERVER (0 with one server), whose paging channel serves it.
// `fresh`: a new allocation (zero on both sides until device work runs), so
// first touches need no fetch. `owner`: the library a __managed__ variable
// belongs to (0: an allocation). CUDA_ERROR_OUT_OF_MEMORY when this process
// already uses those addresses; CUDA_ERROR_INVALID_VALUE when another range
// (another server's) holds base.
CUresult Map(uint64_t base, uint64_t size, bool fresh, uint64_t owner, int server = 0);
// Pinned host memory mapped for the GPU: the server holds pinned memory at the
// same addresses, the pages from `server_base` that hold [p, p+n), which the
// paging channel serves. Without `adopt`, [p, p+n) (whole pages) is new (zero)
// and replaces this process's reservation of it. With `adopt`, the bytes are the
// app's (a buffer it registered, or one it allocated pinned before it asked for
// the device pointer) and keep their values, which reach the server at the next
// device work: the whole pages become a view, and the bytes on pages the buffer
// shares with other data ("edges") are compared and copied at each coherence
// point instead (they are never protected).
CUresult MapHost(uint64_t p, uint64_t n, uint64_t server_base, bool adopt);
// Forgets what MapHost made for `server_base`. `restore`: the bytes stay at their
// addresses in ordinary memory (cuMemHostUnregister; the caller synchronised
// first), else the view's pages go (cuMemFreeHost). False if none.
bool UnmapHost(uint64_t server_base, bool restore);
// True when p lies in a host range (not managed memory).
bool IsHost(uint64_t p);
// Forgets the managed range at `base` (the app frees it): false if none (a
// host range is not freed this way).
bool Unmap(uint64_t base);
void UnmapOwnedBy(uint64_t owner);  // its library was unloaded
bool OwnsAny(uint64_t owner);       // a library's __managed__ variables are mapped
void UnmapAll();                    // a device reset took them all
// The managed range that holds all of [p, p+n).
bool Find(uint64_t p, uint64_t n, uint64_t* base, uint64_t* size);
// The server whose managed range holds p; -1: none (or a host range).
int ServerOf(uint64_t p);
// True when [p, p+n) overlaps managed memory.
bool Overlaps(uint64_t p, uint64_t n);
// True while this process has any managed memory (one relaxed load).
bool Any();

// Coherence points, called by Client::Post and Client::Call.
// Device work is about to be sent: the host's writes reach the GPU first.
void BeforeDeviceWork();
// A call that only waits for device work (synchronize, query): the host's writes
// go to the GPU first without counting as device work, so a kernel that waits on
// a flag the host sets in mapped or managed memory sees it.
void FlushHostWrites();
// Device work is known complete. `all_idle`: everything sent before has
// finished (cuCtxSynchronize), so pages fetched from now on stay valid until
// the next device work.
void AfterCompletion(bool all_idle);
// The app prefetched [p, p+n) to the host: fetched in bulk at the next completion.
void NotePrefetchToHost(uint64_t p, uint64_t n);
// Epoch of device work sent so far (for the call hooks).
uint64_t Epoch();
// In a child forked after managed memory existed: the hooks stop for good and
// the parent's paging connection is left alone (the child's CUDA calls fail,
// as natively; its copy of the view is gone, MADV_DONTFORK).
void AfterForkInChild();

}  // namespace flyt::client::managed
