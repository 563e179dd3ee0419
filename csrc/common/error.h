// Error messages without iostreams: a message is concatenated from strings and numbers (std::to_string) and
// thrown as std::runtime_error (Python sees RuntimeError). Formatting numbers through std::ostream inside an
// extension built with one libstdc++ and loaded next to another has been seen to crash; this path cannot.
#pragma once
#include <stdexcept>
#include <string>
#include <type_traits>

namespace dsv4::detail {

inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, const std::string& v) { s += v; }
inline void append(std::string& s, char v) { s += v; }
template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, char>>>
void append(std::string& s, T v) {
  s += std::to_string(v);
}

template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::string message;
  (append(message, parts), ...);
  throw std::runtime_error(message);
}

}  // namespace dsv4::detail

// Throws std::runtime_error with the concatenated message parts when cond is false.
#define DSV4_REQUIRE(cond, ...)                         \
  do {                                                  \
    if (!(cond)) ::dsv4::detail::fail(__VA_ARGS__);     \
  } while (0)
