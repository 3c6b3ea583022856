# The link half of the dependency rule (docs/architecture.md, "The rule"):
# once every folder has declared its targets, tern_check_link_edges() writes
# each library's folder, sources and link edges to ${CMAKE_BINARY_DIR}/
# tern_links.tsv and runs scripts/check_layout.py over them; a bad edge stops
# configure. Include this file from the top-level CMakeLists.txt after
# TERN_CHECK_LAYOUT is set; it defers the check to the end of the directory.

# Every target declared in DIR and below.
function(tern_targets_below dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    tern_targets_below(${sub} below)
    list(APPEND targets ${below})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# Repository-relative form of PATH (absolute or relative to FOLDER).
function(tern_relative_path path folder out)
  if(NOT IS_ABSOLUTE "${path}")
    set(path "${folder}/${path}")
  endif()
  file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR} ${path})
  set(${out} ${rel} PARENT_SCOPE)
endfunction()

function(tern_check_link_edges)
  tern_targets_below(${CMAKE_SOURCE_DIR} targets)
  set(table "")
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(NOT type MATCHES "_LIBRARY$")
      continue()
    endif()
    get_target_property(dir ${t} SOURCE_DIR)
    tern_relative_path(${dir} ${CMAKE_SOURCE_DIR} folder)
    get_target_property(sources ${t} SOURCES)
    set(rel_sources "")
    foreach(s IN LISTS sources)
      if(s AND NOT s MATCHES "^\\$<")
        tern_relative_path(${s} ${dir} rel)
        list(APPEND rel_sources ${rel})
      endif()
    endforeach()
    # LINK_LIBRARIES: PRIVATE and PUBLIC edges; INTERFACE_LINK_LIBRARIES adds
    # INTERFACE ones (and wraps a static library's PRIVATE ones in LINK_ONLY).
    set(links "")
    foreach(prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
      get_target_property(items ${t} ${prop})
      foreach(item IN LISTS items)
        if(item MATCHES "^\\$<LINK_ONLY:(.*)>$")
          set(item ${CMAKE_MATCH_1})
        endif()
        if(item AND NOT item MATCHES "^\\$<" AND TARGET ${item})
          list(APPEND links ${item})
        endif()
      endforeach()
    endforeach()
    list(REMOVE_DUPLICATES links)
    list(JOIN rel_sources ";" sources_text)
    list(JOIN links ";" links_text)
    string(APPEND table "${t}\t${type}\t${folder}\t${sources_text}\t${links_text}\n")
  endforeach()
  set(file ${CMAKE_BINARY_DIR}/tern_links.tsv)
  file(WRITE ${file} "${table}")
  execute_process(COMMAND ${TERN_CHECK_LAYOUT} -q --links ${file} ${CMAKE_SOURCE_DIR}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "The targets break the dependency rule:\n${out}")
  endif()
endfunction()

cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL tern_check_link_edges)
