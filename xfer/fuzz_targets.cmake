# Fuzzer for xfer messages and resume state (see tests/fuzz/CMakeLists.txt).
tern_fuzzer(xfer_wire_fuzz SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_xfer.cc LIBS tern_xfer
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/xfer_wire)
