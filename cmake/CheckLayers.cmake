# Fails when an #include points up the layers. Run as a test:
#   cmake -DSOURCE_DIR=<source dir> -P cmake/CheckLayers.cmake
# The layers and what each may include are those of docs/architecture.md; keep the two in step.

# The backend SDK: header-only, what a backend compiles against. It includes only itself.
set(sdk_headers backplane/sdk/backend.hpp backplane/sdk/op_rules.hpp backplane/core/status.hpp
                backplane/core/tensor.hpp backplane/core/operator.hpp backplane/core/options.hpp
                backplane/core/thread_annotations.hpp backplane/sdk/thread_limits.hpp)

# <module>: the modules whose public headers (backplane/<module>/...) it may include.
set(allowed_core core sdk)
set(allowed_loader core sdk loader)
set(allowed_isolation core sdk loader isolation)  # loader: the worker's host services
set(allowed_watcher core sdk watcher)
set(allowed_scheduler core sdk scheduler)
set(allowed_onnx core sdk onnx)
set(allowed_registry core sdk loader isolation watcher registry)
set(allowed_runtime core sdk loader isolation scheduler onnx registry runtime)
set(allowed_server core sdk loader isolation watcher scheduler onnx registry runtime)
set(modules core loader isolation watcher scheduler onnx registry runtime server)

# The rooms of server/, which include each other as "<room>/<file>.hpp" (and the modules above
# as the server may): <room>: the rooms it may include.
set(allowed_room_config config)
set(allowed_room_metrics metrics)
set(allowed_room_http config metrics http)
set(allowed_room_rollout config metrics rollout)
set(allowed_room_serving config metrics rollout serving)
set(allowed_room_kserve_rest config metrics http serving kserve_rest)
set(allowed_room_kserve_grpc config metrics serving kserve_grpc)
set(allowed_room_admin config metrics http rollout serving admin)
set(allowed_room_cli config metrics http rollout serving kserve_rest kserve_grpc admin cli)
set(rooms config metrics rollout http serving kserve_rest kserve_grpc admin cli)

set(violations "")
function(check_file file allowed sdk_only)
  file(STRINGS "${file}" lines REGEX "^#include \"backplane/")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" header "${line}")
    string(REGEX REPLACE "^backplane/([^/]+)/.*" "\\1" module "${header}")
    if(sdk_only)
      list(FIND sdk_headers "${header}" found)
      set(ok TRUE)
      if(found EQUAL -1)
        set(ok FALSE)
      endif()
    else()
      list(FIND allowed "${module}" found)
      set(ok TRUE)
      if(found EQUAL -1)
        set(ok FALSE)
      endif()
    endif()
    if(NOT ok)
      file(RELATIVE_PATH relative "${SOURCE_DIR}" "${file}")
      set(violations "${violations}\n  ${relative} includes ${header}" PARENT_SCOPE)
    endif()
  endforeach()
endfunction()

foreach(module IN LISTS modules)
  file(GLOB_RECURSE files "${SOURCE_DIR}/${module}/*.hpp" "${SOURCE_DIR}/${module}/*.cpp"
                          "${SOURCE_DIR}/${module}/*.inl")
  foreach(file IN LISTS files)
    set(sdk_only FALSE)
    foreach(header IN LISTS sdk_headers)
      if(file STREQUAL "${SOURCE_DIR}/core/include/${header}")
        set(sdk_only TRUE)
      endif()
    endforeach()
    check_file("${file}" "${allowed_${module}}" ${sdk_only})
    set(violations "${violations}")
  endforeach()
endforeach()

function(check_room_file file room)
  file(STRINGS "${file}" lines REGEX "^#include \"[a-z_]+/")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" header "${line}")
    string(REGEX REPLACE "^([^/]+)/.*" "\\1" included "${header}")
    if(included STREQUAL "backplane")
      continue()  # a module's public header: checked above
    endif()
    list(FIND rooms "${included}" is_room)
    list(FIND allowed_room_${room} "${included}" allowed)
    if(is_room EQUAL -1 OR allowed EQUAL -1)
      file(RELATIVE_PATH relative "${SOURCE_DIR}" "${file}")
      set(violations "${violations}\n  ${relative} includes ${header}" PARENT_SCOPE)
    endif()
  endforeach()
endfunction()

foreach(room IN LISTS rooms)
  file(GLOB_RECURSE files "${SOURCE_DIR}/server/${room}/*.hpp" "${SOURCE_DIR}/server/${room}/*.cpp")
  foreach(file IN LISTS files)
    check_room_file("${file}" "${room}")
  endforeach()
endforeach()
# Every folder of server/ with code is a room of the list above.
file(GLOB server_entries LIST_DIRECTORIES true "${SOURCE_DIR}/server/*")
foreach(entry IN LISTS server_entries)
  get_filename_component(name "${entry}" NAME)
  if(IS_DIRECTORY "${entry}")
    list(FIND rooms "${name}" known)
    if(known EQUAL -1)
      set(violations "${violations}\n  server/${name}/ is not a room of CheckLayers.cmake")
    endif()
  endif()
endforeach()

# Backends and fixtures are built as a third-party author builds them: the SDK only.
file(GLOB_RECURSE backend_files "${SOURCE_DIR}/backends/*.hpp" "${SOURCE_DIR}/backends/*.cpp"
                                "${SOURCE_DIR}/tests/fixtures/*.hpp" "${SOURCE_DIR}/tests/fixtures/*.cpp"
                                "${SOURCE_DIR}/examples/hello_backend/hello_backend.cpp")
foreach(file IN LISTS backend_files)
  check_file("${file}" "" TRUE)
endforeach()

if(violations)
  message(FATAL_ERROR "includes that point up the layers (docs/architecture.md):${violations}")
endif()
message(STATUS "every include points down the layers")
