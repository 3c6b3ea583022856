# Fuzzers for the patch codec (see tests/fuzz/CMakeLists.txt).
tern_fuzzer(patch_decode_fuzzer SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_decode.cc LIBS tern_patch
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/patch_decode)
tern_fuzzer(patch_roundtrip_fuzzer SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_roundtrip.cc LIBS tern_patch
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/patch_roundtrip)
tern_fuzzer(patch_record_fuzzer SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_record.cc LIBS tern_patch
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/patch_record)
tern_fuzzer(patch_context_fuzzer SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_context.cc LIBS tern_patch
            CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/patch_context)
