// dynemb torch layer: every registered op runs in an OpScope naming it, so that a kernel
// launch that fails names its op (csrc/cuda/launch_check.h).
//
//   DYNEMB_IMPL(m, "table_find", &Impl::find)   registers Impl::find as dynemb.table_find,
//                                               called inside OpScope("table_find")
#pragma once

#include <cstddef>
#include <utility>

#include "cuda/launch_check.h"

namespace dynemb {

/// A string literal as a template argument (its text lives as long as the program).
template <size_t N>
struct OpName {
  char text[N];
  constexpr OpName(const char (&s)[N]) {  // NOLINT: implicit, from the literal
    for (size_t i = 0; i < N; ++i) text[i] = s[i];
  }
};

template <OpName Name, auto Fn>
struct ScopedOp;

template <OpName Name, class R, class... A, R (*Fn)(A...)>
struct ScopedOp<Name, Fn> {
  static R call(A... args) {
    OpScope scope(Name.text);
    return Fn(std::forward<A>(args)...);
  }
};

}  // namespace dynemb

#define DYNEMB_IMPL(m, name, fn) (m).impl(name, &::dynemb::ScopedOp<name, fn>::call)
