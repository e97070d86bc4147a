#pragma once
// Resident bytes of this process's mappings of a file (/proc/self/smaps "Rss:" lines): what a test of
// mapped checkpoints checks that the pages it read went back.
#include <cstdint>
#include <fstream>
#include <string>

namespace expar::test {

// Resident bytes of this process's mappings of `path`, and whether any exist.
inline int64_t resident_bytes_of(const std::string& path, bool* mapped = nullptr) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false, any = false;
  int64_t kib = 0;
  while (std::getline(smaps, line)) {
    const bool header = line.find('-') < line.find(' ') && line.find(' ') != std::string::npos &&
                        line.find(':') > line.find(' ');
    if (header) {
      inside = line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0;
      any = any || inside;
    } else if (inside && line.rfind("Rss:", 0) == 0) {
      kib += std::stoll(line.substr(4));
    }
  }
  if (mapped) *mapped = any;
  return kib * 1024;
}

}  // namespace expar::test
