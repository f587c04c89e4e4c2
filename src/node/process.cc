#include "node/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

extern char** environ;

namespace flyt::node {
namespace {

using Clock = std::chrono::steady_clock;

std::string Errno(const std::string& what, int err) { return what + ": " + std::strerror(err); }

// RAII for the posix_spawn attribute objects.
class SpawnSetup {
 public:
  SpawnSetup() {
    actions_ok_ = posix_spawn_file_actions_init(&actions_) == 0;
    attr_ok_ = posix_spawnattr_init(&attr_) == 0;
  }
  ~SpawnSetup() {
    if (actions_ok_) posix_spawn_file_actions_destroy(&actions_);
    if (attr_ok_) posix_spawnattr_destroy(&attr_);
  }
  bool ok() const { return actions_ok_ && attr_ok_; }
  posix_spawn_file_actions_t* actions() { return &actions_; }
  posix_spawnattr_t* attr() { return &attr_; }

  // The child starts with an empty signal mask and default dispositions for the
  // signals a daemon commonly blocks or ignores (SIG_IGN survives exec).
  int SetSignals(bool new_group) {
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGCHLD, SIGUSR1, SIGUSR2})
      sigaddset(&defaults, sig);
    short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    if (new_group) flags |= POSIX_SPAWN_SETPGROUP;
    int rc = posix_spawnattr_setsigmask(&attr_, &none);
    if (rc == 0) rc = posix_spawnattr_setsigdefault(&attr_, &defaults);
    if (rc == 0 && new_group) rc = posix_spawnattr_setpgroup(&attr_, 0);
    if (rc == 0) rc = posix_spawnattr_setflags(&attr_, flags);
    return rc;
  }

 private:
  posix_spawn_file_actions_t actions_;
  posix_spawnattr_t attr_;
  bool actions_ok_ = false, attr_ok_ = false;
};

std::vector<char*> CStrings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

Status DoSpawn(const SpawnOptions& options, SpawnSetup& setup, pid_t* pid) {
  if (options.argv.empty() || options.argv[0].empty())
    return Status::Error("internal error: spawn without a program");
  int rc = setup.SetSignals(options.new_process_group);
  if (rc != 0) return Status::Error(Errno("cannot prepare the spawn attributes", rc));
  std::vector<char*> argv = CStrings(options.argv);
  std::vector<char*> envp = CStrings(options.env);
  rc = posix_spawnp(pid, argv[0], setup.actions(), setup.attr(), argv.data(), envp.data());
  if (rc != 0) return Status::Error(Errno("cannot start '" + options.argv[0] + "'", rc));
  return Status::Ok();
}

}  // namespace

Status Spawn(const SpawnOptions& options, pid_t* pid) {
  SpawnSetup setup;
  if (!setup.ok())
    return Status::Error("cannot initialise posix_spawn attributes (out of memory?)");
  int rc = posix_spawn_file_actions_addopen(setup.actions(), 0, "/dev/null", O_RDONLY, 0);
  const std::string out = options.output_path.empty() ? "/dev/null" : options.output_path;
  if (rc == 0)
    rc = posix_spawn_file_actions_addopen(setup.actions(), 1, out.c_str(),
                                          O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (rc == 0) rc = posix_spawn_file_actions_adddup2(setup.actions(), 1, 2);
  if (rc != 0) return Status::Error(Errno("cannot prepare the child's output to " + out, rc));
  // The log must be writable: posix_spawn reports a failed open only as a failed exec.
  if (!options.output_path.empty()) {
    int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) return Status::Error(Errno("cannot open log file " + out, errno));
    ::close(fd);
  }
  return DoSpawn(options, setup, pid);
}

Status WaitFor(pid_t pid, int timeout_ms, bool* exited, int* wait_status) {
  *exited = false;
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int st = 0;
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      *exited = true;
      *wait_status = st;
      return Status::Ok();
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::Error(Errno("waitpid(" + std::to_string(pid) + ")", errno));
    }
    if (Clock::now() >= deadline) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string DescribeExit(int wait_status) {
  if (WIFEXITED(wait_status)) return "exit status " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    int sig = WTERMSIG(wait_status);
    const char* name = strsignal(sig);
    return "killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")" +
           (WCOREDUMP(wait_status) ? ", core dumped" : "");
  }
  return "wait status " + std::to_string(wait_status);
}

