#pragma once
// The four payload-precision flags shared by `expar train`, `expar layer` and `expar bench paths`
// (moe/payload_precision.hpp): --dispatch-precision, --combine-precision, --combine-grad-precision and
// --dispatch-grad-precision, each f32 | bf16 | mxfp8 | mxfp8-floor.
#include <CLI/CLI.hpp>
#include <string>

#include "expar/moe/payload_precision.hpp"

namespace expar::cli {

struct PrecisionFlags {
  std::string dispatch = "f32", combine = "f32", combine_grad = "f32", dispatch_grad = "f32";
  // Throws expar::Error naming the flag and the accepted formats for an unknown name.
  PayloadPrecision parse() const;
  // Each of the four flags that `cmd`'s command line does not give takes `format` instead of f32 (expar
  // train --precision bf16: BF16 payloads unless a leg's flag says otherwise).
  void default_unset_to(const CLI::App& cmd, const std::string& format);
};

void add_precision_flags(CLI::App* cmd, PrecisionFlags& flags);

}  // namespace expar::cli
