// The JIT linker of one session: cuLinkCreate_v2, cuLinkAddData_v2 (the
// client sends cuLinkAddFile_v2's file as data), cuLinkComplete and
// cuLinkDestroy (hand-written ops, protocol/ops.h; server/session.h).
//
// Owns: the session's link states (the driver's handles, validated on every
// use: a bogus one is CUDA_ERROR_INVALID_HANDLE, never passed to the driver)
// with the option arrays and log buffers the driver writes through until the
// state is destroyed, and their destruction when the client leaves without
// doing it. Numeric options go to the driver by value; the log buffers are the
// server's own, of the sizes the client asked (at most kMaxLinkLogBytes), and
// what the driver wrote there and in the output options goes back with the
// replies. Options that carry pointers into the client (symbol tables, name
// lists) are refused with CUDA_ERROR_NOT_SUPPORTED. Must not touch other
// sessions' state or the session's other handles.
#include <cstring>
#include <string>

#include "common/log.h"
#include "server/session.h"

namespace flyt::server {

namespace {

unsigned long long Id(uint64_t v) { return static_cast<unsigned long long>(v); }

// Options whose value points into the client's memory and that Flyt cannot serve.
bool PointerOption(uint32_t option) {
  return option == CU_JIT_GLOBAL_SYMBOL_NAMES || option == CU_JIT_GLOBAL_SYMBOL_ADDRESSES ||
         option == CU_JIT_REFERENCED_KERNEL_NAMES || option == CU_JIT_REFERENCED_VARIABLE_NAMES;
}

// Reads u32 n, n x (u32 option, u64 value). False: malformed. *rc is set
// when an option cannot be served.
bool ReadOptions(wire::Reader& in, std::vector<CUjit_option>* options, std::vector<void*>* values,
                 CUresult* rc) {
  uint32_t n = 0;
  if (!in.Get(&n) || n > ops::kMaxLinkOptions) return false;
  options->resize(n);
  values->resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t option = 0;
    uint64_t value = 0;
    if (!in.Get(&option) || !in.Get(&value)) return false;
    if (option >= CU_JIT_NUM_OPTIONS && *rc == CUDA_SUCCESS) *rc = CUDA_ERROR_INVALID_VALUE;
    if (PointerOption(option)) *rc = CUDA_ERROR_NOT_SUPPORTED;
    (*options)[i] = static_cast<CUjit_option>(option);
    (*values)[i] = reinterpret_cast<void*>(static_cast<uintptr_t>(value));
  }
  return true;
}

size_t Clamp(void* value) {
  auto n = static_cast<size_t>(static_cast<unsigned>(reinterpret_cast<uintptr_t>(value)));
  return n < ops::kMaxLinkLogBytes ? n : ops::kMaxLinkLogBytes;
}

}  // namespace

void Session::PutLinkOutputs(const LinkState& link, wire::Writer& out) const {
  out.Put<uint32_t>(static_cast<uint32_t>(link.values.size()));
  for (void* v : link.values) out.Put<uint64_t>(reinterpret_cast<uintptr_t>(v));
  auto put_log = [&](const std::vector<char>& log, int at) {
    size_t n = at < 0 || log.empty() ? 0 : strnlen(log.data(), log.size());
    out.PutBlob(log.data(), n);
  };
  put_log(link.info_log, link.info_at);
  put_log(link.error_log, link.error_at);
}

