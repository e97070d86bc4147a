#pragma once
// expect_error(f, {"part", ...}): f must throw expar::Error whose message contains every part (a test of an
// error message names what the user must read: the value, the rule, the fix).
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "expar/core/error.hpp"

namespace expar::testing {

inline void expect_error(const std::function<void()>& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "expected an expar::Error";
  } catch (const Error& e) {
    for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace expar::testing
