// Tests for the shared-memory ring and its segments: records of every size
// through small rings, many lanes at once, the futex sleep/wake path, close,
// a hostile peer's header values, and real cross-process use (fork).
// No tight timing assertions: CI has two noisy cores.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transport/shm_ring.h"
#include "transport/shm_segment.h"

namespace flyt::transport {
namespace {

constexpr int kLongMs = 30000;  // "forever" for a healthy test, but no hang if broken

// Byte i of the message identified by seed.
uint8_t PatternByte(uint64_t seed, uint64_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + i;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x);
}

std::vector<uint8_t> Pattern(uint64_t seed, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = PatternByte(seed, i);
  return v;
}

bool Contains(const Status& st, const std::string& text) {
  return st.message().find(text) != std::string::npos;
}

// 64-byte aligned heap memory for a ring.
struct Mem {
  explicit Mem(size_t n) : size(n) {
    p = static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64));
    std::memset(p, 0, n);
  }
  ~Mem() { std::free(p); }
  uint8_t* p;
  size_t size;
};

// A ring's creator (the consumer here) and an attached producer on one memory.
struct Pair {
  Pair(size_t capacity, ShmRingOptions options = {}) : mem(ShmRing::BytesFor(capacity)) {
    Status st = ShmRing::Create(mem.p, mem.size, capacity, options, &reader);
    EXPECT_TRUE(st.ok()) << st.message();
    st = ShmRing::Attach(mem.p, mem.size, options, &writer);
    EXPECT_TRUE(st.ok()) << st.message();
  }
  Mem mem;
  std::unique_ptr<ShmRing> reader, writer;
};

uint64_t* Head(uint8_t* mem) { return reinterpret_cast<uint64_t*>(mem + 64); }
uint64_t* Tail(uint8_t* mem) { return reinterpret_cast<uint64_t*>(mem + 128); }

// --- construction and attach validation

TEST(ShmRing, CreateValidatesArguments) {
  Mem mem(ShmRing::BytesFor(1024));
  std::unique_ptr<ShmRing> ring;
  EXPECT_FALSE(ShmRing::Create(mem.p, mem.size, 1000, {}, &ring).ok());         // not a power of 2
  EXPECT_FALSE(ShmRing::Create(mem.p, mem.size, 32, {}, &ring).ok());           // too small
  EXPECT_FALSE(ShmRing::Create(mem.p, mem.size, 2048, {}, &ring).ok());         // memory too small
  EXPECT_FALSE(ShmRing::Create(mem.p + 8, mem.size - 8, 512, {}, &ring).ok());  // misaligned
  EXPECT_FALSE(ShmRing::Create(nullptr, mem.size, 1024, {}, &ring).ok());
  Status st = ShmRing::Create(mem.p, mem.size, 1024, {}, &ring);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(ring->capacity(), 1024u);
}

TEST(ShmRing, AttachValidatesHeader) {
  Mem mem(ShmRing::BytesFor(1024));
  std::unique_ptr<ShmRing> ring;
  Status st = ShmRing::Attach(mem.p, mem.size, {}, &ring);  // all zero
  EXPECT_TRUE(Contains(st, "bad magic")) << st.message();

  ASSERT_TRUE(ShmRing::Create(mem.p, mem.size, 1024, {}, &ring).ok());
  auto* version = reinterpret_cast<uint32_t*>(mem.p + 4);
  auto* capacity = reinterpret_cast<uint64_t*>(mem.p + 8);
  *version = 99;
  EXPECT_TRUE(Contains(ShmRing::Attach(mem.p, mem.size, {}, &ring), "version"));
  *version = ShmRing::kVersion;
  *capacity = 1000;
  EXPECT_TRUE(Contains(ShmRing::Attach(mem.p, mem.size, {}, &ring), "capacity"));
  *capacity = 4096;  // larger than the memory
  EXPECT_TRUE(Contains(ShmRing::Attach(mem.p, mem.size, {}, &ring), "capacity"));
  *capacity = 1024;
  *Head(mem.p) = 5000;
  EXPECT_TRUE(Contains(ShmRing::Attach(mem.p, mem.size, {}, &ring), "peer corrupted the ring"));
  *Head(mem.p) = 0;
  st = ShmRing::Attach(mem.p, mem.size, {}, &ring);
  EXPECT_TRUE(st.ok()) << st.message();
}

