#pragma once
// Writes that survive a crash or a full disk: every write is checked, data reaches the disk (fsync) before a
// file is renamed into place, and the rename itself is made durable by an fsync of the directory.
#include <filesystem>
#include <string_view>

namespace expar {

// fsync of a file or a directory. Throws expar::Error naming the path and the system's reason.
void fsync_path(const std::filesystem::path& path);

// Writes `content` to `path` as a whole or not at all: a temporary file beside it, checked writes, fsync,
// rename over `path`, fsync of the directory. On failure the temporary file is removed and `path` is
// unchanged; the error names the path and the reason (e.g. "No space left on device").
void write_file_atomically(const std::filesystem::path& path, std::string_view content);

// Reads a whole file; throws expar::Error naming it when it cannot be read.
std::string read_text_file(const std::filesystem::path& path);

}  // namespace expar
