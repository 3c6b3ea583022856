#include "transport/tcp/tls_identity.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

namespace tern::tcp {

namespace {

// Names as RFC 6125 wants them matched: DNS SANs only (never the subject's
// CN), a wildcard only as a whole left-most label.
constexpr unsigned kHostFlags =
    X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS | X509_CHECK_FLAG_NEVER_CHECK_SUBJECT;

std::string StripBrackets(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    return host.substr(1, host.size() - 2);
  return host;
}

bool IsIpLiteral(const std::string& name) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, name.c_str(), buf) == 1 ||
         ::inet_pton(AF_INET6, name.c_str(), buf) == 1;
}

// A DNS name or IP literal as a reference identity (no wildcard).
Status CheckName(const std::string& name, const char* what) {
  const bool chars_ok = std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == ':';
  });
  TERN_REQUIRE(!name.empty() && name.size() <= 253 && chars_ok, kInvalidArgument, "TLS ", what,
               " '", name.substr(0, 64), "': want a DNS name or an IP address");
  return Status::Ok();
}

// Certificate text shown in errors: printable ASCII, bounded (the peer chose it).
std::string Printable(const unsigned char* data, int size) {
  std::string out;
  for (int i = 0; i < size && i < 80; ++i)
    out += data[i] > 0x20 && data[i] < 0x7f ? char(data[i]) : '?';
  if (size > 80) out += "...";
  return out;
}

std::string Subject(X509* cert) {
  char buf[256];
  if (cert == nullptr || X509_NAME_oneline(X509_get_subject_name(cert), buf, sizeof buf) == nullptr)
    return "?";
  return Printable(reinterpret_cast<const unsigned char*>(buf), static_cast<int>(std::strlen(buf)));
}

// "DNS:a, IP:10.0.0.1" from the subjectAltName, at most 8 shown.
std::string CertNames(X509* cert) {
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  std::string out;
  int shown = 0, total = 0;
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
    std::string one;
    if (n->type == GEN_DNS) {
      one =
          "DNS:" + Printable(ASN1_STRING_get0_data(n->d.dNSName), ASN1_STRING_length(n->d.dNSName));
    } else if (n->type == GEN_IPADD) {
      const int len = ASN1_STRING_length(n->d.iPAddress);
      char text[INET6_ADDRSTRLEN] = "?";
      if (len == 4 || len == 16) {
        ::inet_ntop(len == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(n->d.iPAddress), text,
                    sizeof text);
      }
      one = std::string("IP:") + text;
    } else {
      continue;
    }
    if (++total <= 8) out += (shown++ ? ", " : "") + one;
  }
  GENERAL_NAMES_free(names);
  if (total == 0)
    return "no DNS or IP name; subject " + Subject(cert) + ", whose CN is not checked";
  if (total > shown) out += " and " + std::to_string(total - shown) + " more";
  return out;
}

bool HoldsName(X509* cert, const std::string& name) {
  if (IsIpLiteral(name)) return X509_check_ip_asc(cert, name.c_str(), 0) == 1;
  return X509_check_host(cert, name.data(), name.size(), kHostFlags, nullptr) == 1;
}

std::string Hex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

// Checks on a leaf whose chain verified: the server's allow-list of
// clients, the pins. Empty: accepted.
std::string CheckLeaf(const PeerCheck& v, X509* cert, const char* whose) {
  const auto& allowed = v.rules->client_names;
  if (v.server && !allowed.empty() &&
      std::none_of(allowed.begin(), allowed.end(),
                   [&](const std::string& n) { return HoldsName(cert, n); })) {
    std::string list;
    for (size_t i = 0; i < allowed.size() && i < 8; ++i) list += (i ? ", " : "") + allowed[i];
    if (allowed.size() > 8) list += ", ...";
    return std::string(whose) + " names " + CertNames(cert) + ": none of the allowed clients (" +
           list + ")";
  }
  const auto& pins = v.rules->pins;
  if (!pins.empty()) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (X509_digest(cert, EVP_sha256(), md, &n) != 1) return "cannot hash the peer's certificate";
    const std::string digest(reinterpret_cast<char*>(md), n);
    if (std::find(pins.begin(), pins.end(), digest) == pins.end()) {
      return std::string(whose) + " (" + Subject(cert) + ") has fingerprint sha256:" + Hex(digest) +
             ", which is not pinned";
    }
  }
  return {};
}

}  // namespace