// --- data paths

TEST(ShmRing, SizesFromZeroToEightTimesCapacity) {
  constexpr size_t kCap = 256;
  Pair pair(kCap);
  std::vector<size_t> sizes = {0,   1,   7,   8,   9,    63,           64,       247, 248, 249,
                               255, 256, 257, 511, 1000, kCap * 8 - 8, kCap * 8, 0,   3};
  std::thread producer([&] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<uint8_t> msg = Pattern(i, sizes[i]);
      Status st = pair.writer->Write(msg.data(), msg.size(), kLongMs);
      ASSERT_TRUE(st.ok()) << st.message();
    }
  });
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint8_t> got;
    Status st = pair.reader->Read(&got, kLongMs);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(got.size(), sizes[i]);
    EXPECT_EQ(got, Pattern(i, sizes[i])) << "message " << i;
  }
  producer.join();
}

TEST(ShmRing, WrapAroundManySmallRecords) {
  constexpr int kCount = 20000;
  Pair pair(64);
  std::thread producer([&] {
    for (int i = 0; i < kCount; ++i) {
      std::vector<uint8_t> msg = Pattern(i, i % 61);
      Status st = pair.writer->Write(msg.data(), msg.size(), kLongMs);
      ASSERT_TRUE(st.ok()) << st.message();
    }
  });
  for (int i = 0; i < kCount; ++i) {
    std::vector<uint8_t> got;
    Status st = pair.reader->Read(&got, kLongMs);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(got, Pattern(i, i % 61)) << "message " << i;
  }
  producer.join();
}

TEST(ShmRing, GatherWriteAndPiecewiseRead) {
  Pair pair(128);
  std::vector<uint8_t> msg = Pattern(7, 700);
  iovec iov[3] = {{msg.data(), 5}, {msg.data() + 5, 0}, {msg.data() + 5, 695}};
  std::thread producer([&] {
    Status st = pair.writer->Write(iov, 3, kLongMs);
    EXPECT_TRUE(st.ok()) << st.message();
  });
  uint64_t len = 0;
  Status st = pair.reader->BeginRead(&len, kLongMs);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(len, 700u);
  std::vector<uint8_t> got(700);
  size_t done = 0;
  for (size_t piece : {1, 99, 300, 300}) {
    st = pair.reader->ReadBody(got.data() + done, piece, kLongMs);
    ASSERT_TRUE(st.ok()) << st.message();
    done += piece;
  }
  EXPECT_EQ(got, msg);
  EXPECT_FALSE(pair.reader->ReadBody(got.data(), 1, kLongMs).ok());  // nothing left
  producer.join();
}

