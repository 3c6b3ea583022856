// TLS material, client connections and servers for cpp-httplib
// (agent/https/https_tls.h).
#include "agent/https/https_tls.h"

#include <httplib.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <pthread.h>

#include <cerrno>
#include <climits>
#include <vector>

namespace tern::agent {
namespace {

// Bounds on what we parse: a CA bundle or a chain of a few certificates,
// not the world.
constexpr size_t kMaxPemBytes = size_t{64} << 10;
constexpr int kMaxCaCerts = 64;

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;
using BioPtr = std::unique_ptr<BIO, BioFree>;

// A PEM key protected by a passphrase would make OpenSSL prompt on the
// terminal; a daemon has none to give.
int NoPassphrase(char*, int, int, void*) { return -1; }

BioPtr MemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

}  // namespace

struct HttpsClientTls::Material {
  STACK_OF(X509) * ca = nullptr;  // owned; null: the system's trust store
  X509Ptr cert;
  KeyPtr key;
  ~Material() {
    if (ca != nullptr) sk_X509_pop_free(ca, X509_free);
  }
};

namespace {

// The last verification failure of a handshake on this thread (cpp-httplib
// runs the handshake on the calling thread); read and cleared by
// HandshakeError.
thread_local long t_verify_error = X509_V_OK;

// Replaces OpenSSL's chain check: with our CA, trust comes from that stack
// only (arg), never from the system's store; without one, from the
// store's default paths. The name check rides along (the context's
// X509_VERIFY_PARAM names the host). Remembers why it failed.
int VerifyServer(X509_STORE_CTX* ctx, void* arg) {
  if (arg != nullptr) X509_STORE_CTX_set0_trusted_stack(ctx, static_cast<STACK_OF(X509)*>(arg));
  const int ok = X509_verify_cert(ctx);
  if (ok != 1) t_verify_error = X509_STORE_CTX_get_error(ctx);
  return ok;
}

}  // namespace

SigpipeBlock::SigpipeBlock() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &old_);
  was_blocked_ = sigismember(&old_, SIGPIPE) == 1;
  sigset_t pending;
  sigemptyset(&pending);
  was_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
}

SigpipeBlock::~SigpipeBlock() {
  if (!was_blocked_ && !was_pending_) {
    sigset_t pending;
    sigemptyset(&pending);
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      const timespec now{0, 0};
      while (sigtimedwait(&pipe, nullptr, &now) < 0 && errno == EINTR) {
      }
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

HttpsClientTls::HttpsClientTls(std::unique_ptr<Material> material)
    : material_(std::move(material)) {}
HttpsClientTls::~HttpsClientTls() = default;

bool HttpsClientTls::has_client_cert() const { return material_->cert != nullptr; }
bool HttpsClientTls::has_ca() const { return material_->ca != nullptr; }

Result<std::unique_ptr<HttpsClientTls>> HttpsClientTls::Create(const std::string& ca_pem,
                                                               const std::string& cert_pem,
                                                               const std::string& key_pem,
                                                               const TlsNames& names) {
  const std::string& what = names.what;
  for (const std::string* pem : {&ca_pem, &cert_pem, &key_pem}) {
    TERN_REQUIRE(pem->size() <= kMaxPemBytes, kInvalidArgument, what, ": a PEM of ", pem->size(),
                 " bytes (max ", kMaxPemBytes, ")");
  }
  TERN_REQUIRE(cert_pem.empty() == key_pem.empty(), kInvalidArgument, what,
               ": give both a client certificate (", names.cert_flag, ") and its key (",
               names.key_flag, "), or neither");
  auto m = std::make_unique<Material>();
  ERR_clear_error();
  if (!ca_pem.empty()) {
    BioPtr bio = MemBio(ca_pem);
    TERN_REQUIRE(bio != nullptr, kResourceExhausted, what, ": out of memory");
    m->ca = sk_X509_new_null();
    TERN_REQUIRE(m->ca != nullptr, kResourceExhausted, what, ": out of memory");
    while (true) {
      X509* x = PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr);
      if (x == nullptr) break;
      if (sk_X509_num(m->ca) >= kMaxCaCerts || sk_X509_push(m->ca, x) == 0) {
        X509_free(x);
        return TERN_ERROR(kInvalidArgument, what, ": the CA file (", names.ca_flag, ") holds over ",
                          kMaxCaCerts, " certificates");
      }
    }
    ERR_clear_error();  // the end of the PEM stream reads as an error
    TERN_REQUIRE(sk_X509_num(m->ca) > 0, kInvalidArgument, what, ": the CA file (", names.ca_flag,
                 ") holds no PEM certificate");
  }
  if (!cert_pem.empty()) {
    BioPtr bio = MemBio(cert_pem);
    TERN_REQUIRE(bio != nullptr, kResourceExhausted, what, ": out of memory");
    m->cert.reset(PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr));
    TERN_REQUIRE(m->cert != nullptr, kInvalidArgument, what, ": the client certificate file (",
                 names.cert_flag, ") holds no PEM certificate");
    BioPtr key_bio = MemBio(key_pem);
    TERN_REQUIRE(key_bio != nullptr, kResourceExhausted, what, ": out of memory");
    m->key.reset(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, NoPassphrase, nullptr));
    ERR_clear_error();
    TERN_REQUIRE(m->key != nullptr, kInvalidArgument, what, ": the client key file (",
                 names.key_flag, ") holds no unencrypted PEM private key");
    TERN_REQUIRE(X509_check_private_key(m->cert.get(), m->key.get()) == 1, kInvalidArgument, what,
                 ": the client key (", names.key_flag, ") does not match the client certificate (",
                 names.cert_flag, ")");
    ERR_clear_error();
  }
  return std::unique_ptr<HttpsClientTls>(new HttpsClientTls(std::move(m)));
}

