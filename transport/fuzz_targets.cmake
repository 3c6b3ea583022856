# Fuzzers for every decoder of peer bytes in the transport (see
# tests/fuzz/CMakeLists.txt): TCP frames and handshake frames, the UCX wire
# (pure code, built even without UCX) and the verbs wire. xfer messages:
# xfer/fuzz_targets.cmake.
tern_fuzzer(tcp_frame_fuzz SOURCES ${CMAKE_CURRENT_LIST_DIR}/tcp/fuzz_frame.cc LIBS tern_transport_tcp
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/tcp_frame)
tern_fuzzer(ucx_wire_fuzz
            SOURCES ${CMAKE_CURRENT_LIST_DIR}/ucx/fuzz_wire.cc ${CMAKE_CURRENT_LIST_DIR}/ucx/wire.cc
            LIBS tern_base
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/ucx_wire)
tern_fuzzer(verbs_wire_fuzz
            SOURCES ${CMAKE_CURRENT_LIST_DIR}/verbs/fuzz_wire.cc ${CMAKE_CURRENT_LIST_DIR}/verbs/wire.cc
            LIBS tern_base
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/verbs_wire)
