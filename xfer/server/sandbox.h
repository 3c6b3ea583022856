// The served root, and the only way a client's file name becomes a path.
//
// Contract: Resolve returns a real path (symlinks resolved) inside the root
// for a relative name, or refuses: an empty, overlong or NUL-carrying name
// (kInvalidArgument), an absolute one or one with a `..` component
// (kInvalidArgument, "escapes the served root"), one that does not exist
// (kNotFound), one that resolves outside the root, also through a symlink
// (kInvalidArgument). A root of "/" holds every absolute path. A root that
// is a regular file serves only that file, under its base name. Immutable
// after Open: Resolve may be called from any thread.
#pragma once

#include <string>
#include <string_view>

#include "tern/status.h"

namespace tern::xfer {

class Sandbox {
 public:
  // Resolves `root` (realpath); it must be a directory or a regular file.
  static Result<Sandbox> Open(const std::string& root);

  Result<std::string> Resolve(std::string_view name) const;
  const std::string& root() const { return root_; }

 private:
  Sandbox(std::string root, bool root_is_file) : root_(std::move(root)), root_is_file_(root_is_file) {}
  // Whether the real path `path` lies strictly below the root.
  bool Inside(const std::string& path) const;

  std::string root_;  // a real path: no trailing '/' unless it is "/"
  bool root_is_file_ = false;
};

}  // namespace tern::xfer