Result<std::unique_ptr<httplib::ClientImpl>> HttpsClientTls::Connect(const std::string& host,
                                                                     int port) const {
  auto client =
      std::make_unique<httplib::SSLClient>(host, port, material_->cert.get(), material_->key.get());
  TERN_REQUIRE(client->is_valid() && client->ssl_context() != nullptr, kInternal,
               "TLS: cannot set up a TLS context: ", OpenSslError());
  // OpenSSL verifies, during the handshake; cpp-httplib's own check (after
  // it) is off: see HandshakeError in the header.
  client->enable_server_certificate_verification(false);
  SSL_CTX* ctx = client->ssl_context();
  TERN_REQUIRE(SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) == 1, kInternal,
               "TLS: cannot require TLS 1.2");
  if (material_->ca == nullptr) {
    TERN_REQUIRE(SSL_CTX_set_default_verify_paths(ctx) == 1, kInternal,
                 "TLS: cannot load the system's trust store: ", OpenSslError());
  }
  SSL_CTX_set_cert_verify_callback(ctx, VerifyServer, material_->ca);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  std::string name = host;
  if (name.size() > 2 && name.front() == '[' && name.back() == ']')
    name = name.substr(1, name.size() - 2);
  X509_VERIFY_PARAM* param = SSL_CTX_get0_param(ctx);
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  // An IP literal must be an IP subjectAltName; anything else a DNS one.
  const bool ip = X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str()) == 1;
  ERR_clear_error();  // not an IP literal: the expected answer for a name
  if (!ip) {
    TERN_REQUIRE(X509_VERIFY_PARAM_set1_host(param, name.c_str(), name.size()) == 1, kInternal,
                 "TLS: cannot set the name to verify: ", OpenSslError());
  }
  return std::unique_ptr<httplib::ClientImpl>(std::move(client));
}

std::string HttpsClientTls::HandshakeError(bool* server_refused) {
  std::string out;
  const long verify = t_verify_error;
  t_verify_error = X509_V_OK;
  if (verify != X509_V_OK) out = X509_verify_cert_error_string(verify);
  if (server_refused != nullptr) *server_refused = verify != X509_V_OK;
  const std::string openssl = OpenSslError();
  if (!openssl.empty()) out += (out.empty() ? "" : "; ") + openssl;
  return out;
}

