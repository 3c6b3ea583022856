#include "transport/test_certs.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

namespace tern::testing {

namespace {
bool Run(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

bool MakeCa(const std::string& dir, const std::string& name) {
  return Run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " +
             dir + "/" + name + ".key -out " + dir + "/" + name + ".pem -days 2 -subj /CN=" + name);
}

bool MakeLeaf(const std::string& dir, const std::string& name, const std::string& ca,
              const std::string& sans, const std::string& eku = "") {
  const std::string p = dir + "/" + name;
  {
    std::ofstream ext(p + ".ext");
    if (!sans.empty()) ext << "subjectAltName=" << sans << "\n";
    if (!eku.empty()) ext << "extendedKeyUsage=" << eku << "\n";
    if (!ext) return false;
  }
  return Run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + p +
             ".key -out " + p + ".csr -subj /CN=" + name) &&
         Run("openssl x509 -req -in " + p + ".csr -CA " + dir + "/" + ca + ".pem -CAkey " + dir +
             "/" + ca + ".key -CAcreateserial -out " + p + ".pem -days 2 -extfile " + p + ".ext");
}

TlsConfig Conf(const std::string& dir, const std::string& leaf) {
  TlsConfig c;
  c.enabled = true;
  c.cert_file = dir + "/" + leaf + ".pem";
  c.key_file = dir + "/" + leaf + ".key";
  c.ca_file = dir + "/ca.pem";
  return c;
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
  if (!MakeCa(dir, "ca") || !MakeCa(dir, "rogue-ca") ||
      !MakeLeaf(dir, "server", "ca", "DNS:localhost,IP:127.0.0.1,IP:::1") ||
      !MakeLeaf(dir, "client", "ca", "DNS:client.tern.test") ||
      !MakeLeaf(dir, "other-client", "ca", "DNS:other-client.tern.test") ||
      !MakeLeaf(dir, "rogue", "rogue-ca", "DNS:localhost,IP:127.0.0.1")) {
    pki.error = "openssl CLI failed to generate test certificates in " + dir;
    return pki;
  }
  pki.dir = dir;
  pki.server = Conf(dir, "server");
  pki.client = Conf(dir, "client");
  pki.other_client = Conf(dir, "other-client");
  pki.rogue_client = Conf(dir, "rogue");
  pki.ok = true;
  return pki;
}
}  // namespace

const TestPki& TestCerts() {
  static const TestPki pki = Generate();
  return pki;
}

Result<TlsConfig> MintCert(const std::string& name, const std::string& sans,
                           const std::string& eku) {
  const TestPki& pki = TestCerts();
  TERN_REQUIRE(pki.ok, kUnavailable, pki.error);
  TERN_REQUIRE(!name.empty() && name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") ==
                                    std::string::npos,
               kInvalidArgument, "test certificate name '", name, "'");
  static std::mutex mu;
  static std::map<std::string, std::string> minted;  // name -> sans + eku
  std::lock_guard<std::mutex> lock(mu);
  auto it = minted.find(name);
  if (it == minted.end()) {
    TERN_REQUIRE(MakeLeaf(pki.dir, name, "ca", sans, eku), kInternal, "openssl CLI failed to mint ",
                 name);
    minted[name] = sans + "|" + eku;
  } else {
    TERN_REQUIRE(it->second == sans + "|" + eku, kInvalidArgument, "test certificate ", name,
                 " minted before with other names");
  }
  return Conf(pki.dir, name);
}

Result<std::string> CertSha256(const std::string& pem_file) {
  FILE* f = std::fopen(pem_file.c_str(), "r");
  TERN_REQUIRE(f != nullptr, kIo, "cannot open ", pem_file);
  X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  TERN_REQUIRE(cert != nullptr, kInvalidArgument, "no certificate in ", pem_file);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  const bool ok = X509_digest(cert, EVP_sha256(), md, &n) == 1;
  X509_free(cert);
  TERN_REQUIRE(ok, kInternal, "cannot hash ", pem_file);
  std::string out = "sha256:";
  char hex[3];
  for (unsigned int i = 0; i < n; ++i) {
    std::snprintf(hex, sizeof hex, "%02x", md[i]);
    out += hex;
  }
  return out;
}

}  // namespace tern::testing
