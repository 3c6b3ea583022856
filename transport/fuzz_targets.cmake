# Fuzzers for every decoder of peer bytes in the transport (see
# tests/fuzz/CMakeLists.txt): TCP frames and handshake frames, the UCX wire
# (pure code, built even without UCX), xfer messages and resume state.
tern_fuzzer(tcp_frame_fuzz SOURCES ${CMAKE_CURRENT_LIST_DIR}/tcp/fuzz_frame.cc LIBS tern_transport
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/tcp_frame)
tern_fuzzer(ucx_wire_fuzz
            SOURCES ${CMAKE_CURRENT_LIST_DIR}/ucx/fuzz_wire.cc ${CMAKE_CURRENT_LIST_DIR}/ucx/wire.cc
            LIBS tern_common
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/ucx_wire)
tern_fuzzer(xfer_wire_fuzz SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_xfer.cc LIBS tern_transport
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/xfer_wire)
tern_fuzzer(verbs_wire_fuzz
            SOURCES ${CMAKE_CURRENT_LIST_DIR}/verbs/fuzz_wire.cc ${CMAKE_CURRENT_LIST_DIR}/verbs/wire.cc
            LIBS tern_common
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/verbs_wire)
