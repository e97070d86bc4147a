#include "expar/io/text_file.hpp"

#include <fstream>
#include <sstream>

#include "expar/core/error.hpp"

namespace expar {

std::string read_text_file(const std::filesystem::path& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  EXPAR_CHECK(in.good(), "cannot open {} {}: check the path", what, path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace expar
