// libFuzzer target for the safetensors buffer parser (SafetensorsFile::from_bytes). Built and run by
// scripts/fuzz with ASan and UBSan. An input either fails with expar::Error (anything else escaping is a bug,
// and libFuzzer reports the uncaught exception), or it is accepted, and then every accessor must stay in
// bounds and agree, and writing the tensors back out and parsing that again must give the same file content.
//
// With EXPAR_FUZZ_WRITE_SEEDS=<dir> set, the binary instead writes a seed corpus of valid files and exits.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "expar/io/safetensors_file.hpp"
#include "expar/io/safetensors_writer.hpp"

namespace {

using namespace expar;

[[noreturn]] void invariant_broken(const char* what, const std::string& name) {
  std::fprintf(stderr, "fuzz invariant broken: %s (tensor \"%s\")\n", what, name.c_str());
  std::abort();
}

Tensor pattern(Shape shape, DType dtype, unsigned seed) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  auto* p = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  return t;
}

void write_file(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_seeds(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  SafetensorsWriter empty;
  write_file(dir / "empty.safetensors", empty.to_bytes());

  SafetensorsWriter every_dtype;
  unsigned seed = 1;
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::E8M0, DType::I32, DType::I64,
                  DType::U8, DType::F64}) {
    every_dtype.add(std::string(dtype_name(d)), pattern({2, 3}, d, seed++));
  }
  write_file(dir / "every_dtype.safetensors", every_dtype.to_bytes());

  SafetensorsWriter experts;
  experts.add("layers.0.experts.w1", pattern({4, 2, 3}, DType::BF16, 7));
  experts.add("layers.0.router", pattern({4, 2}, DType::F32, 8));
  experts.add("scalar", pattern({}, DType::F32, 9));
  experts.add("none", pattern({0, 5}, DType::F32, 10));
  experts.set_metadata("format", "pt");
  experts.set_metadata("expar", "1");
  write_file(dir / "experts_metadata.safetensors", experts.to_bytes());

  // Another writer's style: unpadded header, other field order, unaligned data.
  const std::string header =
      R"({"b":{"data_offsets":[1,9],"shape":[2],"dtype":"F32"},"a":{"shape":[1],"dtype":"U8","data_offsets":[0,1]}})";
  std::vector<std::byte> raw(8);
  for (int i = 0; i < 8; ++i)
    raw[static_cast<size_t>(i)] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xFF);
  for (char c : header) raw.push_back(static_cast<std::byte>(c));
  for (int i = 0; i < 9; ++i) raw.push_back(static_cast<std::byte>(i));
  write_file(dir / "unaligned.safetensors", raw);
}

void check_accepted(const SafetensorsFile& file, std::span<const std::byte> input) {
  const SafetensorsHeader& header = file.header();
  if (header.data_start() + header.data_bytes != input.size()) invariant_broken("sizes do not add up", "");
  uint64_t total = 0;
  SafetensorsWriter writer;
  for (const std::string& name : file.names()) {
    const TensorInfo& info = file.info(name);
    total += info.nbytes();
    const auto bytes = file.bytes(name);
    if (bytes.size() != info.nbytes()) invariant_broken("bytes() size differs from info", name);
    if (std::memcmp(bytes.data(), input.data() + header.data_start() + info.data_begin, bytes.size()) != 0) {
      invariant_broken("bytes() differ from the input at data_offsets", name);
    }
    const Tensor copy = file.read(name);
    if (copy.nbytes() != bytes.size() ||
        (bytes.size() && std::memcmp(copy.raw(), bytes.data(), bytes.size()))) {
      invariant_broken("read() differs from bytes()", name);
    }
    try {
      const Tensor view = file.view(name);
      if (view.raw() != bytes.data()) invariant_broken("view() does not point at the bytes", name);
    } catch (const Error&) {  // unaligned: allowed, read() is the way
    }
    if (!info.shape.empty()) {
      const int64_t rows = info.shape[0];
      const Tensor head = file.read_rows(name, 0, rows / 2);
      const Tensor tail = file.read_rows(name, rows / 2, rows);
      if (head.nbytes() + tail.nbytes() != bytes.size() ||
          (head.nbytes() && std::memcmp(head.raw(), bytes.data(), head.nbytes())) ||
          (tail.nbytes() && std::memcmp(tail.raw(), bytes.data() + head.nbytes(), tail.nbytes()))) {
        invariant_broken("read_rows() halves differ from bytes()", name);
      }
      try {
        file.read_rows(name, 0, rows + 1);
        invariant_broken("read_rows() past the end was accepted", name);
      } catch (const Error&) {
      }
    }
    if (!name.empty()) writer.add(name, copy);
  }
  if (total != header.data_bytes) invariant_broken("tensor sizes do not sum to the data buffer", "");
  try {
    file.info("\x01 no such tensor \x02");
    invariant_broken("a missing name was found", "");
  } catch (const Error&) {
  }

  // Round trip: what we write from an accepted file must parse back to the same content.
  for (const auto& [key, value] : file.metadata()) writer.set_metadata(key, value);
  const auto again = SafetensorsFile::from_bytes(writer.to_bytes(), "round trip");
  if (again.metadata() != file.metadata()) invariant_broken("metadata changed in a round trip", "");
  for (const std::string& name : again.names()) {
    const TensorInfo& a = again.info(name);
    const TensorInfo& b = file.info(name);
    if (a.dtype != b.dtype || a.shape != b.shape) invariant_broken("info changed in a round trip", name);
    const auto x = again.bytes(name);
    const auto y = file.bytes(name);
    if (x.size() != y.size() || (x.size() && std::memcmp(x.data(), y.data(), x.size()))) {
      invariant_broken("bytes changed in a round trip", name);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("EXPAR_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data), size);
  std::optional<SafetensorsFile> file;
  try {
    file.emplace(SafetensorsFile::from_bytes(input, "fuzz input"));
  } catch (const Error& e) {
    if (std::strncmp(e.what(), "fuzz input", 10) != 0)
      invariant_broken("error message does not name the input", "");
    return 0;
  }
  check_accepted(*file, input);
  return 0;
}
