// Child processes of the node manager (flyt-servers, nvidia-cuda-mps-control).
//
// Owns: spawning a program with posix_spawn (argv, environment, stdin from
// /dev/null or a pipe, stdout+stderr to a log file or a pipe, its own process
// group, default signal dispositions and an empty signal mask whatever this
// process blocks), waiting for a child with a deadline, running a short
// command to completion, and describing exit statuses. Must not know what the
// programs are or mean.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace flyt::node {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is the program's path (or a name found in PATH)
  std::vector<std::string> env;   // "NAME=value" entries: the child's whole environment
  std::string output_path;  // stdout and stderr appended here (created 0600); empty: /dev/null
  bool new_process_group = true;  // the child leads its own group (stop it with kill(-pid))
};

Status Spawn(const SpawnOptions& options, pid_t* pid);

// Waits up to timeout_ms (0: just looks) for `pid`. *exited says whether it
// ended; then *wait_status holds waitpid's status.
Status WaitFor(pid_t pid, int timeout_ms, bool* exited, int* wait_status);

// "exit status 3", "killed by signal 9 (Killed)".
std::string DescribeExit(int wait_status);
// The exit code, or 128 + signal number for a killed process (shell style).
int ExitCode(int wait_status);

// Runs `options` (output_path ignored) to completion, writing `input` to its
// stdin and collecting what it prints on stdout and stderr until it exits. A
// program still running after timeout_ms is killed and reported as an error.
// Programs that leave a daemon behind are fine: collection stops when the
// direct child exits.
Status RunCommand(const SpawnOptions& options, const std::string& input, int timeout_ms,
                  int* wait_status, std::string* output);

// This process's environment without the variables whose names start with
// one of `drop_prefixes`, plus `set` (replacing any same-named entry).
std::vector<std::string> ChildEnvironment(
    const std::vector<std::string>& drop_prefixes,
    const std::vector<std::pair<std::string, std::string>>& set);

// The last `max_lines` lines (at most max_bytes) of a text file, made valid
// UTF-8 for JSON (see ValidUtf8); "" when unreadable.
std::string TailOfFile(const std::string& path, int max_lines, size_t max_bytes);

// `s` with every byte that is not part of a valid UTF-8 sequence, and every
// control character but newline and tab, replaced by '?'.
std::string ValidUtf8(const std::string& s);

// mkdir -p with `mode` for the folders it creates.
Status MakeDirectories(const std::string& path, mode_t mode);

}  // namespace flyt::node
