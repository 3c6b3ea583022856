// Helpers shared by the subcommands: mapped patch files, atomic file writes,
// the flags every writing command has (-o, --force, --threads), and
// human-readable sizes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

#include "tern/env.h"
#include "tern/thread_pool.h"
#include "tern/status.h"
#include "tools/cli_args.h"

namespace tern {
struct AgentClientOptions;
}  // namespace tern

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
// An admin client's TLS files: --admin-cacert (the CA the port's
// certificate must chain to; none: the system's trust store), and
// --admin-cert/--admin-key (our certificate, for a port that requires one:
// tern-agent --admin-tls-client-ca). `whose`: "the root's", "the agent's".
struct AdminTlsArgs {
  std::string cacert, cert, key;
};
void AddAdminTlsFlags(CLI::App& cmd, AdminTlsArgs& a, const std::string& whose);
// Reads them (each at most 64 KiB) into o.ca_pem, cert_pem, key_pem.
Status ReadAdminTls(const AdminTlsArgs& a, AgentClientOptions& o);

// A PEM file named by a flag: read (at most 64 KiB) into *pem unless the
// path is empty; an error names the flag.
struct PemFlag {
  const std::string* path;
  std::string* pem;
  const char* flag;
};
Status ReadPemFlags(std::initializer_list<PemFlag> flags);

// Monotonic seconds.
double NowSeconds();

}  // namespace tern::cli