TEST(ShmRing, ManyLanesInParallel) {
  constexpr int kLanes = 4;
  constexpr size_t kCap = 1024;
  constexpr int kMessages = 600;
  std::vector<std::unique_ptr<Pair>> lanes;
  for (int l = 0; l < kLanes; ++l) lanes.push_back(std::make_unique<Pair>(kCap));
  auto size_of = [](int lane, int i) {
    std::mt19937_64 rng(lane * 1000003 + i);
    return static_cast<size_t>(rng() % (kCap * 8 + 1));
  };
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int l = 0; l < kLanes; ++l) {
    threads.emplace_back([&, l] {
      for (int i = 0; i < kMessages; ++i) {
        std::vector<uint8_t> msg = Pattern(l * 100000 + i, size_of(l, i));
        if (!lanes[l]->writer->Write(msg.data(), msg.size(), kLongMs).ok()) ++failures;
      }
    });
    threads.emplace_back([&, l] {
      for (int i = 0; i < kMessages; ++i) {
        std::vector<uint8_t> got;
        if (!lanes[l]->reader->Read(&got, kLongMs).ok() ||
            got != Pattern(l * 100000 + i, size_of(l, i))) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// The consumer gives space back lazily: small reads leave the shared tail alone until it
// waits, or until PublishConsumed; another object attached afterwards (a process that
// continues this side) starts after what was read.
TEST(ShmRing, ConsumerPublishesItsTailLazily) {
  Pair pair(4096);
  for (const char* m : {"one", "two", "three"}) ASSERT_TRUE(pair.writer->Write(m, 3, kLongMs).ok());
  std::vector<uint8_t> got;
  ASSERT_TRUE(pair.reader->Read(&got, kLongMs).ok());
  EXPECT_EQ(std::string(got.begin(), got.end()), "one");
  EXPECT_EQ(*Tail(pair.mem.p), 0u);  // 11 bytes read, not published yet
  ASSERT_TRUE(pair.reader->PublishConsumed().ok());
  EXPECT_EQ(*Tail(pair.mem.p), 11u);
  std::unique_ptr<ShmRing> next;
  ASSERT_TRUE(ShmRing::Attach(pair.mem.p, pair.mem.size, {}, &next).ok());
  ASSERT_TRUE(next->Read(&got, kLongMs).ok());
  EXPECT_EQ(std::string(got.begin(), got.end()), "two");
  // A reader that waits publishes first: a producer that needs the space gets it.
  std::vector<uint8_t> big(4096 - 8);
  std::thread producer([&] {
    Status st = pair.writer->Write(big.data(), big.size(), kLongMs);
    EXPECT_TRUE(st.ok()) << st.message();
  });
  ASSERT_TRUE(next->Read(&got, kLongMs).ok());  // "thr"
  ASSERT_TRUE(next->Read(&got, kLongMs).ok());
  producer.join();
  EXPECT_EQ(got.size(), big.size());
}

// --- waiting: futex sleep and wake, timeouts, close

TEST(ShmRing, ConsumerSleepsOnFutexAndIsWoken) {
  Pair pair(256);
  std::thread producer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    EXPECT_TRUE(pair.writer->Write("hello", 5, kLongMs).ok());
  });
  std::vector<uint8_t> got;
  Status st = pair.reader->Read(&got, kLongMs);
  producer.join();
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(std::string(got.begin(), got.end()), "hello");
  EXPECT_GT(pair.reader->sleeps(), 0u);
}

TEST(ShmRing, ProducerSleepsWhenFullAndIsWoken) {
  Pair pair(64);
  std::vector<uint8_t> big = Pattern(3, 64 * 4);
  std::thread producer([&] {
    Status st = pair.writer->Write(big.data(), big.size(), kLongMs);
    EXPECT_TRUE(st.ok()) << st.message();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the ring fills up
  std::vector<uint8_t> got;
  Status st = pair.reader->Read(&got, kLongMs);
  producer.join();
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(got, big);
  EXPECT_GT(pair.writer->sleeps(), 0u);
}

// Where futexes cannot be used (a PCI BAR mapped from sysfs, a peer in
// another kernel) both sides poll with bounded sleeps.
TEST(ShmRing, PollingWithoutFutexes) {
  ShmRingOptions options;
  options.use_futex = false;
  options.max_sleep_us = 200;
  Pair pair(64, options);
  std::vector<uint8_t> big = Pattern(11, 64 * 5);
  std::thread producer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    Status st = pair.writer->Write(big.data(), big.size(), kLongMs);
    EXPECT_TRUE(st.ok()) << st.message();
  });
  std::vector<uint8_t> got;
  Status st = pair.reader->Read(&got, kLongMs);
  producer.join();
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(got, big);
  EXPECT_GT(pair.reader->sleeps(), 0u);
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pair.writer->Close();
  });
  st = pair.reader->Read(&got, 0);
  closer.join();
  EXPECT_TRUE(Contains(st, "closed")) << st.message();
}

