#include "expar/io/tokenizer/regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "expar/core/error.hpp"

namespace expar::tok {

// The match data is per thread: PCRE2 writes into it during a match, and a Tokenizer may be shared by
// threads that encode at the same time.
struct Regex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

namespace {

struct MatchData {
  pcre2_match_data* data = pcre2_match_data_create(4, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
  MatchData() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~MatchData() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

MatchData& thread_match_data() {
  thread_local MatchData m;
  return m;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

Regex::Regex(std::string_view pattern, std::string_view label, bool caseless)
    : pattern_(pattern), impl_(std::make_unique<Impl>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
  if (caseless) options |= PCRE2_CASELESS;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error,
                              &offset, nullptr);
  EXPAR_CHECK(impl_->code != nullptr,
              "{}: regex {:?} does not compile (PCRE2: {} at offset {}): fix the pattern", label,
              std::string(pattern), pcre2_message(error), offset);
  // JIT is an optimisation: where the platform lacks it, pcre2_match interprets the same pattern.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

std::pair<size_t, size_t> Regex::find(std::string_view text, size_t from) const {
  MatchData& m = thread_match_data();
  // The text was validated as UTF-8 when it entered the tokenizer, so PCRE2 need not check it again on
  // every call (that check would make splitting quadratic).
  const int rc = pcre2_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), from,
                             PCRE2_NO_UTF_CHECK, m.data, m.context);
  if (rc == PCRE2_ERROR_NOMATCH) return {std::string_view::npos, std::string_view::npos};
  EXPAR_CHECK(rc >= 0, "regex {:?} failed on a text of {} bytes (PCRE2: {})", pattern_, text.size(),
              pcre2_message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(m.data);
  return {ovector[0], ovector[1]};
}

}  // namespace expar::tok
