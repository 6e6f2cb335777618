// The two fallbacks: pread threads when io_uring cannot be set up, buffered reads when the file
// system refuses O_DIRECT. Each with its one-line notice.
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "gtest/gtest.h"
#include "io/read_engine.h"
#include "tests/io/io_test_util.h"
#include "tests/util/temp_dir.h"

namespace k3::io {
namespace {

using testing::MakeArena;
using testing::MakeFile;
using testing::MakeRequest;
using testing::SameBytes;
using testing::TestFile;

// Reads a few unaligned ranges and checks them.
void ExpectReadsRight(ReadEngine& engine, const TestFile& file) {
  auto f = engine.OpenFile(file.path);
  ASSERT_TRUE(f.ok()) << f.status();
  auto arena = MakeArena(1 << 20);
  for (uint64_t offset : {0ul, 1ul, 4097ul, 300001ul}) {
    auto data = engine.Read(MakeRequest(*f, offset, 200000, arena->Slice(0, 1 << 20)));
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_TRUE(SameBytes(file, offset, *data)) << offset;
  }
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

TEST(FallbackTest, EnvironmentForcesThePreadBackend) {
  k3::testing::TempDir dir;
  TestFile file = MakeFile(dir / "a.bin", 600000);
  ScopedEnv env("K3_IO_BACKEND", "pread");
  ReadEngineOptions o;
  o.notices = false;
  auto engine = ReadEngine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->backend_name(), "pread");
  ExpectReadsRight(**engine, file);
}

TEST(FallbackTest, EnvironmentMustNameABackend) {
  ScopedEnv env("K3_IO_BACKEND", "carrier-pigeon");
  EXPECT_EQ(ReadEngine::Create(ReadEngineOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Makes io_uring_setup fail with EPERM in this process, as container seccomp profiles do.
bool ForbidIoUring() {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog program = {static_cast<unsigned short>(std::size(filter)), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

// In a child process (the seccomp filter cannot be removed): the automatic choice falls back to
// pread threads with a notice, an explicit io_uring request fails.
void RunWithoutIoUring(const std::string& path) {
  if (!ForbidIoUring()) std::exit(3);
  ReadEngineOptions explicit_uring;
  explicit_uring.backend = Backend::kUring;
  if (ReadEngine::Create(explicit_uring).ok()) std::exit(4);
  auto engine = ReadEngine::Create(ReadEngineOptions{});
  if (!engine.ok() || (*engine)->backend_name() != "pread") std::exit(5);
  auto f = (*engine)->OpenFile(path);
  auto arena = BufferArena::Create(1 << 20);
  if (!f.ok() || !arena.ok()) std::exit(6);
  auto data = (*engine)->Read(MakeRequest(*f, 123, 4000, (*arena)->Slice(0, 8192)));
  std::exit(data.ok() ? 0 : 7);
}

// Whether this machine lets a process install a seccomp filter (some sandboxes do not).
bool CanForbidIoUring() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(ForbidIoUring() ? 0 : 1);
  int status = 0;
  return pid > 0 && ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
         WEXITSTATUS(status) == 0;
}

TEST(FallbackDeathTest, PreadThreadsWhenIoUringIsForbidden) {
  if (!CanForbidIoUring()) GTEST_SKIP() << "seccomp filters are not allowed here";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  k3::testing::TempDir dir;
  TestFile file = MakeFile(dir / "a.bin", 100000);
  EXPECT_EXIT(RunWithoutIoUring(file.path), ::testing::ExitedWithCode(0),
              "k3: io_uring is not available \\(.*Operation not permitted\\); reading with a "
              "pool of pread threads");
}

TEST(FallbackTest, TmpfsReadsRightWhetherOrNotItTakesODirect) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  k3::testing::TempDir dir;  // for cleanup only; the file lives in /dev/shm
  const std::string path = "/dev/shm/k3-io-test-" + std::to_string(::getpid());
  TestFile file = MakeFile(path, 700000, 5);
  {
    ReadEngineOptions o;
    o.notices = false;
    auto engine = ReadEngine::Create(o);
    ASSERT_TRUE(engine.ok());
    ExpectReadsRight(**engine, file);  // Linux >= 6.6 accepts O_DIRECT on tmpfs, older refuse
  }
  for (Backend backend : {Backend::kUring, Backend::kPread}) {
    ReadEngineOptions o;
    o.backend = backend;
    o.notices = false;
    o.faults = std::make_shared<FaultPlan>();
    o.faults->RefuseDirect();  // what older kernels do: open(O_DIRECT) fails with EINVAL
    auto engine = ReadEngine::Create(o);
    if (!engine.ok()) continue;  // no io_uring here
    auto f = (*engine)->OpenFile(path);
    ASSERT_TRUE(f.ok());
    EXPECT_FALSE((*engine)->file(*f).direct);
    ExpectReadsRight(**engine, file);
  }
  std::filesystem::remove(path);
}

void OpenRefusingDirect(const std::string& path) {
  ReadEngineOptions o;
  o.faults = std::make_shared<FaultPlan>();
  o.faults->RefuseDirect();
  auto engine = ReadEngine::Create(o);
  if (!engine.ok()) std::exit(2);
  auto f = (*engine)->OpenFile(path);
  std::exit(f.ok() && !(*engine)->file(*f).direct ? 0 : 3);
}

TEST(FallbackDeathTest, BufferedReadsComeWithANotice) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  k3::testing::TempDir dir;
  TestFile file = MakeFile(dir / "a.bin", 10000);
  EXPECT_EXIT(OpenRefusingDirect(file.path), ::testing::ExitedWithCode(0),
              "k3: .*a.bin: the file system refuses O_DIRECT; reading through the page cache");
}

}  // namespace
}  // namespace k3::io
