// Path-name helpers shared by every Env user (pure string functions, no I/O).
#pragma once

#include <string>

namespace tern {

// Plain name: non-empty, no '/', no NUL, not "." or "..".
bool PlainFileName(const std::string& name);
// "a/b/c" -> "a/b", "c" -> ".", "/c" -> "/" (trailing slashes ignored).
std::string ParentDir(const std::string& path);
// "a/b/c" -> "c" (trailing slashes ignored).
std::string BaseName(const std::string& path);
// 16 random hex digits from getrandom(): names for temporaries that two
// writers will not both pick (O_EXCL / mkdir catch the rest).
std::string RandomHex();

}  // namespace tern
