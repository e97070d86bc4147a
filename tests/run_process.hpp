#pragma once
// Runs a program as a child process (tests of whole programs: mpirun jobs, the expar binary) and returns
// what a user would see: the exit status or the signal, stdout and stderr together, and how long it took.
// A run still alive after its limit is killed with its whole process group, so a test never hangs.
// run_process runs one to the end; ChildProcess keeps one running (a server) while the test talks to it.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
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

class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv,
               const std::vector<std::pair<std::string, std::string>>& env = {},
               const std::string& stdin_text = "", const std::string& cwd = "")
      : start_(std::chrono::steady_clock::now()) {
    int out[2];
    int in[2];
    if (pipe(out) != 0 || pipe(in) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
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
    setpgid(pid_, pid_);
    close(out[1]);
    close(in[0]);
    if (!stdin_text.empty()) (void)!write(in[1], stdin_text.data(), stdin_text.size());
    close(in[1]);
    out_ = out[0];
  }
  ~ChildProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool started() const { return pid_ > 0 && out_ >= 0; }
  pid_t pid() const { return pid_; }
  const std::string& output() const { return result_.output; }
  // Sends `sig` to the process itself (not its group).
  void signal(int sig) const { kill(pid_, sig); }

  // Reads output until `pattern` matches it, the output ends or `limit_seconds` pass; returns the match's
  // first group (the whole match without groups), or "" when it did not match.
  std::string wait_for_output(const std::regex& pattern, double limit_seconds) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_seconds);
    std::smatch m;
    while (!std::regex_search(result_.output, m, pattern)) {
      if (std::chrono::steady_clock::now() > until || !read_some()) return "";
    }
    return m.size() > 1 ? m[1].str() : m[0].str();
  }

  // Reads the rest of the output and waits for the exit; after `limit_seconds` the whole process group is
  // killed (killed_at_limit). Also kills whatever the process left behind in its group (a stopped rank).
  ProcessResult finish(double limit_seconds) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_seconds);
    while (read_some()) {
      if (std::chrono::steady_clock::now() > until && !result_.killed_at_limit) {
        result_.killed_at_limit = true;
        kill(-pid_, SIGKILL);
      }
    }
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    result_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (WIFEXITED(status)) result_.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) result_.signal = WTERMSIG(status);
    kill(-pid_, SIGKILL);
    return result_;
  }

 private:
  // Waits up to 100 ms for output; false once it ended.
  bool read_some() {
    if (out_ < 0) return false;
    pollfd p{out_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) return true;
    char buffer[4096];
    const ssize_t n = read(out_, buffer, sizeof(buffer));
    if (n <= 0) return false;
    result_.output.append(buffer, static_cast<size_t>(n));
    return true;
  }

  std::chrono::steady_clock::time_point start_;
  pid_t pid_ = -1;
  int out_ = -1;
  bool reaped_ = false;
  ProcessResult result_;
};

inline ProcessResult run_process(const std::vector<std::string>& argv,
                                 const std::vector<std::pair<std::string, std::string>>& env = {},
                                 double limit_seconds = 120, const std::string& stdin_text = "",
                                 const std::string& cwd = "") {
  ChildProcess child(argv, env, stdin_text, cwd);
  if (!child.started()) return {};
  return child.finish(limit_seconds);
}

}  // namespace expar::testing