TEST(ShmRing, ReadAndWriteTimeOut) {
  Pair pair(64);
  std::vector<uint8_t> got;
  Status st = pair.reader->Read(&got, 50);
  EXPECT_TRUE(Contains(st, "timed out")) << st.message();
  // A timeout before anything was consumed leaves the ring usable.
  std::vector<uint8_t> fill(56);  // 8-byte header + 56 = the whole ring
  ASSERT_TRUE(pair.writer->Write(fill.data(), fill.size(), kLongMs).ok());
  st = pair.writer->Write("x", 1, 50);
  EXPECT_TRUE(Contains(st, "timed out")) << st.message();
  ASSERT_TRUE(pair.reader->Read(&got, kLongMs).ok());
  EXPECT_EQ(got.size(), 56u);
  EXPECT_TRUE(pair.writer->Write("y", 1, kLongMs).ok());
  ASSERT_TRUE(pair.reader->Read(&got, kLongMs).ok());
  EXPECT_EQ(got, std::vector<uint8_t>{'y'});
}

TEST(ShmRing, CloseWakesWaitingReader) {
  Pair pair(64);
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pair.writer->Close();
  });
  std::vector<uint8_t> got;
  Status st = pair.reader->Read(&got, 0);  // waits forever but for the close
  closer.join();
  EXPECT_TRUE(Contains(st, "closed")) << st.message();
  EXPECT_TRUE(pair.reader->closed());
}

TEST(ShmRing, CloseWakesWaitingWriter) {
  Pair pair(64);
  std::vector<uint8_t> big(1000);
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pair.reader->Close();
  });
  Status st = pair.writer->Write(big.data(), big.size(), 0);
  closer.join();
  EXPECT_TRUE(Contains(st, "closed")) << st.message();
  EXPECT_FALSE(pair.writer->Write("x", 1, kLongMs).ok());
}

TEST(ShmRing, ReaderDrainsWhatIsThereBeforeReportingClose) {
  Pair pair(256);
  ASSERT_TRUE(pair.writer->Write("last", 4, kLongMs).ok());
  pair.writer->Close();
  std::vector<uint8_t> got;
  ASSERT_TRUE(pair.reader->Read(&got, kLongMs).ok());
  EXPECT_EQ(std::string(got.begin(), got.end()), "last");
  EXPECT_TRUE(Contains(pair.reader->Read(&got, kLongMs), "closed"));
}

// --- a hostile peer

TEST(ShmRingHostile, HeadTooFarAheadOrBackwards) {
  Pair pair(64);
  std::vector<uint8_t> got;
  *Head(pair.mem.p) = 65;  // more than the capacity ahead of tail 0
  Status st = pair.reader->Read(&got, kLongMs);
  EXPECT_TRUE(Contains(st, "peer corrupted the ring")) << st.message();
  EXPECT_TRUE(pair.reader->closed());  // the writer is told too
  // The error sticks.
  EXPECT_TRUE(Contains(pair.reader->Read(&got, kLongMs), "peer corrupted the ring"));

  Pair pair2(64);
  ASSERT_TRUE(pair2.writer->Write("abcdefgh", 8, kLongMs).ok());
  ASSERT_TRUE(pair2.reader->Read(&got, kLongMs).ok());
  *Head(pair2.mem.p) = 3;  // behind the 16 bytes already consumed
  st = pair2.reader->Read(&got, kLongMs);
  EXPECT_TRUE(Contains(st, "peer corrupted the ring")) << st.message();
}

