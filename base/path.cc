#include "base/path.h"

#include <sys/random.h>
#include <unistd.h>

#include <cstdint>

namespace tern {

bool PlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos;
}

std::string ParentDir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string RandomHex() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) {
    // No entropy source: pid and address still make clashes unlikely.
    v = static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull ^ reinterpret_cast<uintptr_t>(&v);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 0; i < 16; ++i) out[i] = kHex[(v >> (4 * i)) & 0xF];
  return out;
}

}  // namespace tern
