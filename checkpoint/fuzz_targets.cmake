# The safetensors header parser sees untrusted bytes: fuzz it.
tern_fuzzer(safetensors_header_fuzz
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/safetensors_header_fuzz.cc
  LIBS tern_checkpoint
  CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/safetensors_header)