// Request: options. Reply: u64 state.
bool Session::LinkCreate(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  auto link = std::make_unique<LinkState>();
  *rc = CUDA_SUCCESS;
  if (!ReadOptions(in, &link->options, &link->values, rc) || in.remaining() != 0) return false;
  if (*rc != CUDA_SUCCESS) return true;
  DriverApi& a = api();
  if (a.cuLinkCreate_v2 == nullptr || a.cuLinkDestroy == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  // The log buffers: the server's own, as large as the largest size asked
  // (clamped). Every buffer option points at them, whatever the client sent:
  // a value the client chose never reaches the driver as an address.
  size_t info_size = 0, error_size = 0;
  for (size_t i = 0; i < link->options.size(); ++i) {
    CUjit_option o = link->options[i];
    if (o == CU_JIT_INFO_LOG_BUFFER) link->info_at = static_cast<int>(i);
    if (o == CU_JIT_ERROR_LOG_BUFFER) link->error_at = static_cast<int>(i);
    if (o != CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES && o != CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) continue;
    size_t n = Clamp(link->values[i]);
    link->values[i] = reinterpret_cast<void*>(static_cast<uintptr_t>(n));
    size_t& size = o == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES ? info_size : error_size;
    if (n > size) size = n;
  }
  link->info_log.assign(info_size + 1, '\0');  // never empty: data() is a real buffer
  link->error_log.assign(error_size + 1, '\0');
  for (size_t i = 0; i < link->options.size(); ++i) {
    if (link->options[i] == CU_JIT_INFO_LOG_BUFFER) link->values[i] = link->info_log.data();
    if (link->options[i] == CU_JIT_ERROR_LOG_BUFFER) link->values[i] = link->error_log.data();
  }
  CUlinkState state = nullptr;
  *rc = a.cuLinkCreate_v2(static_cast<unsigned>(link->options.size()), link->options.data(),
                          link->values.data(), &state);
  if (*rc != CUDA_SUCCESS) return true;
  uint64_t handle = reinterpret_cast<uintptr_t>(state);
  if (state == nullptr || links_.count(handle) != 0) {
    FLYT_WARN("session %llu: cuLinkCreate_v2 gave an unusable state 0x%llx", Id(id_), Id(handle));
    if (state != nullptr) {
      CUresult destroyed = a.cuLinkDestroy(state);
      if (destroyed != CUDA_SUCCESS)
        FLYT_WARN("session %llu: cuLinkDestroy failed with error %d", Id(id_), destroyed);
    }
    *rc = CUDA_ERROR_UNKNOWN;
    return true;
  }
  link->state = state;
  links_.emplace(handle, std::move(link));
  out.Put<uint64_t>(handle);
  return true;
}

// Request: u64 state, u32 type, u8 has name, string name, blob data, options.
// Reply (whatever the result, once the state is known): outputs.
bool Session::LinkAddData(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  uint64_t handle = 0;
  uint32_t type = 0;
  uint8_t has_name = 0;
  std::string name;
  const uint8_t* data = nullptr;
  uint32_t size = 0;
  std::vector<CUjit_option> options;
  std::vector<void*> values;
  *rc = CUDA_SUCCESS;
  if (!in.Get(&handle) || !in.Get(&type) || !in.Get(&has_name) ||
      !in.GetString(&name, ops::kMaxNameLen) || !in.GetBlob(&data, &size) ||
      !ReadOptions(in, &options, &values, rc) || in.remaining() != 0)
    return false;
  auto it = links_.find(handle);
  if (it == links_.end()) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  for (CUjit_option o : options) {
    // Compiler options only, as the driver says; these would point into the client.
    if (o == CU_JIT_INFO_LOG_BUFFER || o == CU_JIT_ERROR_LOG_BUFFER) *rc = CUDA_ERROR_NOT_SUPPORTED;
  }
  if (*rc != CUDA_SUCCESS) return true;
  LinkState& link = *it->second;
  // An empty blob still needs an address.
  static const uint8_t kNothing = 0;
  *rc = api().cuLinkAddData_v2(
      link.state, static_cast<CUjitInputType>(type),
      const_cast<uint8_t*>(size > 0 ? data : &kNothing), size, has_name ? name.c_str() : nullptr,
      static_cast<unsigned>(options.size()), options.data(), values.data());
  PutLinkOutputs(link, out);
  return true;
}

// Request: u64 state. Reply: outputs, then on success u64 size and the cubin.
bool Session::LinkComplete(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  uint64_t handle = 0;
  if (!in.Get(&handle) || in.remaining() != 0) return false;
  auto it = links_.find(handle);
  if (it == links_.end()) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  LinkState& link = *it->second;
  void* cubin = nullptr;
  size_t size = 0;
  *rc = api().cuLinkComplete(link.state, &cubin, &size);
  PutLinkOutputs(link, out);
  if (*rc != CUDA_SUCCESS) return true;
  if (cubin == nullptr || size == 0) {
    *rc = CUDA_ERROR_UNKNOWN;
    return true;
  }
  // The reply must fit in one frame (wire::kMaxPayload).
  if (size > wire::kMaxPayload - 4096 - out.size()) {
    FLYT_WARN("session %llu: cuLinkComplete made %zu bytes of code, more than a reply carries",
              Id(id_), size);
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  out.Put<uint64_t>(size);
  out.PutBytes(cubin, size);
  return true;
}

// Request: u64 state.
bool Session::LinkDestroy(wire::Reader& in, CUresult* rc) {
  uint64_t handle = 0;
  if (!in.Get(&handle) || in.remaining() != 0) return false;
  auto it = links_.find(handle);
  if (it == links_.end()) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  *rc = api().cuLinkDestroy(it->second->state);
  links_.erase(it);  // the driver's state is gone or unusable either way
  return true;
}

void Session::ReleaseLinks() {
  if (links_.empty()) return;
  size_t n = links_.size();
  for (auto& [handle, link] : links_) {
    CUresult rc = api().cuLinkDestroy(link->state);
    if (rc != CUDA_SUCCESS)
      FLYT_WARN("session %llu: cuLinkDestroy(0x%llx) failed with error %d", Id(id_), Id(handle),
                rc);
  }
  links_.clear();
  FLYT_INFO("session %llu: destroyed %zu JIT link states", Id(id_), n);
}

}  // namespace flyt::server
