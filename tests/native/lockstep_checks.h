// The checks of lockstep_kernels.cpp: the first failed expectation is kept in
// `failure` (the program prints it), and an expected error must name every needle.
#pragma once

#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr unsigned kFull = 0xffffffffu;
std::string failure;

void expect(bool ok, const std::string& what) {
  if (!ok && failure.empty()) failure = what;
}

template <class T>
void expect_eq(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (!(got[i] == want[i])) {
      expect(false, std::string(what) + ": element " + std::to_string(i) + " is " +
                        std::to_string(got[i]) + ", CUDA gives " + std::to_string(want[i]));
      return;
    }
  }
}

/// Runs a launch that must fail: its message must contain every piece of `needles`.
void expect_error(const std::function<void()>& launch, std::vector<std::string> needles) {
  try {
    launch();
  } catch (const std::runtime_error& e) {
    for (const std::string& needle : needles) {
      expect(std::strstr(e.what(), needle.c_str()) != nullptr,
             "the error '" + std::string(e.what()) + "' does not say '" + needle + "'");
    }
    return;
  }
  expect(false, "the launch ran without the expected error");
}

}  // namespace
