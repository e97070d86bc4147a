#pragma once
// A whole file as a string, with an expar::Error naming the file and `what` it was meant to be.
#include <filesystem>
#include <string>
#include <string_view>

namespace expar {

std::string read_text_file(const std::filesystem::path& path, std::string_view what);

}  // namespace expar