// The producer reads the tail only when the space it last saw is not enough; the
// first such read checks it.
TEST(ShmRingHostile, TailOutsideItsWindow) {
  std::vector<uint8_t> more(60);  // 68 bytes with its header: more than the 53 known free
  Pair pair(64);
  ASSERT_TRUE(pair.writer->Write("abc", 3, kLongMs).ok());  // head = 11
  *Tail(pair.mem.p) = 12;                                   // beyond the head
  Status st = pair.writer->Write(more.data(), more.size(), kLongMs);
  EXPECT_TRUE(Contains(st, "peer corrupted the ring")) << st.message();

  Pair pair2(64);
  ASSERT_TRUE(pair2.writer->Write("abc", 3, kLongMs).ok());
  *Tail(pair2.mem.p) = ~uint64_t{0};  // "behind" zero
  st = pair2.writer->Write(more.data(), more.size(), kLongMs);
  EXPECT_TRUE(Contains(st, "peer corrupted the ring")) << st.message();
}

TEST(ShmRingHostile, RecordLengthBeyondTheLimit) {
  ShmRingOptions options;
  options.max_message_bytes = 1 << 20;
  Pair pair(64, options);
  uint8_t* data = pair.mem.p + ShmRing::kHeaderBytes;
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(data, &huge, 8);  // little-endian hosts only, as the ring is
  *Head(pair.mem.p) = 8;
  std::vector<uint8_t> got;
  Status st = pair.reader->Read(&got, kLongMs);
  EXPECT_TRUE(Contains(st, "peer corrupted the ring")) << st.message();
  EXPECT_TRUE(Contains(st, "record length")) << st.message();
}

TEST(ShmRingHostile, CapacityChangedAfterAttachIsIgnored) {
  Pair pair(64);
  *reinterpret_cast<uint64_t*>(pair.mem.p + 8) = uint64_t{1} << 40;
  std::vector<uint8_t> msg = Pattern(1, 300);
  std::thread producer([&] { EXPECT_TRUE(pair.writer->Write(msg.data(), 300, kLongMs).ok()); });
  std::vector<uint8_t> got;
  ASSERT_TRUE(pair.reader->Read(&got, kLongMs).ok());
  producer.join();
  EXPECT_EQ(got, msg);
}

// Random values in every header field and the data area: each call returns
// (an error or not), nothing reads or writes outside the memory (ASan).
TEST(ShmRingHostile, RandomHeaderGarbageNeverCrashes) {
  ShmRingOptions options;
  options.spin_us = 0;
  options.max_sleep_us = 200;
  options.max_message_bytes = 4096;
  std::mt19937_64 rng(42);
  int errors = 0;
  for (int iter = 0; iter < 300; ++iter) {
    Pair pair(64, options);
    ASSERT_TRUE(pair.writer->Write("seed", 4, kLongMs).ok());
    auto pick = [&](uint64_t near) -> uint64_t {
      switch (rng() % 4) {
        case 0:
          return rng();
        case 1:
          return near + rng() % 200;
        case 2:
          return near - rng() % 200;
        default:
          return near;
      }
    };
    *Head(pair.mem.p) = pick(12);
    *Tail(pair.mem.p) = pick(0);
    for (size_t i = 0; i < 64; ++i) pair.mem.p[ShmRing::kHeaderBytes + i] = rng();
    if (rng() % 2) *reinterpret_cast<uint64_t*>(pair.mem.p + 8) = rng();
    if (rng() % 4 == 0) *reinterpret_cast<uint32_t*>(pair.mem.p + 20) = rng();  // closed
    std::vector<uint8_t> got;
    if (!pair.reader->Read(&got, 2).ok()) ++errors;
    std::vector<uint8_t> msg(rng() % 200);
    if (!pair.writer->Write(msg.data(), msg.size(), 2).ok()) ++errors;
    std::unique_ptr<ShmRing> late;  // attach to the garbage
    if (ShmRing::Attach(pair.mem.p, pair.mem.size, options, &late).ok()) {
      if (!late->Read(&got, 2).ok()) ++errors;
      if (!late->Write(msg.data(), msg.size(), 2).ok()) ++errors;
    }
  }
  EXPECT_GT(errors, 0);
}

