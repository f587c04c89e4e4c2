// UCX loaded at run time: the ucp_* entry points the ucx:// transport uses, found with
// dlopen/dlsym at the first ucx:// use, so that flyt-server and the client library start
// (and serve tcp/unix/shm/tls) on hosts without UCX.
//
// Owns: finding the UCX libraries (FLYT_UCX_LIB_DIR; a lib/ucx folder carried next to
// the binaries by tests/gpu/stage_build.sh, found relative to the executable or library
// that holds this code; then the system's libucp.so.0), the table of entry points, the
// process's single UCP context (created once, never destroyed: UCX is not ours to tear
// down at exit; features TAG, RMA and WAKEUP) and what it can reach (memory types), and
// the endpoint settings both of the transport's files use (peer-failure handling).
// Must not touch: connections, frames, CUDA. Built only when UCX's
// headers were found at configure time (FLYT_HAVE_UCX); the headers give the types and
// constants, the libraries themselves are never linked.
#pragma once

#include <ucp/api/ucp.h>

#include <cstddef>
#include <string>

#include "common/status.h"

namespace flyt::transport::ucx {

struct Api {
  decltype(&::ucp_get_version) get_version;
  decltype(&::ucp_config_read) config_read;
  decltype(&::ucp_config_release) config_release;
  decltype(&::ucp_init_version) init_version;
  decltype(&::ucp_context_query) context_query;
  decltype(&::ucp_worker_create) worker_create;
  decltype(&::ucp_worker_destroy) worker_destroy;
  decltype(&::ucp_worker_get_address) worker_get_address;
  decltype(&::ucp_worker_release_address) worker_release_address;
  decltype(&::ucp_worker_progress) worker_progress;
  decltype(&::ucp_worker_get_efd) worker_get_efd;
  decltype(&::ucp_worker_arm) worker_arm;
  decltype(&::ucp_ep_create) ep_create;
  decltype(&::ucp_ep_close_nbx) ep_close_nbx;
  decltype(&::ucp_tag_send_nbx) tag_send_nbx;
  decltype(&::ucp_tag_probe_nb) tag_probe_nb;
  decltype(&::ucp_tag_msg_recv_nbx) tag_msg_recv_nbx;
  decltype(&::ucp_request_check_status) request_check_status;
  decltype(&::ucp_request_cancel) request_cancel;
  decltype(&::ucp_request_free) request_free;
  decltype(&::ucs_status_string) status_string;
  // One-sided access (transport/ucx_rma.h).
  decltype(&::ucp_mem_map) mem_map;
  decltype(&::ucp_mem_unmap) mem_unmap;
  decltype(&::ucp_rkey_pack) rkey_pack;
  decltype(&::ucp_rkey_buffer_release) rkey_buffer_release;
  decltype(&::ucp_ep_rkey_unpack) ep_rkey_unpack;
  decltype(&::ucp_rkey_destroy) rkey_destroy;
  decltype(&::ucp_get_nbx) get_nbx;
  decltype(&::ucp_put_nbx) put_nbx;
  decltype(&::ucp_ep_flush_nbx) ep_flush_nbx;
  decltype(&::ucp_ep_print_info) ep_print_info;  // optional (null when missing)

  ucp_context_h context = nullptr;  // features TAG | RMA | WAKEUP, shared by all workers
  uint64_t memory_types = 0;        // UCS_BIT(ucs_memory_type_t) the context can reach
  std::string library_dir;          // where libucp.so.0 came from ("" = the system's)
  std::string version;              // "1.13.1"

  std::string Why(ucs_status_t s) const { return status_string(s); }
};

// Loads only the libraries (no UCP context): flyt-server's main process checks at
// start-up that a ucx:// listener will work in its workers. The error says what is
// missing and how to get it ("ucx:// is not available: libucp.so.0 not found ...").
Status CheckAvailable();

// Loads UCX and creates the process's UCP context at the first call; later calls return
// the same table (or the same error). Thread-safe.
Status Get(const Api** out);

// Whether endpoints ask for UCX's peer-failure handling (error mode PEER): yes unless
// UCX_TLS names only shared-memory transports, which in UCX 1.13 cannot report a failed
// peer (asking would rule them all out). Without it the socket alone tells of a death.
bool WantPeerErrors();

// A worker address from a peer, checked as far as UCX's format is known outside UCX:
// its length, and the version in its first byte (UCX aborts the process on an unknown
// one). UCX parses the rest itself, without a length: see CreateEndpoint.
Status CheckWorkerAddress(const void* address, size_t n);

// An endpoint of `worker` to the worker at `address` (n bytes, CheckWorkerAddress; UCX
// reads it from a copy followed by zeros, so that a short one is never read past its
// end), with peer-failure handling (`cb`, `arg`) when WantPeerErrors() and the
// transports reached can give it; *peer_errors says whether it has it. `peer` and the
// error name the other side.
Status CreateEndpoint(const Api& api, ucp_worker_h worker, const void* address, size_t n,
                      ucp_err_handler_cb_t cb, void* arg, const std::string& peer, ucp_ep_h* ep,
                      bool* peer_errors);

}  // namespace flyt::transport::ucx
