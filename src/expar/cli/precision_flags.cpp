#include "expar/cli/precision_flags.hpp"

#include "expar/cli/option_checks.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/payload_codec.hpp"

namespace expar::cli {

namespace {

PayloadFormat parse_one(const char* flag, const std::string& name) {
  try {
    return payload_format_from_name(name);
  } catch (const Error& e) {
    fail("{} {}: {}", flag, name, e.what());
  }
}

}  // namespace

PayloadPrecision PrecisionFlags::parse() const {
  return {parse_one("--dispatch-precision", dispatch), parse_one("--combine-precision", combine),
          parse_one("--combine-grad-precision", combine_grad),
          parse_one("--dispatch-grad-precision", dispatch_grad)};
}

void PrecisionFlags::default_unset_to(const CLI::App& cmd, const std::string& format) {
  for (auto [flag, value] : {std::pair{"--dispatch-precision", &dispatch},
                             {"--combine-precision", &combine},
                             {"--combine-grad-precision", &combine_grad},
                             {"--dispatch-grad-precision", &dispatch_grad}})
    if (cmd.count(flag) == 0) *value = format;
}

void add_precision_flags(CLI::App* cmd, PrecisionFlags& flags) {
  std::vector<std::string> formats;
  for (PayloadFormat f : payload_formats()) formats.emplace_back(payload_format_name(f));
  cmd->add_option(
         "--dispatch-precision", flags.dispatch,
         "payload of dispatch forward (token rows to the experts; kept encoded as the Wgrad input): " +
             choices(formats) + " (mxfp8: E4M3 + E8M0 per 32); paths " +
             paths_with(&PathTraits::reduced_precision))
      ->capture_default_str();
  cmd->add_option("--combine-precision", flags.combine, "payload of combine forward (expert outputs back)")
      ->capture_default_str();
  cmd->add_option("--combine-grad-precision", flags.combine_grad,
                  "payload of combine backward (w * grad_y rows to the experts)")
      ->capture_default_str();
  cmd->add_option("--dispatch-grad-precision", flags.dispatch_grad,
                  "payload of dispatch backward (expert input gradients back)")
      ->capture_default_str();
}

}  // namespace expar::cli