int ExitCode(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

Status RunCommand(const SpawnOptions& options, const std::string& input, int timeout_ms,
                  int* wait_status, std::string* output) {
  output->clear();
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return Status::Error(Errno("pipe", errno));
  if (::pipe2(out, O_CLOEXEC) != 0) {
    int err = errno;
    ::close(in[0]);
    ::close(in[1]);
    return Status::Error(Errno("pipe", err));
  }
  auto close_all = [&] {
    for (int fd : {in[0], in[1], out[0], out[1]})
      if (fd >= 0) ::close(fd);
  };
  pid_t pid = -1;
  {
    SpawnSetup setup;
    if (!setup.ok()) {
      close_all();
      return Status::Error("cannot initialise posix_spawn attributes (out of memory?)");
    }
    int rc = posix_spawn_file_actions_adddup2(setup.actions(), in[0], 0);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(setup.actions(), out[1], 1);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(setup.actions(), out[1], 2);
    if (rc != 0) {
      close_all();
      return Status::Error(Errno("cannot prepare the child's pipes", rc));
    }
    Status st = DoSpawn(options, setup, &pid);
    if (!st.ok()) {
      close_all();
      return st;
    }
  }
  ::close(in[0]);
  ::close(out[1]);
  in[0] = out[1] = -1;
  // Small inputs (commands) fit in the pipe buffer; a child that does not read is fine.
  int flags = ::fcntl(in[1], F_GETFL);
  if (flags >= 0) ::fcntl(in[1], F_SETFL, flags | O_NONBLOCK);
  size_t off = 0;
  while (off < input.size()) {
    ssize_t n = ::write(in[1], input.data() + off, input.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the child closed its stdin or the pipe is full: it got what it reads
    off += static_cast<size_t>(n);
  }
  ::close(in[1]);
  in[1] = -1;
  flags = ::fcntl(out[0], F_GETFL);
  if (flags >= 0) ::fcntl(out[0], F_SETFL, flags | O_NONBLOCK);
  constexpr size_t kMaxOutput = 64 << 10;
  auto drain = [&] {
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(out[0], buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      if (output->size() < kMaxOutput) output->append(buf, static_cast<size_t>(n));
    }
  };
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  Status result;
  for (;;) {
    pollfd p{out[0], POLLIN, 0};
    ::poll(&p, 1, 10);
    drain();
    bool exited = false;
    Status st = WaitFor(pid, 0, &exited, wait_status);
    if (!st.ok()) {
      result = st;
      break;
    }
    if (exited) {
      drain();
      break;
    }
    if (Clock::now() >= deadline) {
      ::kill(options.new_process_group ? -pid : pid, SIGKILL);
      int ignored = 0;
      while (::waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
      }
      result = Status::Error("'" + options.argv[0] + "' did not finish within " +
                             std::to_string(timeout_ms) + " ms and was killed");
      break;
    }
  }
  close_all();
  return result;
}

std::vector<std::string> ChildEnvironment(
    const std::vector<std::string>& drop_prefixes,
    const std::vector<std::pair<std::string, std::string>>& set) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    bool drop = false;
    for (const auto& p : drop_prefixes) drop = drop || name.rfind(p, 0) == 0;
    for (const auto& kv : set) drop = drop || name == kv.first;
    if (!drop) env.push_back(std::move(entry));
  }
  for (const auto& kv : set) env.push_back(kv.first + "=" + kv.second);
  return env;
}

std::string TailOfFile(const std::string& path, int max_lines, size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat sb {};
  std::string text;
  if (::fstat(fd, &sb) == 0) {
    off_t size = sb.st_size;
    off_t start = size > static_cast<off_t>(max_bytes) ? size - static_cast<off_t>(max_bytes) : 0;
    text.resize(static_cast<size_t>(size - start));
    ssize_t n = ::pread(fd, text.data(), text.size(), start);
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  ::close(fd);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  size_t pos = text.size();
  for (int lines = 0; lines < max_lines && pos != std::string::npos && pos > 0; ++lines)
    pos = text.rfind('\n', pos - 1);
  if (pos != std::string::npos && pos < text.size() && text[pos] == '\n') ++pos;
  if (pos == std::string::npos) pos = 0;
  return ValidUtf8(text.substr(pos));
}

std::string ValidUtf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xE  ? 3
                 : (c >> 3) == 0x1E ? 4
                                    : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    if (ok && (len > 1 || c >= 0x20 || c == '\n' || c == '\t')) {
      out.append(s, i, len);
      i += len;
    } else {
      out.push_back('?');
      ++i;
    }
  }
  return out;
}

Status MakeDirectories(const std::string& path, mode_t mode) {
  if (path.empty()) return Status::Error("empty folder name");
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    std::string part = path.substr(0, pos);
    if (part.empty()) continue;
    if (::mkdir(part.c_str(), mode) != 0 && errno != EEXIST)
      return Status::Error(Errno("cannot create folder " + part, errno));
  }
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0)
    return Status::Error(Errno("cannot use folder " + path, errno));
  if (!S_ISDIR(sb.st_mode)) return Status::Error(path + " exists and is not a folder");
  return Status::Ok();
}

}  // namespace flyt::node
