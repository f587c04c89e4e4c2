// vmm: CUDA virtual memory management as PyTorch's expandable segments use it,
// through driver entry points (cudaGetDriverEntryPointByVersion).
//
//   vmm            granularity (minimum and recommended); a reservation of 3 x
//                  granularity; two physical chunks mapped at offsets 0 and 2 x
//                  granularity (a hole between); access set read-write and read
//                  back; copies both ways into both chunks, memsets, a device copy
//                  from cudaMalloc memory; a copy into the hole fails, unmapping
//                  the hole succeeds; pointer attributes say device memory; the
//                  segment grows in place (a third chunk fills the hole) and one
//                  copy spans all three; cuMemRetainAllocationHandle of a mapped
//                  address gives the same handle (of the hole: an error);
//                  properties round-trip, also of a handle released but still
//                  mapped; freeing a reservation that still maps fails; unmap,
//                  release, free. Under Flyt only (the driver itself crashes on a
//                  bogus handle): a second release and bogus handles fail with an
//                  error, cuMemExportToShareableHandle of a fabric handle is unsupported (801), and
//                  the session still works. The driver's answers were measured on
//                  an H100 (driver 580).
//   vmm quota      also, with VMM_QUOTA_BYTES set (the server's --memory-quota):
//                  cuMemCreate charges the quota (cudaMemGetInfo's free drops by its
//                  size), fails with CUDA_ERROR_OUT_OF_MEMORY beyond it, and the
//                  memory comes back when the handle is released and unmapped.
//   vmm leak       maps memory and exits without freeing anything: the server must
//                  release it when the session ends (prints "leaving").
//   vmm hold       maps memory, prints held.handle=, held.va= and "holding", and
//                  waits to be killed.
//   vmm foreign H A  (Flyt only) another session's handle H and reserved address A:
//                  every call on them fails with CUDA_ERROR_INVALID_VALUE.
//
//   vmm share      a chunk made shareable (POSIX file descriptor), written, exported
//                  with cuMemExportToShareableHandle and passed with SCM_RIGHTS to a
//                  child process (this program again, `vmm import SOCKET`), which
//                  imports, maps and reads it and writes its own bytes, which the
//                  parent then sees through its mapping.
//
// Prints key=value lines and "vmm: PASS". No kernel runs (valid under the sim).
#include <cuda.h>  // driver types only; the program does not link libcuda
#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <vector>

#include "e2e_driver.h"
#include "e2e_vmm.h"

