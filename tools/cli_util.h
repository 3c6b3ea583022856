// Helpers shared by the subcommands: mapped patch files, atomic file writes,
// the flags every writing command has (-o, --force, --threads), and
// human-readable sizes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "tern/env.h"
#include "tern/thread_pool.h"
#include "tern/status.h"
#include "tools/cli_args.h"

namespace tern::cli {

// A read-only mapping of a whole file (patches can be many GB).
Result<std::unique_ptr<MappedFile>> MapReadOnly(const std::string& path);

// tern::WriteFileAtomic on the DefaultEnv(), with the hint a user needs
// when path exists and !overwrite. On error nothing is left.
Status WriteFileAtomic(const std::string& path, std::span<const uint8_t> bytes, bool overwrite);

// -o/--out PATH (required): where a command writes its result.
CLI::Option* AddOutputFlag(CLI::App& cmd, std::string& path, const std::string& help);
// --force: replace an existing output (docs/cli.md: outputs are never
// replaced without it).
CLI::Option* AddForceFlag(CLI::App& cmd, bool& force, const std::string& help);
// --threads N (0: one per core), at most 1024.
CLI::Option* AddThreadsFlag(CLI::App& cmd, unsigned& threads);

// "1.23 GB", "512 B" (decimal units).
std::string HumanBytes(uint64_t bytes);

// A secret (a token) from a file, never from the command line where `ps`
// shows it, else from the environment variable `env_name`; "" when neither
// is given. Trailing newlines dropped; a file over 64 KiB is refused.
Result<std::string> ReadSecret(const std::string& file, const char* env_name);
// --admin-cacert: the PEM CA file an admin port's certificate must chain to
// ("" when no file is given: the system's trust store).
Result<std::string> ReadAdminCa(const std::string& path);

// Monotonic seconds.
double NowSeconds();

}  // namespace tern::cli