Result<std::unique_ptr<httplib::Server>> NewHttpsServer(const std::string& cert_pem,
                                                        const std::string& key_pem,
                                                        const TlsNames& names,
                                                        const std::string& client_ca_pem) {
  const std::string& what = names.what;
  TERN_REQUIRE(cert_pem.size() <= kMaxPemBytes && key_pem.size() <= kMaxPemBytes &&
                   client_ca_pem.size() <= kMaxPemBytes,
               kInvalidArgument, what, ": a PEM over ", kMaxPemBytes, " bytes");
  std::vector<X509Ptr> client_cas;
  if (!client_ca_pem.empty()) {
    BioPtr bio = MemBio(client_ca_pem);
    TERN_REQUIRE(bio != nullptr, kResourceExhausted, what, ": out of memory");
    while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr)) {
      client_cas.emplace_back(x);
      TERN_REQUIRE(client_cas.size() <= kMaxCaCerts, kInvalidArgument, what,
                   ": the client CA file (", names.ca_flag, ") holds over ", kMaxCaCerts,
                   " certificates");
    }
    ERR_clear_error();  // the end of the PEM stream reads as an error
    TERN_REQUIRE(!client_cas.empty(), kInvalidArgument, what, ": the client CA file (",
                 names.ca_flag, ") holds no PEM certificate");
  }
  ERR_clear_error();
  std::vector<X509Ptr> chain;  // the leaf, then intermediates
  {
    BioPtr bio = MemBio(cert_pem);
    TERN_REQUIRE(bio != nullptr, kResourceExhausted, what, ": out of memory");
    while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr)) {
      chain.emplace_back(x);
      TERN_REQUIRE(chain.size() <= kMaxCaCerts, kInvalidArgument, what, ": the certificate file (",
                   names.cert_flag, ") holds over ", kMaxCaCerts, " certificates");
    }
    ERR_clear_error();  // the end of the PEM stream reads as an error
  }
  TERN_REQUIRE(!chain.empty(), kInvalidArgument, what, ": the certificate file (", names.cert_flag,
               ") holds no PEM certificate");
  KeyPtr key;
  {
    BioPtr bio = MemBio(key_pem);
    TERN_REQUIRE(bio != nullptr, kResourceExhausted, what, ": out of memory");
    key.reset(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
    ERR_clear_error();
  }
  TERN_REQUIRE(key != nullptr, kInvalidArgument, what, ": the key file (", names.key_flag,
               ") holds no unencrypted PEM private key");
  TERN_REQUIRE(X509_check_private_key(chain[0].get(), key.get()) == 1, kInvalidArgument, what,
               ": the key (", names.key_flag, ") does not match the certificate (", names.cert_flag,
               ")");
  ERR_clear_error();
  // SSL_CTX_use_* take their own references: the PEM objects die here.
  bool set_up = false;
  auto server = std::make_unique<httplib::SSLServer>([&](SSL_CTX& ctx) {
    set_up = SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION) == 1 &&
             SSL_CTX_use_certificate(&ctx, chain[0].get()) == 1 &&
             SSL_CTX_use_PrivateKey(&ctx, key.get()) == 1;
    for (size_t i = 1; set_up && i < chain.size(); ++i) {
      set_up = SSL_CTX_add1_chain_cert(&ctx, chain[i].get()) == 1;
    }
    if (set_up && !client_cas.empty()) {
      // The context's store starts empty (no default paths): these CAs
      // alone are trusted for clients. Their names go in the
      // CertificateRequest so that a client can pick its certificate.
      X509_STORE* store = SSL_CTX_get_cert_store(&ctx);
      STACK_OF(X509_NAME)* names_list = sk_X509_NAME_new_null();
      set_up = store != nullptr && names_list != nullptr;
      for (const X509Ptr& ca : client_cas) {
        if (!set_up) break;
        X509_NAME* name = X509_NAME_dup(X509_get_subject_name(ca.get()));
        set_up = X509_STORE_add_cert(store, ca.get()) == 1 && name != nullptr &&
                 sk_X509_NAME_push(names_list, name) > 0;
        if (!set_up && name != nullptr) X509_NAME_free(name);
      }
      if (set_up) {
        SSL_CTX_set_client_CA_list(&ctx, names_list);  // takes the list
      } else if (names_list != nullptr) {
        sk_X509_NAME_pop_free(names_list, X509_NAME_free);
      }
      SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
      SSL_CTX_set_verify_depth(&ctx, 8);
    }
    return set_up;
  });
  TERN_REQUIRE(set_up && server->is_valid(), kInternal, what,
               ": cannot set up a TLS context: ", OpenSslError());
  return std::unique_ptr<httplib::Server>(std::move(server));
}

}  // namespace tern::agent
