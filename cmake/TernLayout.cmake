# The build half of the dependency rule (docs/architecture.md, "The rule"):
#
# * tern_headers(): which headers a library sees and shows. There is no
#   global include path: each library declares its own.
# * Once every folder has declared its targets, tern_check_link_edges()
#   writes each library's folder, sources and link edges to
#   ${CMAKE_BINARY_DIR}/tern_links.tsv and runs scripts/check_layout.py over
#   them; a bad edge stops configure.
#
# Include this file from the top-level CMakeLists.txt after TERN_CHECK_LAYOUT
# is set and before the module folders; it defers its checks to the end of
# the top-level directory.

# tern_headers(<library> PRIVATE|PUBLIC|TREE)
#
# Headers are included by their repository path ("agent/relay/relay.h",
# "tern/patch.h"). Every library sees include/ (tern/*.h) and shows it to its
# dependents. Its own folder's headers it reaches through a build-tree copy
# of the repository that holds only that folder (symbolic links under
# ${CMAKE_BINARY_DIR}/headers/), so that a library cannot include the private
# headers of a module it does not link:
#   PRIVATE  the folder's headers are the library's own (patch/, xfer/,
#            a backend's folder);
#   PUBLIC   they are meant for its dependents too (base/ and format/, the
#            floors; agent's rooms for the rooms above; transport/'s shared
#            helpers and transport/net/ for the backends);
#   TREE     the whole repository, PUBLIC: test and benchmark support
#            libraries (tern_test_certs, the etcd test server), which only
#            tests link (scripts/check_layout.py checks it).
# Executables are leaves (tests, benchmarks, tools: nothing links them) and
# see the whole repository; the #include check holds them to the rule.
function(tern_headers target scope)
  if(NOT scope MATCHES "^(PRIVATE|PUBLIC|TREE)$")
    message(FATAL_ERROR "tern_headers(${target} ${scope}): PRIVATE, PUBLIC or TREE")
  endif()
  get_target_property(type ${target} TYPE)
  set(shown PUBLIC)
  if(type STREQUAL "INTERFACE_LIBRARY")
    set(shown INTERFACE)
  endif()
  target_include_directories(${target} ${shown} ${CMAKE_SOURCE_DIR}/include)
  if(scope STREQUAL "TREE")
    target_include_directories(${target} ${shown} ${CMAKE_SOURCE_DIR})
  else()
    get_target_property(dir ${target} SOURCE_DIR)
    tern_folder_headers(${dir} root)
    if(scope STREQUAL "PRIVATE" AND NOT shown STREQUAL "INTERFACE")
      target_include_directories(${target} PRIVATE ${root})
    else()
      target_include_directories(${target} ${shown} ${root})
    endif()
  endif()
  set_property(TARGET ${target} PROPERTY TERN_HEADERS ${scope})
endfunction()

# A directory that holds DIR (absolute, inside the repository) at its
# repository path and nothing else: ${CMAKE_BINARY_DIR}/headers/<a+b>/a/b ->
# the source folder. A folder that holds other libraries' folders
# (transport/ holds net/, tcp/, ...: sub-folders with a CMakeLists.txt) is
# linked entry by entry without them, and re-linked when an entry comes or
# goes (a CONFIGURE_DEPENDS glob re-runs configure).
function(tern_folder_headers dir out)
  file(RELATIVE_PATH folder ${CMAKE_SOURCE_DIR} ${dir})
  string(REPLACE "/" "+" key "${folder}")
  set(root ${CMAKE_BINARY_DIR}/headers/${key})
  set(${out} ${root} PARENT_SCOPE)
  get_property(done GLOBAL PROPERTY TERN_HEADERS_${key})
  if(done)
    return()
  endif()
  set_property(GLOBAL PROPERTY TERN_HEADERS_${key} ON)
  file(REMOVE_RECURSE ${root})
  get_filename_component(parent ${root}/${folder} DIRECTORY)
  file(MAKE_DIRECTORY ${parent})
  file(GLOB entries LIST_DIRECTORIES true CONFIGURE_DEPENDS ${dir}/*)
  set(rooms "")
  foreach(entry IN LISTS entries)
    if(IS_DIRECTORY ${entry} AND EXISTS ${entry}/CMakeLists.txt)
      list(APPEND rooms ${entry})
    endif()
  endforeach()
  if(NOT rooms)
    file(CREATE_LINK ${dir} ${root}/${folder} SYMBOLIC)
    return()
  endif()
  file(MAKE_DIRECTORY ${root}/${folder})
  foreach(entry IN LISTS entries)
    if(NOT entry IN_LIST rooms)
      get_filename_component(name ${entry} NAME)
      file(CREATE_LINK ${entry} ${root}/${folder}/${name} SYMBOLIC)
    endif()
  endforeach()
endfunction()

# Executables see the whole repository; every library must have said what
# it sees (tern_headers).
function(tern_check_headers)
  tern_targets_below(${CMAKE_SOURCE_DIR} targets)
  set(missing "")
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "EXECUTABLE")
      target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR})
    elseif(type MATCHES "_LIBRARY$")
      get_target_property(scope ${t} TERN_HEADERS)
      if(NOT scope)
        list(APPEND missing ${t})
      endif()
    endif()
  endforeach()
  if(missing)
    message(FATAL_ERROR "These libraries do not say which headers they see and show: ${missing}. "
                        "Add tern_headers(<library> PRIVATE|PUBLIC|TREE) after add_library "
                        "(cmake/TernLayout.cmake).")
  endif()
endfunction()

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

cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL tern_check_headers)
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL tern_check_link_edges)
