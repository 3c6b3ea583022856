// Resolving client file names inside the served root (sandbox.h).
#include "xfer/server/sandbox.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/text.h"
#include "xfer/xfer_wire.h"

namespace tern::xfer {

Result<Sandbox> Sandbox::Open(const std::string& root) {
  char real[PATH_MAX];
  TERN_REQUIRE(::realpath(root.c_str(), real) != nullptr, kNotFound, "cannot serve '", root,
               "': ", std::strerror(errno));
  struct stat st {};
  TERN_REQUIRE(::stat(real, &st) == 0 && (S_ISDIR(st.st_mode) || S_ISREG(st.st_mode)),
               kInvalidArgument, "'", root, "' is neither a directory nor a regular file");
  return Sandbox(real, S_ISREG(st.st_mode));
}

bool Sandbox::Inside(const std::string& path) const {
  // realpath never ends a path in '/' except "/" itself, so "/" is the one
  // root whose children do not start with root + "/".
  if (root_ == "/") return path.size() > 1 && path[0] == '/';
  return path.size() > root_.size() && path.compare(0, root_.size(), root_) == 0 &&
         path[root_.size()] == '/';
}

Result<std::string> Sandbox::Resolve(std::string_view name) const {
  TERN_REQUIRE(!name.empty() && name.size() <= kMaxNameBytes && name.find('\0') == std::string_view::npos,
               kInvalidArgument, "bad file name");
  if (root_is_file_) {
    const std::string base = root_.substr(root_.find_last_of('/') + 1);
    TERN_REQUIRE(name == base, kNotFound, "this server serves only '", base, "'");
    return root_;
  }
  TERN_REQUIRE(name[0] != '/', kInvalidArgument, "absolute path refused: '", Printable(name), "'");
  for (size_t at = 0; at <= name.size();) {
    const size_t end = std::min(name.find('/', at), name.size());
    TERN_REQUIRE(name.substr(at, end - at) != "..", kInvalidArgument, "path escapes the served root: '",
                 Printable(name), "'");
    at = end + 1;
  }
  const std::string joined = (root_ == "/" ? "" : root_) + "/" + std::string(name);
  char real[PATH_MAX];
  TERN_REQUIRE(::realpath(joined.c_str(), real) != nullptr, kNotFound, "no file '", Printable(name), "'");
  std::string r(real);
  TERN_REQUIRE(Inside(r), kInvalidArgument, "path escapes the served root: '", Printable(name), "'");
  return r;
}

}  // namespace tern::xfer
