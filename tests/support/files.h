// Files for tests: a temporary directory, and reading a whole file.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace tern::testing {

// A fresh directory under gtest's temporary directory, removed with
// everything in it when the object goes away.
class TempDir {
 public:
  // `prefix` names the directory (prefix_XXXXXX) so a leftover is traceable.
  explicit TempDir(const std::string& prefix = "tern") {
    std::string tmpl = (std::filesystem::path(::testing::TempDir()) / (prefix + "_XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << tmpl << " failed";
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The bytes of a file ("" when it cannot be read).
inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace tern::testing
