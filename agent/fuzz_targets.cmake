# Fuzzers for signed manifests (see tests/fuzz/CMakeLists.txt).
tern_fuzzer(version_manifest_fuzzer SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_manifest.cc
            LIBS tern_agent_manifest
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/version_manifest)
