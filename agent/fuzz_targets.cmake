# Fuzzers for signed manifests (see tests/fuzz/CMakeLists.txt).
tern_fuzzer(version_manifest_fuzzer SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_manifest.cc
            LIBS tern_agent_manifest
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/version_manifest)
tern_fuzzer(agent_control_fuzzer SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_control.cc
            LIBS tern_agent_control
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/agent_control)
tern_fuzzer(board_record_fuzzer SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_board_record.cc
            LIBS tern_agent_board
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/board_record)

tern_fuzzer(etcd_json_fuzzer SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_etcd_json.cc
            LIBS tern_agent_etcd nlohmann_json::nlohmann_json
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/etcd_json)
