# The safetensors header and index parsers see untrusted bytes: fuzz them.
tern_fuzzer(safetensors_header_fuzz
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/safetensors_header_fuzz.cc
  LIBS tern_checkpoint
  CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/safetensors_header)
tern_fuzzer(safetensors_index_fuzz
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/safetensors_index_fuzz.cc
  LIBS tern_checkpoint
  CORPUS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/safetensors_index)
