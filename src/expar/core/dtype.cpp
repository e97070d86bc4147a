#include "expar/core/dtype.hpp"

#include "expar/core/error.hpp"

namespace expar {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return 4;
    case DType::F16:
      return 2;
    case DType::BF16:
      return 2;
    case DType::F8E4M3:
      return 1;
    case DType::E8M0:
      return 1;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
    case DType::F64:
      return 8;
  }
  fail("unknown dtype code {}", static_cast<int>(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::F8E4M3:
      return "F8_E4M3";
    case DType::E8M0:
      return "F8_E8M0";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::U8:
      return "U8";
    case DType::F64:
      return "F64";
  }
  fail("unknown dtype code {}", static_cast<int>(dtype));
}

DType dtype_from_name(std::string_view name) {
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::E8M0, DType::I32, DType::I64,
                  DType::U8, DType::F64}) {
    if (dtype_name(d) == name) return d;
  }
  fail("dtype '{}' is not supported: use one of F32, F16, BF16, F8_E4M3, F8_E8M0, I32, I64, U8, F64", name);
}

}  // namespace expar