Result<std::string> ParseSha256Pin(const std::string& text) {
  const std::string prefix = "sha256:";
  TERN_REQUIRE(text.size() <= prefix.size() + 95 && text.compare(0, prefix.size(), prefix) == 0,
               kInvalidArgument, "TLS pin '", text.substr(0, 40), "': want sha256:<64 hex digits>");
  std::string hex;
  for (size_t i = prefix.size(); i < text.size(); ++i) {
    if (text[i] != ':') hex += text[i];
  }
  TERN_REQUIRE(
      hex.size() == 64 && hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos,
      kInvalidArgument, "TLS pin '", text.substr(0, 40), "...': want sha256:<64 hex digits>");
  std::string raw(32, '\0');
  for (size_t i = 0; i < 32; ++i)
    raw[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return raw;
}

Result<PeerRules> PeerRules::FromConfig(const TlsConfig& config) {
  TERN_REQUIRE(
      config.client_names.size() <= kMaxTlsNames && config.peer_sha256.size() <= kMaxTlsNames,
      kInvalidArgument, "TLS: more than ", kMaxTlsNames, " client names or pins");
  PeerRules rules;
  if (!config.server_name.empty()) {
    rules.server_name = StripBrackets(config.server_name);
    TERN_RETURN_IF_ERROR(CheckName(rules.server_name, "server name"));
  }
  for (const std::string& name : config.client_names) {
    rules.client_names.push_back(StripBrackets(name));
    TERN_RETURN_IF_ERROR(CheckName(rules.client_names.back(), "client name"));
  }
  for (const std::string& pin : config.peer_sha256) {
    TERN_ASSIGN_OR_RETURN(std::string raw, ParseSha256Pin(pin));
    rules.pins.push_back(std::move(raw));
  }
  return rules;
}

Status PeerCheck::ExpectServer(SSL* ssl, const std::string& dialled_host) {
  // The CA alone vouches for every host it signed, the client included:
  // the server must be the one we dialled (or were told to expect).
  expected = rules->server_name.empty() ? StripBrackets(dialled_host) : rules->server_name;
  TERN_REQUIRE(!expected.empty(), kInvalidArgument,
               "TLS: no server name to check the certificate against (dial HOST:PORT)");
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  X509_VERIFY_PARAM_set_hostflags(param, kHostFlags);
  const bool set = IsIpLiteral(expected)
                       ? X509_VERIFY_PARAM_set1_ip_asc(param, expected.c_str()) == 1
                       : SSL_set1_host(ssl, expected.c_str()) == 1 &&
                             SSL_set_tlsext_host_name(ssl, expected.c_str()) == 1;
  TERN_REQUIRE(set, kInvalidArgument, "TLS: cannot expect server name '", expected.substr(0, 64),
               "'");
  return Status::Ok();
}

// OpenSSL's verify callback: called per certificate of the chain, with
// ok = 0 where OpenSSL found a fault (CA, validity, purpose, name), and
// with ok = 1 for the leaf once the chain verified.
int VerifyPeer(int ok, X509_STORE_CTX* store) {
  auto* ssl =
      static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* v = ssl == nullptr ? nullptr : static_cast<PeerCheck*>(SSL_get_app_data(ssl));
  if (v == nullptr || v->rules == nullptr) return ok;
  X509* cert = X509_STORE_CTX_get_current_cert(store);
  const char* whose = v->server ? "the client's certificate" : "the server's certificate";
  if (!ok) {
    const int err = X509_STORE_CTX_get_error(store);
    if (!v->failure.empty()) return 0;
    if (err == X509_V_ERR_HOSTNAME_MISMATCH || err == X509_V_ERR_IP_ADDRESS_MISMATCH) {
      v->failure = std::string(whose) + " does not name " + v->expected + " (it names " +
                   CertNames(cert) +
                   "): dial a name it holds, or set the name to expect (--tls-server-name)";
    } else {
      const int depth = X509_STORE_CTX_get_error_depth(store);
      v->failure = std::string(whose) + (depth > 0 ? " chain" : "") + " (" + Subject(cert) +
                   "): " + X509_verify_cert_error_string(err);
    }
    return 0;
  }
  if (X509_STORE_CTX_get_error_depth(store) != 0 || cert == nullptr) return 1;
  std::string why = CheckLeaf(*v, cert, whose);
  if (why.empty()) return 1;
  if (v->failure.empty()) v->failure = std::move(why);
  X509_STORE_CTX_set_error(store, X509_V_ERR_APPLICATION_VERIFICATION);
  return 0;
}

}  // namespace tern::tcp
