#include "tools/cli_util.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "tern/agent.h"
#include "tern/env.h"

namespace tern::cli {

Result<std::unique_ptr<MappedFile>> MapReadOnly(const std::string& path) {
  return DefaultEnv().Map(path, MapMode::kReadOnly);
}

Status WriteFileAtomic(const std::string& path, std::span<const uint8_t> bytes, bool overwrite) {
  Status st = tern::WriteFileAtomic(DefaultEnv(), path, bytes, overwrite);
  if (st.code() == Code::kAlreadyExists)
    return TERN_ERROR(kAlreadyExists, path, " exists (use --force to replace it)");
  return st;
}

CLI::Option* AddOutputFlag(CLI::App& cmd, std::string& path, const std::string& help) {
  return cmd.add_option("-o,--out", path, help)->type_name("PATH")->required();
}

CLI::Option* AddForceFlag(CLI::App& cmd, bool& force, const std::string& help) {
  return cmd.add_flag("--force", force, help);
}

CLI::Option* AddThreadsFlag(CLI::App& cmd, unsigned& threads) {
  return AddUnsigned(cmd, "--threads", threads, "worker threads (0: one per core)", "0", 1024);
}

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void AddAdminTlsFlags(CLI::App& cmd, AdminTlsArgs& a, const std::string& whose) {
  cmd.add_option(
      "--admin-cacert", a.cacert,
      "PEM CA file " + whose +
          " admin certificate must chain to (https://; default: the system's trust store)");
  cmd.add_option("--admin-cert", a.cert,
                 "PEM client certificate for an admin port that requires one (https://; its "
                 "--admin-tls-client-ca signed it)");
  cmd.add_option("--admin-key", a.key, "PEM private key of --admin-cert (unencrypted)");
}

Status ReadPemFlags(std::initializer_list<PemFlag> flags) {
  for (const PemFlag& f : flags) {
    if (f.path->empty()) continue;
    Status read = ReadFileToString(DefaultEnv(), *f.path, 64 << 10, f.pem);
    if (!read.ok()) return read.WithContext(f.flag);
  }
  return Status::Ok();
}

Status ReadAdminTls(const AdminTlsArgs& a, AgentClientOptions& o) {
  TERN_REQUIRE(a.cert.empty() == a.key.empty(), kInvalidArgument,
               "give both --admin-cert and --admin-key, or neither");
  return ReadPemFlags({{&a.cacert, &o.ca_pem, "--admin-cacert"},
                       {&a.cert, &o.cert_pem, "--admin-cert"},
                       {&a.key, &o.key_pem, "--admin-key"}});
}

Result<std::string> ReadSecret(const std::string& file, const char* env_name) {
  std::string out;
  if (!file.empty()) {
    TERN_RETURN_IF_ERROR(ReadFileToString(DefaultEnv(), file, 64 << 10, &out));
  } else if (const char* v = std::getenv(env_name)) {
    out = v;
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

}  // namespace tern::cli