// --- segments

TEST(ShmSegment, PosixSegmentsHaveUniqueNamesAndAreUnlinked) {
  std::unique_ptr<Segment> a, b;
  ASSERT_TRUE(CreatePosixSegment(8192, &a).ok());
  ASSERT_TRUE(CreatePosixSegment(8192, &b).ok());
  EXPECT_NE(a->name(), b->name());
  const std::string prefix = "/flyt-" + std::to_string(getpid()) + "-";
  EXPECT_EQ(a->name().rfind(prefix, 0), 0u) << a->name();
  EXPECT_EQ(a->size(), 8192u);
  const std::string path = "/dev/shm" + a->name();
  EXPECT_EQ(access(path.c_str(), F_OK), 0);

  std::unique_ptr<Segment> view;
  ASSERT_TRUE(OpenPosixSegment(a->name(), &view).ok());
  EXPECT_EQ(view->size(), 8192u);
  static_cast<char*>(a->base())[100] = 'z';
  EXPECT_EQ(static_cast<char*>(view->base())[100], 'z');
  view.reset();  // an opener leaves the name alone
  EXPECT_EQ(access(path.c_str(), F_OK), 0);
  a.reset();
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  EXPECT_FALSE(OpenPosixSegment("/flyt-no-such-segment", &view).ok());
  EXPECT_FALSE(OpenPosixSegment("no-slash", &view).ok());
  EXPECT_FALSE(CreatePosixSegment(0, &view).ok());
}

std::string TempPath(const char* tag) {
  static int counter = 0;
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/flyt-shm-test-" + std::to_string(getpid()) + "-" +
         tag + "-" + std::to_string(counter++);
}

TEST(ShmSegment, FileSegments) {
  const std::string path = TempPath("file");
  std::unique_ptr<Segment> created, opened;
  ASSERT_TRUE(CreateFileSegment(path, 4096, &created).ok());
  Status st = CreateFileSegment(path, 4096, &opened);  // exists already
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st, path)) << st.message();
  st = OpenFileSegment(path, 8192, &opened);
  EXPECT_TRUE(Contains(st, "need at least")) << st.message();
  st = OpenFileSegment(path, 0, &opened);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(opened->size(), 4096u);
  opened.reset();
  created.reset();  // the creator removes the file
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  EXPECT_FALSE(OpenFileSegment(path, 0, &opened).ok());
}

TEST(ShmSegment, PciBarResourceFileIsMappedAsIs) {
  // A stand-in for /sys/bus/pci/devices/.../resource2: an existing file whose
  // size the segment takes, and never changes.
  const std::string path = TempPath("bar");
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 65536), 0);
  std::unique_ptr<Segment> bar;
  Status st = OpenPciBarSegment(path, &bar);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(bar->size(), 65536u);
  std::unique_ptr<ShmRing> ring;
  EXPECT_TRUE(ShmRing::Create(bar->base(), bar->size(), 32768, {}, &ring).ok());
  bar.reset();
  struct stat sb {};
  ASSERT_EQ(fstat(fd, &sb), 0);
  EXPECT_EQ(sb.st_size, 65536);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  st = OpenPciBarSegment(path, &bar);
  EXPECT_TRUE(Contains(st, "size 0")) << st.message();
  ASSERT_EQ(close(fd), 0);
  ASSERT_EQ(unlink(path.c_str()), 0);
  st = OpenPciBarSegment(path, &bar);
  EXPECT_TRUE(Contains(st, "No such file")) << st.message();
}