namespace {

e2e::VmmDriver& g_cu = e2e::g_vmm;
using e2e::DeviceProp;

void SetReadWrite(CUdeviceptr p, size_t n) {
  e2e::SetAccess(p, n, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
}

size_t FreeMemory() {
  size_t free_b = 0, total = 0;
  CK(cudaMemGetInfo(&free_b, &total));
  return free_b;
}

// Host round trip of n bytes at p (seeded), then compared.
void RoundTrip(CUdeviceptr p, size_t n, uint32_t seed, const char* what) {
  std::vector<unsigned char> src(n), got(n, 0);
  e2e::Fill(src.data(), n, seed);
  CK(cudaMemcpy(reinterpret_cast<void*>(p), src.data(), n, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(got.data(), reinterpret_cast<void*>(p), n, cudaMemcpyDeviceToHost));
  EXPECT_SAME(got.data(), src.data(), n, what);
}

void Quota(size_t quota, size_t gran) {
  e2e::Step("quota: cuMemCreate charges it");
  const CUmemAllocationProp prop = DeviceProp();
  const size_t free0 = FreeMemory();
  EXPECT(free0 <= quota, "cudaMemGetInfo free %zu above the quota %zu", free0, quota);
  std::vector<CUmemGenericAllocationHandle> handles;
  CUresult r = CUDA_SUCCESS;
  for (size_t i = 0; i < quota / gran + 4; ++i) {
    CUmemGenericAllocationHandle h = 0;
    r = g_cu.create(&h, gran, &prop, 0);
    if (r != CUDA_SUCCESS) break;
    handles.push_back(h);
    if (handles.size() == 1)
      EXPECT(FreeMemory() == free0 - gran, "free %zu after one chunk, want %zu", FreeMemory(),
             free0 - gran);
  }
  printf("quota.chunks=%zu\n", handles.size());
  EXPECT(r == CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate over the quota returned %d (%s), want %d",
         static_cast<int>(r), e2e::CuName(r), static_cast<int>(CUDA_ERROR_OUT_OF_MEMORY));
  EXPECT(handles.size() == free0 / gran, "%zu chunks of %zu fit, want %zu", handles.size(), gran,
         free0 / gran);
  CK(cudaGetLastError());  // not sticky

  e2e::Step("quota: refunded when released and unmapped");
  CUdeviceptr va = 0;
  CU(g_cu.reserve(&va, gran, 0, 0, 0));
  CU(g_cu.map(va, gran, 0, handles[0], 0));
  for (CUmemGenericAllocationHandle h : handles) CU(g_cu.release(h));
  // handles[0] is released but still mapped: its memory is still in use.
  EXPECT(FreeMemory() == free0 - gran, "free %zu with one released chunk still mapped, want %zu",
         FreeMemory(), free0 - gran);
  CU(g_cu.unmap(va, gran));
  EXPECT(FreeMemory() == free0, "free %zu after the last unmap, want %zu", FreeMemory(), free0);
  CU(g_cu.address_free(va, gran));
  CUmemGenericAllocationHandle h = 0;
  CU(g_cu.create(&h, gran, &prop, 0));  // room again
  CU(g_cu.release(h));
  printf("quota=ok\n");
}

}  // namespace

// Sends `fd` over the Unix socket `sock` (SCM_RIGHTS), as apps pass shareable handles.
void SendFd(int sock, int fd) {
  char byte = 'h';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int));
  EXPECT(sendmsg(sock, &msg, 0) == 1, "sendmsg: %s", strerror(errno));
}

int ReceiveFd(int sock) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  EXPECT(recvmsg(sock, &msg, 0) == 1, "recvmsg: %s", strerror(errno));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  EXPECT(c != nullptr && c->cmsg_type == SCM_RIGHTS, "no descriptor arrived");
  int fd = -1;
  memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return fd;
}

