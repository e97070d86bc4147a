#pragma once
// gpt-oss's MXFP4 expert matrices (the OCP microscaling format, as transformers' convert_moe_packed_tensors
// reads it): a stacked matrix NAME, [E, in, out] once decoded, is stored as
//   NAME_blocks  U8 [E, out, in/32, 16]: two FP4 (e2m1) codes per byte, low nibble first, 32 per block
//   NAME_scales  U8 [E, out, in/32]:     one E8M0 exponent per block (value = code · 2^(scale - 127))
// One decoder for every reader: the tensor store (model/mxfp4_store.hpp) through which the engine and the
// trainer's fine-tuning load (train/checkpoint.hpp's load_hf_weights) read.
#include <cstdint>

namespace expar {

// Decodes `experts` consecutive experts: blocks [experts, out, in/32, 16] and scales [experts, out, in/32]
// into dst [experts, in, out] f32 (in a multiple of 32).
void dequantize_mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t experts, int64_t in, int64_t out,
                      float* dst);

}  // namespace expar
