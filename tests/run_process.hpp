#pragma once
// Runs a program as a child process (tests of whole programs: mpirun jobs, the expar binary) and returns
// what a user would see: the exit status or the signal, stdout and stderr together, and how long it took.
// A run still alive after `limit_seconds` is killed with its whole process group, so a test never hangs.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace expar::testing {

struct ProcessResult {
  int exit_code = -1;  // -1 when ended by a signal
  int signal = 0;      // the signal that ended it, 0 if it exited
  bool killed_at_limit = false;
  std::string output;  // stdout and stderr interleaved
  double seconds = 0;
};

inline ProcessResult run_process(const std::vector<std::string>& argv,
                                 const std::vector<std::pair<std::string, std::string>>& env = {},
                                 double limit_seconds = 120, const std::string& stdin_text = "",
                                 const std::string& cwd = "") {
  int out[2];
  int in[2];
  if (pipe(out) != 0 || pipe(in) != 0) return {};
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(126);
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(out[1], 2);
    close(out[0]);
    close(in[1]);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(out[1]);
  close(in[0]);
  if (!stdin_text.empty()) (void)!write(in[1], stdin_text.data(), stdin_text.size());
  close(in[1]);
  ProcessResult r;
  char buffer[4096];
  for (;;) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > limit_seconds && !r.killed_at_limit) {
      r.killed_at_limit = true;
      kill(-pid, SIGKILL);
    }
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      const ssize_t n = read(out[0], buffer, sizeof(buffer));
      if (n <= 0) break;
      r.output.append(buffer, static_cast<size_t>(n));
    }
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  kill(-pid, SIGKILL);  // whatever the job left behind (a stopped rank) goes with it
  return r;
}

}  // namespace expar::testing