CUmemAllocationProp ShareableProp() {
  CUmemAllocationProp prop = DeviceProp();
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Maps handle `h` read-write at a new reservation of `size` bytes.
CUdeviceptr MapNew(CUmemGenericAllocationHandle h, size_t size) {
  CUdeviceptr va = 0;
  CU(g_cu.reserve(&va, size, 0, 0, 0));
  CU(g_cu.map(va, size, 0, h, 0));
  SetReadWrite(va, size);
  return va;
}

void Unmap(CUdeviceptr va, size_t size) {
  CU(g_cu.unmap(va, size));
  CU(g_cu.address_free(va, size));
}

int ImportChild(int sock, bool flyt) {
  e2e::Step("import in the child");
  const CUmemAllocationProp prop = ShareableProp();
  size_t gran = 0;
  CU(g_cu.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const int fd = ReceiveFd(sock);
  CUmemGenericAllocationHandle h = 0;
  CU(g_cu.import_handle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  const CUdeviceptr va = MapNew(h, gran);
  std::vector<unsigned char> want(gran), got(gran);
  e2e::Fill(want.data(), gran, 91);
  CK(cudaMemcpy(got.data(), reinterpret_cast<void*>(va), gran, cudaMemcpyDeviceToHost));
  long long diff = e2e::FirstDiff(want.data(), got.data(), gran);
  EXPECT(diff < 0, "the child reads the parent's bytes: byte %lld differs", diff);
  e2e::Fill(want.data(), gran, 92);
  CK(cudaMemcpy(reinterpret_cast<void*>(va), want.data(), gran, cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize());
  Unmap(va, gran);
  CU(g_cu.release(h));
  if (flyt) {
    e2e::Step("a descriptor that is no shareable handle");
    int p[2];
    EXPECT(pipe(p) == 0, "pipe");
    CUmemGenericAllocationHandle bad = 0;
    EXPECT_CU(g_cu.import_handle(&bad, reinterpret_cast<void*>(static_cast<uintptr_t>(p[0])),
                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
              CUDA_ERROR_INVALID_VALUE);
    close(p[0]);
    close(p[1]);
  }
  char ok = 'k';
  EXPECT(write(sock, &ok, 1) == 1, "write");
  printf("import=ok\n");
  e2e::Pass();
  return 0;
}

int ShareWithChild(const char* self) {
  e2e::Step("export for a child process");
  const CUmemAllocationProp prop = ShareableProp();
  size_t gran = 0;
  CU(g_cu.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h = 0;
  CU(g_cu.create(&h, gran, &prop, 0));
  const CUdeviceptr va = MapNew(h, gran);
  std::vector<unsigned char> bytes(gran), got(gran);
  e2e::Fill(bytes.data(), gran, 91);
  CK(cudaMemcpy(reinterpret_cast<void*>(va), bytes.data(), gran, cudaMemcpyHostToDevice));
  int fd = -1;
  CU(g_cu.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  EXPECT(fd >= 0, "exported descriptor %d", fd);
  int sv[2];
  EXPECT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
  pid_t pid = fork();
  if (pid == 0) {  // a new process, as the app's own helper would be
    close(sv[0]);
    char arg[16];
    snprintf(arg, sizeof(arg), "%d", sv[1]);
    execl(self, self, "import", arg, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(sv[1]);
  SendFd(sv[0], fd);
  close(fd);  // the child has its own now
  char ok = 0;
  EXPECT(read(sv[0], &ok, 1) == 1 && ok == 'k', "the child did not finish its part");
  int status = 0;
  EXPECT(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
         "the child failed (status %d)", status);
  close(sv[0]);
  e2e::Step("the parent sees the child's bytes");
  e2e::Fill(bytes.data(), gran, 92);
  CK(cudaMemcpy(got.data(), reinterpret_cast<void*>(va), gran, cudaMemcpyDeviceToHost));
  long long diff = e2e::FirstDiff(bytes.data(), got.data(), gran);
  EXPECT(diff < 0, "byte %lld of the child's write differs", diff);
  Unmap(va, gran);
  CU(g_cu.release(h));
  printf("share=ok\n");
  e2e::Pass();
  return 0;
}

int main(int argc, char** argv) {
  e2e::Init("vmm");
  const std::string mode = argc > 1 ? argv[1] : "";

  e2e::Step("initialise the runtime and resolve the driver's VMM calls");
  CK(cudaFree(nullptr));
  e2e::ResolveVmm();
  int vmm_supported = 0;
  CU(g_cu.attribute(&vmm_supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  EXPECT(vmm_supported == 1, "VirtualMemoryManagementSupported is %d", vmm_supported);

  if (mode == "share") return ShareWithChild(argv[0]);
  if (mode == "import") {
    EXPECT(argc == 3, "usage: vmm import SOCKET");
    return ImportChild(atoi(argv[2]), e2e::UnderFlyt());
  }
  if (mode == "foreign") {
    e2e::Step("another session's handle and range are not this one's");
    EXPECT(argc == 4, "usage: vmm foreign HANDLE ADDRESS");
    const CUmemGenericAllocationHandle h = strtoull(argv[2], nullptr, 10);
    const CUdeviceptr at = strtoull(argv[3], nullptr, 10);
    const CUmemAllocationProp prop = DeviceProp();
    size_t gran = 0;
    CU(g_cu.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemAllocationProp p2;
    CUmemGenericAllocationHandle got = 0;
    unsigned long long flags = 0;
    CUmemLocation loc;
    memset(&loc, 0, sizeof(loc));
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemAccessDesc desc;
    memset(&desc, 0, sizeof(desc));
    desc.location = loc;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    EXPECT_CU(g_cu.properties(&p2, h), CUDA_ERROR_INVALID_VALUE);
    EXPECT_CU(g_cu.retain(&got, reinterpret_cast<void*>(at)), CUDA_ERROR_INVALID_VALUE);
    EXPECT_CU(g_cu.get_access(&flags, &loc, at), CUDA_ERROR_INVALID_VALUE);
    EXPECT_CU(g_cu.set_access(at, gran, &desc, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_CU(g_cu.map(at + gran, gran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_CU(g_cu.unmap(at, gran), CUDA_ERROR_INVALID_VALUE);
    EXPECT_CU(g_cu.address_free(at, 3 * gran), CUDA_ERROR_INVALID_VALUE);
    EXPECT_CU(g_cu.release(h), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr mine = 0;  // a mapping of its own over there fails too
    CU(g_cu.reserve(&mine, gran, 0, 0, 0));
    EXPECT_CU(g_cu.map(mine, gran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    CU(g_cu.address_free(mine, gran));
    CK(cudaDeviceSynchronize());
    printf("foreign=ok\n");
    e2e::Pass();
    return 0;
  }

  e2e::Step("granularity");
  const CUmemAllocationProp prop = DeviceProp();
  size_t gran = 0, recommended = 0;
  CU(g_cu.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CU(g_cu.granularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  printf("granularity=%zu\nrecommended=%zu\n", gran, recommended);
  EXPECT(gran > 0 && recommended >= gran && recommended % gran == 0,
         "granularity %zu, recommended %zu", gran, recommended);

  e2e::Step("reserve 3 x granularity");
  CUdeviceptr va = 0;
  CU(g_cu.reserve(&va, 3 * gran, 0, 0, 0));
  EXPECT(va != 0 && va % gran == 0, "reservation at 0x%llx is not aligned to %zu",
         static_cast<unsigned long long>(va), gran);

  e2e::Step("create two chunks, map them at 0 and 2 x granularity");
  CUmemGenericAllocationHandle a = 0, b = 0;
  CU(g_cu.create(&a, gran, &prop, 0));
  CU(g_cu.create(&b, gran, &prop, 0));
  EXPECT(a != b, "two allocations with one handle 0x%llx", static_cast<unsigned long long>(a));
  CU(g_cu.map(va, gran, 0, a, 0));
  CU(g_cu.map(va + 2 * gran, gran, 0, b, 0));
  EXPECT_CU(g_cu.map(va, gran, 0, b, 0), CUDA_ERROR_INVALID_VALUE);  // overlaps chunk a

  e2e::Step("access");
  CUmemLocation loc;
  memset(&loc, 0, sizeof(loc));
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = 0;
  unsigned long long flags = 99;
  CU(g_cu.get_access(&flags, &loc, va));
  EXPECT(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE, "access before cuMemSetAccess is %llu", flags);
  SetReadWrite(va, gran);
  SetReadWrite(va + 2 * gran, gran);
  CU(g_cu.get_access(&flags, &loc, va + 5));
  EXPECT(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "access of chunk a is %llu", flags);
  CU(g_cu.get_access(&flags, &loc, va + 3 * gran - 1));
  EXPECT(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "access of chunk b is %llu", flags);
  EXPECT_CU(g_cu.get_access(&flags, &loc, va + gran), CUDA_ERROR_INVALID_VALUE);  // the hole
  printf("access=readwrite\n");

  if (mode == "leak") {
    e2e::Step("leave without freeing");
    RoundTrip(va, 4096, 1, "a write before leaving");
    printf("leaving\n");
    e2e::Pass();
    return 0;
  }
  if (mode == "hold") {
    e2e::Step("hold the mappings until killed");
    printf("held.handle=%llu\nheld.va=%llu\nholding\n", static_cast<unsigned long long>(a),
           static_cast<unsigned long long>(va));
    for (;;) pause();  // the watchdog ends it if the test does not
  }

  e2e::Step("copies into both chunks");
  RoundTrip(va, gran, 11, "chunk a, whole");
  RoundTrip(va + 2 * gran, gran, 12, "chunk b, whole");
  RoundTrip(va + 7, 1000, 13, "chunk a, unaligned");
  RoundTrip(va + 3 * gran - 333, 333, 14, "chunk b, its last bytes");

  e2e::Step("memset");
  CK(cudaMemset(reinterpret_cast<void*>(va + 100), 0x5a, 5000));
  CK(cudaMemset(reinterpret_cast<void*>(va + 2 * gran), 0xa5, gran));
  std::vector<unsigned char> got(3 * gran);
  CK(cudaMemcpy(got.data(), reinterpret_cast<void*>(va + 100), 5000, cudaMemcpyDeviceToHost));
  EXPECT(e2e::FirstNot(got.data(), 0x5a, 5000) < 0, "memset of chunk a");
  CK(cudaMemcpy(got.data(), reinterpret_cast<void*>(va + 2 * gran), gran, cudaMemcpyDeviceToHost));
  EXPECT(e2e::FirstNot(got.data(), 0xa5, gran) < 0, "memset of chunk b");

  e2e::Step("device copy from cudaMalloc memory");
  const size_t n = 64 << 10;
  std::vector<unsigned char> src(n);
  e2e::Fill(src.data(), n, 21);
  unsigned char* plain = nullptr;
  CK(cudaMalloc(reinterpret_cast<void**>(&plain), n));
  CK(cudaMemcpy(plain, src.data(), n, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(reinterpret_cast<void*>(va + 2 * gran + 64), plain, n, cudaMemcpyDeviceToDevice));
  CK(cudaMemcpy(reinterpret_cast<void*>(va + 4096), plain, n, cudaMemcpyDefault));
  CK(cudaMemcpy(got.data(), reinterpret_cast<void*>(va + 2 * gran + 64), n,
                cudaMemcpyDeviceToHost));
  EXPECT_SAME(got.data(), src.data(), n, "device copy into chunk b");
  CK(cudaMemcpy(got.data(), reinterpret_cast<void*>(va + 4096), n, cudaMemcpyDefault));
  EXPECT_SAME(got.data(), src.data(), n, "unified copy into chunk a");
  CK(cudaFree(plain));

  e2e::Step("the hole is not memory");
  cudaError_t hole =
      cudaMemcpy(reinterpret_cast<void*>(va + gran), src.data(), 64, cudaMemcpyHostToDevice);
  printf("copy_into_hole=%s\n", cudaGetErrorName(hole));
  EXPECT(hole != cudaSuccess, "a copy into the unmapped middle of the reservation worked");
  cudaGetLastError();
  CK(cudaDeviceSynchronize());
  CU(g_cu.unmap(va + gran, gran));  // a hole: nothing to do, and the driver says so

  e2e::Step("pointer attributes");
  cudaPointerAttributes attr;
  memset(&attr, 0, sizeof(attr));
  CK(cudaPointerGetAttributes(&attr, reinterpret_cast<void*>(va + 2 * gran + 17)));
  printf("pointer_type=%d\n", static_cast<int>(attr.type));
  EXPECT(attr.type == cudaMemoryTypeDevice, "mapped memory reports type %d", attr.type);
  EXPECT(attr.device == 0, "mapped memory on device %d", attr.device);
  EXPECT(attr.devicePointer == reinterpret_cast<void*>(va + 2 * gran + 17), "device pointer %p",
         attr.devicePointer);

  e2e::Step("retain the handle of a mapped address");
  CUmemGenericAllocationHandle again = 0;
  CU(g_cu.retain(&again, reinterpret_cast<void*>(va + 2 * gran + 12345)));
  EXPECT(again == b, "cuMemRetainAllocationHandle gave 0x%llx, want 0x%llx",
         static_cast<unsigned long long>(again), static_cast<unsigned long long>(b));
  CU(g_cu.release(again));  // the extra reference
  EXPECT_CU(g_cu.retain(&again, reinterpret_cast<void*>(va + gran + 1)),
            CUDA_ERROR_INVALID_VALUE);  // the hole

  e2e::Step("grow in place: a third chunk fills the hole");
  CUmemGenericAllocationHandle c = 0;
  CU(g_cu.create(&c, gran, &prop, 0));
  CU(g_cu.map(va + gran, gran, 0, c, 0));
  SetReadWrite(va, 3 * gran);  // one call over all three mappings
  RoundTrip(va + gran / 2, 2 * gran, 31, "one copy across the three chunks");
  RoundTrip(va, 3 * gran, 32, "the whole segment");
  CK(cudaMemset(reinterpret_cast<void*>(va + gran - 8), 0x77, gran + 16));
  CK(cudaMemcpy(got.data(), reinterpret_cast<void*>(va + gran - 8), gran + 16,
                cudaMemcpyDeviceToHost));
  EXPECT(e2e::FirstNot(got.data(), 0x77, gran + 16) < 0, "memset across chunk boundaries");

  e2e::Step("properties");
  CUmemAllocationProp back;
  memset(&back, 0xff, sizeof(back));
  CU(g_cu.properties(&back, a));
  printf("prop.type=%d\nprop.location=%d/%d\n", static_cast<int>(back.type),
         static_cast<int>(back.location.type), back.location.id);
  EXPECT(back.type == CU_MEM_ALLOCATION_TYPE_PINNED, "type %d", static_cast<int>(back.type));
  EXPECT(back.location.type == CU_MEM_LOCATION_TYPE_DEVICE && back.location.id == 0,
         "location %d/%d", static_cast<int>(back.location.type), back.location.id);

  e2e::Step("unmap, release, free");
  EXPECT_CU(g_cu.address_free(va, 3 * gran), CUDA_ERROR_INVALID_VALUE);  // still mapped
  CU(g_cu.unmap(va + gran, 2 * gran));                                   // two mappings in one call
  CU(g_cu.release(b));
  CU(g_cu.release(c));
  CU(g_cu.release(a));  // still mapped: the memory stays, the driver still knows the handle
  CU(g_cu.properties(&back, a));
  RoundTrip(va + 99, 99, 51, "released but still mapped");
  CU(g_cu.unmap(va, gran));
  CU(g_cu.address_free(va, 3 * gran));
  CK(cudaDeviceSynchronize());  // the asynchronous tear-downs' errors would show here

  const bool flyt = e2e::UnderFlyt();
  printf("under_flyt=%d\n", flyt ? 1 : 0);
  if (flyt) {
    e2e::Step("misuse fails cleanly (Flyt)");
    EXPECT_CU(g_cu.release(a), CUDA_ERROR_INVALID_VALUE);  // released twice
    EXPECT_CU(g_cu.release(0x7777123456ull), CUDA_ERROR_INVALID_VALUE);
    CUmemAllocationProp p2;
    EXPECT_CU(g_cu.properties(&p2, 0x7777123456ull), CUDA_ERROR_INVALID_VALUE);
    EXPECT_CU(g_cu.map(va, gran, 0, b, 0), CUDA_ERROR_INVALID_VALUE);  // released, freed
    EXPECT_CU(g_cu.unmap(va, gran), CUDA_ERROR_INVALID_VALUE);
    EXPECT_CU(g_cu.address_free(va, 3 * gran), CUDA_ERROR_INVALID_VALUE);
    int fd = -1;
    EXPECT_CU(g_cu.export_handle(&fd, a, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_ERROR_INVALID_VALUE);  // released: no longer a handle
    for (int i = 0; i < 2; ++i)  // fabric handles are not served; logged once by the client
      EXPECT_CU(g_cu.export_handle(&fd, a, CU_MEM_HANDLE_TYPE_FABRIC, 0), CUDA_ERROR_NOT_SUPPORTED);
    CK(cudaGetLastError());
    printf("misuse=ok\n");
  }

  e2e::Step("the session still works");
  CUdeviceptr va2 = 0;
  CUmemGenericAllocationHandle d = 0;
  CU(g_cu.reserve(&va2, gran, 0, 0, 0));
  CU(g_cu.create(&d, gran, &prop, 0));
  CU(g_cu.map(va2, gran, 0, d, 0));
  SetReadWrite(va2, gran);
  RoundTrip(va2, 4096, 41, "a new mapping after the misuse");
  CU(g_cu.unmap(va2, gran));
  CU(g_cu.release(d));
  CU(g_cu.address_free(va2, gran));
  CK(cudaDeviceSynchronize());

  if (mode == "quota") {
    const char* env = getenv("VMM_QUOTA_BYTES");
    EXPECT(env != nullptr, "vmm quota needs VMM_QUOTA_BYTES");
    Quota(strtoull(env, nullptr, 10), gran);
  }
  e2e::Pass();
  return 0;
}
