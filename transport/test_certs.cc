#include "transport/test_certs.h"

#include <cstdlib>
#include <filesystem>

namespace tern::testing {

namespace {
bool Run(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

bool MakeCa(const std::string& dir, const std::string& name) {
  return Run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " +
             dir + "/" + name + ".key -out " + dir + "/" + name + ".pem -days 2 -subj /CN=" + name);
}

bool MakeLeaf(const std::string& dir, const std::string& name, const std::string& ca) {
  const std::string p = dir + "/" + name;
  return Run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + p +
             ".key -out " + p + ".csr -subj /CN=" + name) &&
         Run("openssl x509 -req -in " + p + ".csr -CA " + dir + "/" + ca + ".pem -CAkey " + dir +
             "/" + ca + ".key -CAcreateserial -out " + p + ".pem -days 2");
}

TestPki Generate() {
  TestPki pki;
  char tmpl[] = "/tmp/tern-pki-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    pki.error = "mkdtemp failed";
    return pki;
  }
  const std::string dir = tmpl;
  // Throwaway keys: removed when the test process exits.
  static struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup;
  cleanup.dir = dir;
  if (!MakeCa(dir, "ca") || !MakeCa(dir, "rogue-ca") || !MakeLeaf(dir, "server", "ca") ||
      !MakeLeaf(dir, "client", "ca") || !MakeLeaf(dir, "other-client", "ca") ||
      !MakeLeaf(dir, "rogue", "rogue-ca")) {
    pki.error = "openssl CLI failed to generate test certificates in " + dir;
    return pki;
  }
  auto conf = [&](const std::string& leaf) {
    return TlsConfig{true, dir + "/" + leaf + ".pem", dir + "/" + leaf + ".key", dir + "/ca.pem"};
  };
  pki.server = conf("server");
  pki.client = conf("client");
  pki.other_client = conf("other-client");
  pki.rogue_client = conf("rogue");
  pki.ok = true;
  return pki;
}
}  // namespace

const TestPki& TestCerts() {
  static const TestPki pki = Generate();
  return pki;
}

}  // namespace tern::testing
