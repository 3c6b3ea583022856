// A gtest suite that shares one real etcd on loopback (etcd_test_server.h):
// started before the suite's first test, stopped after its last. A test
// skips when there is no etcd binary (kUnsupported) and fails when etcd
// would not start. Tests only.
//
//   class MyEtcdTest : public SharedEtcdTest<MyEtcdTest> {
//     void SetUp() override {
//       SharedEtcdTest::SetUp();
//       if (IsSkipped() || HasFatalFailure()) return;
//       ... etcd().endpoint() ...
//     }
//   };
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "agent/testing/etcd_test_server.h"

namespace tern::agent {

// Suite: the derived fixture, so that each suite has its own etcd.
template <class Suite>
class SharedEtcdTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto s = EtcdTestServer::Start();
    if (s.ok()) {
      server_ = std::move(*s);
    } else {
      start_error_ = std::make_unique<Status>(s.status());
    }
  }
  static void TearDownTestSuite() {
    server_.reset();
    start_error_.reset();
  }
  void SetUp() override {
    if (server_ != nullptr) return;
    if (start_error_ && start_error_->code() == Code::kUnsupported)
      GTEST_SKIP() << start_error_->ToString();
    FAIL() << (start_error_ ? start_error_->ToString() : "no etcd");
  }

  static EtcdTestServer& etcd() { return *server_; }

 private:
  inline static std::unique_ptr<EtcdTestServer> server_;
  inline static std::unique_ptr<Status> start_error_;
};

}  // namespace tern::agent
