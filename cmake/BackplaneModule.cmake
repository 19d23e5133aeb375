# backplane_module(<name> SOURCES <file>... [PUBLIC <target>...] [PRIVATE <target>...])
# One layer of the stack (docs/architecture.md): the library backplane_<name>, exported and
# aliased as backplane::<name>, with its public headers in <name>/include.
function(backplane_module name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;PUBLIC;PRIVATE")
  set(target backplane_${name})
  add_library(${target} ${arg_SOURCES})
  add_library(backplane::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${target} PUBLIC ${arg_PUBLIC} PRIVATE ${arg_PRIVATE})
endfunction()
