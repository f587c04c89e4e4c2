// Tests for several devices of one server: the sim backend's devices
// (--sim-devices N: identities, address ranges, memory accounting, contexts,
// peer access with the driver's errors, P2P attributes, peer copies) and the
// tenant's memory quota, which holds per device (server/share.h).
//
// Owns: nothing but these tests.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "server/driver_api.h"
#include "server/share.h"

namespace flyt::server {
namespace {

class SimDevices : public ::testing::Test {
 protected:
  void SetUp() override {
    SimOptions options;
    options.devices = 2;
    options.memory_bytes = 64ull << 20;
    ASSERT_TRUE(LoadSimDriver(options, &api_).ok());
    ASSERT_EQ(api_.cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx_[0], 0), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx_[1], 1), CUDA_SUCCESS);
  }
  void TearDown() override { api_.cuCtxSetCurrent(nullptr); }
  DriverApi api_;
  CUcontext ctx_[2] = {nullptr, nullptr};
};

TEST_F(SimDevices, TwoDevicesWithTheirOwnIdentity) {
  int n = 0;
  ASSERT_EQ(api_.cuDeviceGetCount(&n), CUDA_SUCCESS);
  EXPECT_EQ(n, 2);
  CUdevice d = -1;
  EXPECT_EQ(api_.cuDeviceGet(&d, 1), CUDA_SUCCESS);
  EXPECT_EQ(d, 1);
  EXPECT_EQ(api_.cuDeviceGet(&d, 2), CUDA_ERROR_INVALID_DEVICE);
  CUuuid u0{}, u1{};
  ASSERT_EQ(api_.cuDeviceGetUuid_v2(&u0, 0), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuDeviceGetUuid_v2(&u1, 1), CUDA_SUCCESS);
  EXPECT_NE(std::memcmp(u0.bytes, u1.bytes, 16), 0);
  EXPECT_EQ(static_cast<unsigned char>(u0.bytes[0]), 0xf0);  // device 0 as with one device
  int bus0 = 0, bus1 = 0;
  ASSERT_EQ(api_.cuDeviceGetAttribute(&bus0, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuDeviceGetAttribute(&bus1, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1), CUDA_SUCCESS);
  EXPECT_EQ(bus0, 0x19);
  EXPECT_NE(bus0, bus1);
  EXPECT_EQ(api_.cuDeviceGetAttribute(&bus0, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 2),
            CUDA_ERROR_INVALID_DEVICE);
  EXPECT_NE(ctx_[0], ctx_[1]);
}

TEST_F(SimDevices, ContextsMemoryAndAccountingPerDevice) {
  CUdeviceptr p[2] = {0, 0};
  size_t free_before[2] = {0, 0}, total = 0;
  for (int d = 0; d < 2; ++d) {
    ASSERT_EQ(api_.cuCtxSetCurrent(ctx_[d]), CUDA_SUCCESS);
    CUdevice cur = -1;
    ASSERT_EQ(api_.cuCtxGetDevice(&cur), CUDA_SUCCESS);
    EXPECT_EQ(cur, d);
    ASSERT_EQ(api_.cuMemGetInfo_v2(&free_before[d], &total), CUDA_SUCCESS);
  }
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_[1]), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemAlloc_v2(&p[1], 8 << 20), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_[0]), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemAlloc_v2(&p[0], 4 << 20), CUDA_SUCCESS);
  // Each device's range of its own: device 1's addresses lie 1 TiB further.
  EXPECT_GE(p[1] - p[0], 1ull << 39);
  size_t free_now = 0;
  ASSERT_EQ(api_.cuMemGetInfo_v2(&free_now, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_before[0] - free_now, 4u << 20);
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_[1]), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemGetInfo_v2(&free_now, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_before[1] - free_now, 8u << 20);
  // Device 1 is full at 64 MiB while device 0 still has room.
  CUdeviceptr big = 0;
  EXPECT_EQ(api_.cuMemAlloc_v2(&big, 60 << 20), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_[0]), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemAlloc_v2(&big, 56 << 20), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(big), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(p[1]), CUDA_SUCCESS);  // freed from device 0's context
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_[1]), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemGetInfo_v2(&free_now, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_now, free_before[1]);
  EXPECT_EQ(api_.cuMemFree_v2(p[0]), CUDA_SUCCESS);
  // A stream belongs to the device of the context it was made in.
  CUstream s = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&s, 0), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_[0]), CUDA_SUCCESS);
  CUdevice sd = -1;
  ASSERT_EQ(api_.cuStreamGetDevice(s, &sd), CUDA_SUCCESS);
  EXPECT_EQ(sd, 1);
  EXPECT_EQ(api_.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

TEST_F(SimDevices, PeerAccessWithTheDriversErrors) {
  int can = -1;
  ASSERT_EQ(api_.cuDeviceCanAccessPeer(&can, 0, 1), CUDA_SUCCESS);
  EXPECT_EQ(can, 1);
  ASSERT_EQ(api_.cuDeviceCanAccessPeer(&can, 1, 1), CUDA_SUCCESS);
  EXPECT_EQ(can, 0);  // a device is not its own peer
  EXPECT_EQ(api_.cuDeviceCanAccessPeer(&can, 0, 2), CUDA_ERROR_INVALID_DEVICE);
  int v = -1;
  ASSERT_EQ(api_.cuDeviceGetP2PAttribute(&v, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 1, 0),
            CUDA_SUCCESS);
  EXPECT_EQ(v, 1);
  EXPECT_EQ(api_.cuDeviceGetP2PAttribute(&v, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 1, 1),
            CUDA_ERROR_INVALID_DEVICE);

  EXPECT_EQ(api_.cuCtxEnablePeerAccess(ctx_[1], 0), CUDA_ERROR_INVALID_CONTEXT);  // none current
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_[0]), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuCtxDisablePeerAccess(ctx_[1]), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  EXPECT_EQ(api_.cuCtxEnablePeerAccess(ctx_[1], 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuCtxEnablePeerAccess(ctx_[0], 0), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(api_.cuCtxEnablePeerAccess(ctx_[1], 0), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuCtxEnablePeerAccess(ctx_[1], 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_[1]), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuCtxEnablePeerAccess(ctx_[0], 0), CUDA_SUCCESS);  // the other direction
  EXPECT_EQ(api_.cuCtxDisablePeerAccess(ctx_[0]), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_[0]), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuCtxDisablePeerAccess(ctx_[1]), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuCtxDisablePeerAccess(ctx_[1]), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
}

// VMM memory of any device, counted on it (a client of several servers has a
// two-GPU server place its memory with cuMemCreate/cuMemMap, server/session_movable.cc).
TEST_F(SimDevices, VmmMemoryOfEachDevice) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 1;
  size_t gran = 0;
  ASSERT_EQ(api_.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  size_t free_before = 0, free_now = 0, total = 0;
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_[1]), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemGetInfo_v2(&free_before, &total), CUDA_SUCCESS);
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(api_.cuMemCreate(&h, gran, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(api_.cuMemAddressReserve(&va, gran, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemMap(va, gran, 0, h, 0), CUDA_SUCCESS);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(api_.cuMemSetAccess(va, gran, &access, 1), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemGetInfo_v2(&free_now, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_before - free_now, gran);
  const uint32_t word = 0x1234abcd;
  uint32_t back = 0;
  ASSERT_EQ(api_.cuMemcpyHtoD_v2(va, &word, sizeof(word)), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemcpyDtoH_v2(&back, va, sizeof(back)), CUDA_SUCCESS);
  EXPECT_EQ(back, word);
  EXPECT_EQ(api_.cuMemUnmap(va, gran), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemAddressFree(va, gran), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemGetInfo_v2(&free_now, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_now, free_before);
  prop.location.id = 2;  // past the last device
  EXPECT_EQ(api_.cuMemCreate(&h, gran, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(SimDevices, PeerCopies) {
  CUdeviceptr p[2] = {0, 0};
  for (int d = 0; d < 2; ++d) {
    ASSERT_EQ(api_.cuCtxSetCurrent(ctx_[d]), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemAlloc_v2(&p[d], 4099), CUDA_SUCCESS);
  }
  std::vector<unsigned char> in(4099), out(4099, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 7 + 1);
  ASSERT_EQ(api_.cuMemcpyHtoD_v2(p[0], in.data(), in.size()), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemcpyPeer(p[1], ctx_[1], p[0], ctx_[0], in.size()), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemcpyDtoH_v2(out.data(), p[1], out.size()), CUDA_SUCCESS);
  EXPECT_EQ(in, out);
  ASSERT_EQ(api_.cuMemcpyPeerAsync(p[0] + 1, ctx_[0], p[1] + 2, ctx_[1], 4096, nullptr),
            CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemcpyDtoH_v2(out.data(), p[0] + 1, 4096), CUDA_SUCCESS);
  EXPECT_EQ(std::memcmp(out.data(), in.data() + 2, 4096), 0);
  EXPECT_EQ(api_.cuMemcpyPeer(p[1], ctx_[1], p[0], ctx_[0], 4100), CUDA_ERROR_INVALID_VALUE);
  for (CUdeviceptr q : p) EXPECT_EQ(api_.cuMemFree_v2(q), CUDA_SUCCESS);
}

TEST(SimNoPeer, EnablingIsUnsupported) {
  DriverApi api;
  SimOptions options;
  options.devices = 2;
  options.peer = false;
  ASSERT_TRUE(LoadSimDriver(options, &api).ok());
  CUcontext c0 = nullptr, c1 = nullptr;
  ASSERT_EQ(api.cuDevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
  ASSERT_EQ(api.cuDevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
  int can = -1;
  ASSERT_EQ(api.cuDeviceCanAccessPeer(&can, 0, 1), CUDA_SUCCESS);
  EXPECT_EQ(can, 0);
  ASSERT_EQ(api.cuCtxSetCurrent(c0), CUDA_SUCCESS);
  EXPECT_EQ(api.cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
  api.cuCtxSetCurrent(nullptr);
}

TEST(SimOneDevice, TheDefaultIsOneDevice) {
  DriverApi api;
  ASSERT_TRUE(LoadSimDriver(SimOptions{}, &api).ok());
  int n = 0;
  ASSERT_EQ(api.cuDeviceGetCount(&n), CUDA_SUCCESS);
  EXPECT_EQ(n, 1);
  CUcontext c = nullptr;
  EXPECT_EQ(api.cuDevicePrimaryCtxRetain(&c, 1), CUDA_ERROR_INVALID_DEVICE);
  int can = -1;
  EXPECT_EQ(api.cuDeviceCanAccessPeer(&can, 0, 1), CUDA_ERROR_INVALID_DEVICE);
}

// The quota holds per device: a full device 0 leaves device 1 its own quota.
TEST(ShareQuota, PerDevice) {
  Share share;
  std::vector<ops::DeviceInfo> devices(2);
  ShareOptions options;
  options.memory_quota = 100;
  options.probe = false;
  ASSERT_TRUE(share.Init(nullptr, devices, options).ok());
  EXPECT_TRUE(share.Charge(0, 80));
  EXPECT_FALSE(share.Charge(0, 30));
  EXPECT_TRUE(share.Charge(1, 100));
  EXPECT_FALSE(share.Charge(1, 1));
  EXPECT_EQ(share.memory_used(), 180u);
  EXPECT_EQ(share.memory_used(0), 80u);
  EXPECT_EQ(share.memory_used(1), 100u);
  size_t free_bytes = 1000, total = 1000;
  share.ClampMemInfo(0, &free_bytes, &total);
  EXPECT_EQ(free_bytes, 20u);
  EXPECT_EQ(total, 100u);
  free_bytes = 1000;
  share.ClampMemInfo(1, &free_bytes, &total);
  EXPECT_EQ(free_bytes, 0u);
  share.Refund(1, 60);
  EXPECT_TRUE(share.Charge(1, 50));
  share.Refund(0, 500);  // more than charged: down to 0, never below
  EXPECT_EQ(share.memory_used(0), 0u);
  EXPECT_EQ(share.memory_used(), 90u);
}

}  // namespace
}  // namespace flyt::server
