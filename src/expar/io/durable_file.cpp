#include "expar/io/durable_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "expar/core/error.hpp"

namespace expar {

void fsync_path(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPAR_CHECK(fd >= 0, "{}: cannot open to sync it to disk: {}", path.string(), std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // EINVAL: the file system does not support fsync on this kind of file (some for directories): nothing
  // more can be done there.
  EXPAR_CHECK(rc == 0 || err == EINVAL, "{}: sync to disk failed: {}: check free disk space", path.string(),
              std::strerror(err));
}

void write_file_atomically(const std::filesystem::path& path, std::string_view content) {
  std::filesystem::path tmp = path;
  tmp += fmt::format(".tmp{}", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  EXPAR_CHECK(fd >= 0, "{}: cannot create: {}: check that the directory exists and is writable", tmp.string(),
              std::strerror(errno));
  size_t done = 0;
  int err = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : ENOSPC;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    std::filesystem::remove(tmp);
    fail("{}: write failed: {}: check free disk space", path.string(), std::strerror(err));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    fail("{}: cannot rename the finished file into place: {}", path.string(), ec.message());
  }
  fsync_path(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
}

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPAR_CHECK(in.good(), "{}: cannot open: {}", path.string(), std::strerror(errno));
  std::stringstream buffer;
  buffer << in.rdbuf();
  EXPAR_CHECK(!in.bad(), "{}: read failed: {}", path.string(), std::strerror(errno));
  return buffer.str();
}

}  // namespace expar
