# backplane_add_backend(<target> VENDOR <vendor> NAME <name> [VERSION x.y.z]
#                       SOURCES <src>... [EXPORTS <symbol>...] [LINK_LIBRARIES <lib>...]
#                       [OUTPUT_DIRECTORY <dir>])
#
# Builds a dynamic backend <vendor>_<name>_backend.so that Backplane can load, replace and unload.
# With VERSION the file is <vendor>_<name>_backend.so.x.y.z and the names .so, .so.x and .so.x.y
# are symlinks to it, as in the ArmNN note. The flags are the ones without which a backend cannot
# be unloaded or replaced safely (docs/loading-rules.md rule 4):
#   -fvisibility=hidden, -fno-gnu-unique   no STB_GNU_UNIQUE symbols that would pin the library
#   a version script                       exports only the entry points (plus EXPORTS)
#   -Wl,-z,defs                            an unresolved symbol fails the build, not the deploy
#   -Wl,-z,now                             symbols bind at dlopen, never at a first call
#   -Wl,-z,noexecstack                     the host refuses executable-stack libraries
# Link only system libraries the host also uses (e.g. TBB::tbb); never bundle your own copies.
function(backplane_add_backend target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "VENDOR;NAME;VERSION;OUTPUT_DIRECTORY"
                        "SOURCES;EXPORTS;LINK_LIBRARIES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "backplane_add_backend(${target}): unknown arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  foreach(part VENDOR NAME)
    if(NOT arg_${part} MATCHES "^[A-Za-z0-9]+$")
      message(FATAL_ERROR "backplane_add_backend(${target}): ${part} '${arg_${part}}' must be "
                          "letters and digits only (file name <vendor>_<name>_backend.so)")
    endif()
  endforeach()
  if(NOT arg_SOURCES)
    message(FATAL_ERROR "backplane_add_backend(${target}): SOURCES is required")
  endif()
  if(arg_VERSION AND NOT arg_VERSION MATCHES "^[0-9]+(\\.[0-9]+)*$")
    message(FATAL_ERROR "backplane_add_backend(${target}): VERSION '${arg_VERSION}' must be digits and dots")
  endif()
  if(NOT arg_OUTPUT_DIRECTORY)
    set(arg_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
  endif()

  set(base_name "${arg_VENDOR}_${arg_NAME}_backend")
  add_library(${target} MODULE ${arg_SOURCES})
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME "${base_name}"
    SUFFIX ".so"
    LIBRARY_OUTPUT_DIRECTORY "${arg_OUTPUT_DIRECTORY}"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    POSITION_INDEPENDENT_CODE ON)
  if(arg_VERSION)
    set_target_properties(${target} PROPERTIES SUFFIX ".so.${arg_VERSION}")
    target_compile_definitions(${target} PRIVATE BACKPLANE_BACKEND_RELEASE="${arg_VERSION}")
  endif()

  set(exports GetBackendId GetVersion BackendFactory GetBackendRelease GetBackendFactoryError
              ${arg_EXPORTS})
  list(JOIN exports "; " export_list)
  set(version_script "${CMAKE_CURRENT_BINARY_DIR}/${target}.version-script")
  file(CONFIGURE OUTPUT "${version_script}" CONTENT "{\n  global: ${export_list};\n  local: *;\n};\n")

  # GCC only: clang never emits STB_GNU_UNIQUE symbols and has no such flag.
  target_compile_options(${target} PRIVATE $<$<CXX_COMPILER_ID:GNU>:-fno-gnu-unique>)
  target_link_options(${target} PRIVATE
    "LINKER:--version-script=${version_script}" "LINKER:-z,defs" "LINKER:-z,now"
    "LINKER:-z,noexecstack")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${version_script}")
  target_link_libraries(${target} PRIVATE backplane::sdk ${arg_LINK_LIBRARIES})

  if(arg_VERSION)
    # .so, .so.x and .so.x.y point at the real file, like a distribution's shared libraries.
    string(REPLACE "." ";" parts "${arg_VERSION}")
    set(link_names "${base_name}.so")
    set(prefix "${base_name}.so")
    list(LENGTH parts count)
    math(EXPR last "${count} - 2")
    if(last GREATER_EQUAL 0)
      foreach(i RANGE 0 ${last})
        list(GET parts ${i} part)
        string(APPEND prefix ".${part}")
        list(APPEND link_names "${prefix}")
      endforeach()
    endif()
    foreach(link_name IN LISTS link_names)
      add_custom_command(TARGET ${target} POST_BUILD
        COMMAND ${CMAKE_COMMAND} -E create_symlink "${base_name}.so.${arg_VERSION}" "${link_name}"
        WORKING_DIRECTORY "${arg_OUTPUT_DIRECTORY}" VERBATIM)
    endforeach()
  endif()
endfunction()