TEST(ShmSegment, PermissionErrorsAreClear) {
  const std::string path = TempPath("perm");
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0400);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  ASSERT_EQ(close(fd), 0);
  auto check = [&path] {
    std::unique_ptr<Segment> seg;
    Status bar = OpenPciBarSegment(path, &seg);
    Status file = OpenFileSegment(path, 0, &seg);
    if (!Contains(bar, "Permission denied"))
      std::fprintf(stderr, "bar: %s\n", bar.message().c_str());
    if (!Contains(file, "permissions")) std::fprintf(stderr, "file: %s\n", file.message().c_str());
    return Contains(bar, "Permission denied") && Contains(file, "permissions");
  };
  if (geteuid() != 0) {
    EXPECT_TRUE(check());
  } else {
    // Root ignores file modes (CI runs as root): check as user nobody instead.
    ASSERT_EQ(chown(path.c_str(), 0, 0), 0);
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
      _exit(check() ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "as nobody: 1 = wrong message, 3 = setuid failed";
  }
  ASSERT_EQ(unlink(path.c_str()), 0);
}

// --- across processes

constexpr size_t kXCap = 4096;
constexpr size_t kXRingBytes = ShmRing::BytesFor(kXCap);  // a multiple of 64

// Two rings per segment: [0] parent -> child, [1] child -> parent.
void* RingAt(Segment* seg, int index) {
  return static_cast<uint8_t*>(seg->base()) + index * kXRingBytes;
}

// In the child: echo `count` records from `in` to `out`. Returns false on error.
bool Echo(ShmRing* in, ShmRing* out, std::vector<uint8_t>* buf) {
  Status st = in->Read(buf, kLongMs);
  if (st.ok()) st = out->Write(buf->data(), buf->size(), kLongMs);
  if (!st.ok()) std::fprintf(stderr, "child: %s\n", st.message().c_str());
  return st.ok();
}

TEST(ShmRingProcess, ExchangesMessagesWithForkedChild) {
  constexpr int kCount = 200;
  std::unique_ptr<Segment> posix, file;
  ASSERT_TRUE(CreatePosixSegment(2 * kXRingBytes, &posix).ok());
  const std::string path = TempPath("xproc");
  ASSERT_TRUE(CreateFileSegment(path, 2 * kXRingBytes, &file).ok());
  std::unique_ptr<ShmRing> to_child_p, from_child_p, to_child_f, from_child_f;
  ASSERT_TRUE(ShmRing::Create(RingAt(posix.get(), 0), kXRingBytes, kXCap, {}, &to_child_p).ok());
  ASSERT_TRUE(ShmRing::Create(RingAt(posix.get(), 1), kXRingBytes, kXCap, {}, &from_child_p).ok());
  ASSERT_TRUE(ShmRing::Create(RingAt(file.get(), 0), kXRingBytes, kXCap, {}, &to_child_f).ok());
  ASSERT_TRUE(ShmRing::Create(RingAt(file.get(), 1), kXRingBytes, kXCap, {}, &from_child_f).ok());
  auto size_of = [](int i) { return static_cast<size_t>((i * 7919) % (3 * kXCap)); };

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child maps the segments by name, as a peer process would.
    std::unique_ptr<Segment> p, f;
    std::unique_ptr<ShmRing> in_p, out_p, in_f, out_f;
    Status st = OpenPosixSegment(posix->name(), &p);
    if (st.ok()) st = OpenFileSegment(path, 2 * kXRingBytes, &f);
    if (st.ok()) st = ShmRing::Attach(RingAt(p.get(), 0), kXRingBytes, {}, &in_p);
    if (st.ok()) st = ShmRing::Attach(RingAt(p.get(), 1), kXRingBytes, {}, &out_p);
    if (st.ok()) st = ShmRing::Attach(RingAt(f.get(), 0), kXRingBytes, {}, &in_f);
    if (st.ok()) st = ShmRing::Attach(RingAt(f.get(), 1), kXRingBytes, {}, &out_f);
    if (!st.ok()) {
      std::fprintf(stderr, "child: %s\n", st.message().c_str());
      _exit(2);
    }
    std::vector<uint8_t> buf;
    // posix in -> file out, file in -> posix out.
    for (int i = 0; i < kCount; ++i) {
      if (!Echo(in_p.get(), out_f.get(), &buf) || !Echo(in_f.get(), out_p.get(), &buf)) _exit(3);
    }
    out_p->Close();  // tells the parent we are done
    _exit(0);
  }

  std::thread sender([&] {
    for (int i = 0; i < kCount; ++i) {
      std::vector<uint8_t> a = Pattern(i, size_of(i)), b = Pattern(i + 5000, size_of(i + 1));
      ASSERT_TRUE(to_child_p->Write(a.data(), a.size(), kLongMs).ok());
      ASSERT_TRUE(to_child_f->Write(b.data(), b.size(), kLongMs).ok());
    }
  });
  for (int i = 0; i < kCount; ++i) {
    std::vector<uint8_t> got;
    Status st = from_child_f->Read(&got, kLongMs);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(got, Pattern(i, size_of(i))) << "message " << i;
    st = from_child_p->Read(&got, kLongMs);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(got, Pattern(i + 5000, size_of(i + 1))) << "message " << i;
  }
  sender.join();
  std::vector<uint8_t> got;
  EXPECT_TRUE(Contains(from_child_p->Read(&got, kLongMs), "closed"));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;

  const std::string shm_path = "/dev/shm" + posix->name();
  to_child_p.reset();
  from_child_p.reset();
  to_child_f.reset();
  from_child_f.reset();
  posix.reset();
  file.reset();
  EXPECT_NE(access(shm_path.c_str(), F_OK), 0);
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

