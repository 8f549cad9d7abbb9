// The one place that turns a run-time word count (64-bit words per configuration, 1..kMaxWords)
// into a compile-time template argument. Host code only (C++ and the host side of .cu files):
//
//   return csk::with_words(words, [&](auto W) { return kernel_impl<W.value>(...); });
#pragma once
#include <stdexcept>
#include <string>
#include <type_traits>

#include "hd.hpp"

namespace csk {

template <int W>
using Words = std::integral_constant<int, W>;

template <typename F>
decltype(auto) with_words(int words, F&& f) {
  static_assert(kMaxWords == 4, "with_words lists the word counts 1..4");
  switch (words) {
    case 1:
      return f(Words<1>{});
    case 2:
      return f(Words<2>{});
    case 3:
      return f(Words<3>{});
    case 4:
      return f(Words<4>{});
    default:
      throw std::invalid_argument("configurations must have 1.." + std::to_string(kMaxWords) +
                                  " 64-bit words, got " + std::to_string(words));
  }
}

}  // namespace csk
