// EXPAR_CHECK (core/error.hpp) and EXPAR_ASSERT (core/assert.hpp): a user error reads as the message it was
// given; a broken internal invariant reads as "internal error" with the file and line of the assert, is still
// an expar::Error (so a rank that hits it goes down like any other failure), and is an expar::InternalError
// (so tests can tell them apart).
#include <gtest/gtest.h>

#include <string>

#include "expar/core/assert.hpp"
#include "expar/core/tensor.hpp"

namespace expar {
namespace {

std::string message_of_assert(int value, int& line) {
  try {
    line = __LINE__ + 1;
    EXPAR_ASSERT(value < 3, "value {} escaped its range", value);
  } catch (const InternalError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Error, AssertSaysInternalErrorWithFileAndLine) {
  int line = 0;
  EXPECT_EQ(message_of_assert(2, line), "(no error)");
  const std::string m = message_of_assert(7, line);
  EXPECT_NE(m.find("internal error at "), std::string::npos) << m;
  EXPECT_NE(m.find("error_test.cpp:" + std::to_string(line) + ":"), std::string::npos) << m;
  EXPECT_NE(m.find("`value < 3` does not hold: value 7 escaped its range"), std::string::npos) << m;
}

TEST(Error, AssertIsAnExparErrorAndCheckIsNotInternal) {
  EXPECT_THROW(EXPAR_ASSERT(false, "always"), Error);
  try {
    EXPAR_CHECK(false, "flag --x={} must be positive: use --x=1", -1);
    FAIL() << "EXPAR_CHECK(false) must throw";
  } catch (const InternalError&) {
    FAIL() << "a user error must not read as an internal one";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "flag --x=-1 must be positive: use --x=1");
  }
}

// An invariant of the library itself: a tensor read as the wrong dtype is a bug in the caller.
TEST(Error, TensorInvariantsAreInternalErrors) {
  Tensor t = Tensor::zeros({2, 3});
  EXPECT_THROW(t.data<int32_t>(), InternalError);
  EXPECT_THROW(t.rows(1, 3), InternalError);
  EXPECT_THROW(t.reshape({4}), InternalError);
  EXPECT_THROW(t.dim(2), InternalError);
}

}  // namespace
}  // namespace expar
