// The text form of a FaultPolicy (TERN_TEST_FAULTS): every FaultPolicy field it names is set exactly, and
// anything malformed is refused (a soak with a typo must not run fault-free).
#include "transport/registry/test_faults.h"

#include <gtest/gtest.h>

namespace tern::transport_internal {
namespace {

TEST(TestFaults, SetsTheNamedFields) {
  Result<FaultPolicy> p = ParseFaultPolicy(
      "seed=7,corrupt_at_byte=100,tamper_at_byte=2000000,tamper_chunks=3,drop_after_bytes=5,"
      "drop_connections=2");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->seed, 7u);
  EXPECT_EQ(p->corrupt_at_byte, 100u);
  EXPECT_EQ(p->tamper_at_byte, 2000000u);
  EXPECT_EQ(p->tamper_chunks, 3u);
  EXPECT_EQ(p->drop_after_bytes, 5u);
  EXPECT_EQ(p->drop_connections, 2u);
}

TEST(TestFaults, LeavesTheRestAtTheirDefaults) {
  Result<FaultPolicy> p = ParseFaultPolicy("tamper_at_byte=0");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->tamper_at_byte, 0u);
  EXPECT_EQ(p->corrupt_at_byte, FaultPolicy{}.corrupt_at_byte);
  EXPECT_EQ(p->drop_after_bytes, 0u);
  EXPECT_EQ(p->tamper_chunks, 1u);
}

TEST(TestFaults, RefusesAnythingMalformed) {
  for (const char* text : {"", "seed", "seed=", "seed=x", "seed=-1", "sed=1", "seed=1,", ",seed=1",
                           "tamper_chunks=4294967296", "corrupt_at_byte=1 "}) {
    Result<FaultPolicy> p = ParseFaultPolicy(text);
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_EQ(p.status().code(), Code::kInvalidArgument) << text;
  }
}

}  // namespace
}  // namespace tern::transport_internal
