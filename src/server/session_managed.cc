// Managed memory calls of a session that need hand-written marshalling:
// cuMemRangeGetAttribute (ops::kOpMemRangeAttribute), and which globals of
// loaded code are __managed__ variables (NoteGlobal). Allocation, advice,
// prefetch and stream attachment are generic (protocol/api_list.h); the pages
// themselves move on the paging channel (server/managed_pager.h).
// Must not touch another session's state.
#include <vector>

#include "server/session.h"

namespace flyt::server {

bool Session::MemRangeAttribute(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  uint32_t attr = 0;
  uint64_t ptr = 0, count = 0, size = 0;
  if (!in.Get(&attr) || !in.Get(&ptr) || !in.Get(&count) || !in.Get(&size) || in.remaining() != 0)
    return false;
  // The attributes are 4-byte values, ACCESSED_BY one per device: a larger
  // buffer than a few devices' worth is refused, as nothing needs it.
  if (size > 4096) {
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  // Only the session's own managed ranges: the driver would answer for any
  // address of this process, other sessions' included.
  if (!pager_.Contains(ptr, count)) {
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  std::vector<uint8_t> data(size);
  *rc = api().cuMemRangeGetAttribute(size ? data.data() : nullptr, size,
                                     static_cast<CUmem_range_attribute>(attr), ptr, count);
  if (*rc == CUDA_SUCCESS) out.PutBytes(data.data(), data.size());
  return true;
}

void Session::NoteGlobal(uint64_t ptr, uint64_t image) {
  DriverApi& a = api();
  int managed = 0;
  CUdeviceptr block = 0;
  size_t block_size = 0;
  if (ptr == 0 || a.cuPointerGetAttribute == nullptr ||
      a.cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr) != CUDA_SUCCESS ||
      !managed || a.cuMemGetAddressRange_v2(&block, &block_size, ptr) != CUDA_SUCCESS)
    return;
  // Whole pages, as the client maps them: a module's variables may share one.
  constexpr uint64_t kPage = 4096;
  const uint64_t first = block & ~(kPage - 1);
  pager_.Add(first, block + block_size - first, image);
  reply_info_ |= wire::kReplyManaged;
}

}  // namespace flyt::server
