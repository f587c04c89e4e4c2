// ParallelCopy (client/parallel_copy.h): byte-exact at odd sizes and unaligned
// addresses, with 1..8 threads, from several callers at once (one gets the helpers, the
// others copy alone), and in a child after fork() (no helpers there).
#include "client/parallel_copy.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "byte_pattern.h"

namespace flyt::client {
namespace {

using test_support::Pattern;

void CheckOne(size_t n, size_t src_off, size_t dst_off, unsigned threads, uint32_t seed) {
  std::vector<uint8_t> src = Pattern(n + src_off, seed);
  std::vector<uint8_t> dst(n + dst_off + 64, 0xee);
  ParallelCopy(dst.data() + dst_off, src.data() + src_off, n, threads);
  ASSERT_EQ(std::memcmp(dst.data() + dst_off, src.data() + src_off, n), 0)
      << n << " bytes, " << threads << " threads";
  for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0xee) << "before, at " << i;
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(dst[dst_off + n + i], 0xee) << "after, at " << i;
}

TEST(ParallelCopy, SizesOffsetsThreads) {
  const size_t sizes[] = {
      0,      1, 4095, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, (512 << 10) * 5 + 7, (4 << 20) + 3,
      9 << 20};
  for (unsigned threads : {1u, 2u, 3u, 8u, 20u})
    for (size_t n : sizes)
      for (size_t off : {size_t{0}, size_t{3}})
        CheckOne(n, off, (off * 7) % 64, threads, static_cast<uint32_t>(n + threads));
}

TEST(ParallelCopy, ManyCopiesInARow) {
  // Back to back, as chunks of one staged copy are: each hand-off to the helpers.
  for (int i = 0; i < 200; ++i) CheckOne((1 << 20) + static_cast<size_t>(i) * 4099, i % 5, 0, 2, i);
}

TEST(ParallelCopy, ConcurrentCallers) {
  std::vector<std::thread> callers;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([t, &bad] {
      for (int i = 0; i < 20; ++i) {
        const size_t n = (3 << 20) + static_cast<size_t>(t * 1000 + i);
        std::vector<uint8_t> src = Pattern(n, static_cast<uint32_t>(t * 100 + i));
        std::vector<uint8_t> dst(n, 0);
        ParallelCopy(dst.data(), src.data(), n, 3);
        if (dst != src) bad[t] = 1;
      }
    });
  }
  for (auto& c : callers) c.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0) << "caller " << t;
}

TEST(ParallelCopy, ChildAfterFork) {
  CheckOne(5 << 20, 1, 2, 2, 9);  // the parent's helpers exist now
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::vector<uint8_t> src = Pattern(5 << 20, 11);
    std::vector<uint8_t> dst(src.size(), 0);
    ParallelCopy(dst.data(), src.data(), src.size(), 4);
    _exit(dst == src ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace flyt::client