TEST(ShmRingProcess, ParentNoticesKilledChildAndCleansUp) {
  std::unique_ptr<Segment> posix;
  ASSERT_TRUE(CreatePosixSegment(2 * kXRingBytes, &posix).ok());
  std::unique_ptr<ShmRing> to_child, from_child;
  ASSERT_TRUE(ShmRing::Create(RingAt(posix.get(), 0), kXRingBytes, kXCap, {}, &to_child).ok());
  ASSERT_TRUE(ShmRing::Create(RingAt(posix.get(), 1), kXRingBytes, kXCap, {}, &from_child).ok());

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::unique_ptr<Segment> p;
    std::unique_ptr<ShmRing> in, out;
    Status st = OpenPosixSegment(posix->name(), &p);
    if (st.ok()) st = ShmRing::Attach(RingAt(p.get(), 0), kXRingBytes, {}, &in);
    if (st.ok()) st = ShmRing::Attach(RingAt(p.get(), 1), kXRingBytes, {}, &out);
    std::vector<uint8_t> buf;
    if (!st.ok() || !Echo(in.get(), out.get(), &buf)) _exit(2);
    (void)in->Read(&buf, 0);  // sleeps on the futex until killed
    _exit(3);
  }
  ASSERT_TRUE(to_child->Write("ping", 4, kLongMs).ok());
  std::vector<uint8_t> got;
  Status st = from_child->Read(&got, kLongMs);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(std::string(got.begin(), got.end()), "ping");

  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it go to sleep
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status));

  // Nobody answers and nobody drains: both directions time out.
  st = from_child->Read(&got, 200);
  EXPECT_TRUE(Contains(st, "timed out")) << st.message();
  std::vector<uint8_t> big(2 * kXCap);
  st = to_child->Write(big.data(), big.size(), 200);
  EXPECT_TRUE(Contains(st, "timed out")) << st.message();
  EXPECT_TRUE(to_child->closed());  // a write that failed midway closes the ring

  const std::string shm_path = "/dev/shm" + posix->name();
  EXPECT_EQ(access(shm_path.c_str(), F_OK), 0);
  to_child.reset();
  from_child.reset();
  posix.reset();
  EXPECT_NE(access(shm_path.c_str(), F_OK), 0);
}

}  // namespace
}  // namespace flyt::transport
