# Fails when an #include points up the layers. Run as a test:
#   cmake -DSOURCE_DIR=<source dir> -P cmake/CheckLayers.cmake
# The layers and what each may include are those of docs/architecture.md; keep the two in step.

# The backend SDK: header-only, what a backend compiles against. It includes only itself.
set(sdk_headers backplane/sdk/backend.hpp backplane/sdk/op_rules.hpp backplane/core/status.hpp
                backplane/core/tensor.hpp backplane/core/operator.hpp backplane/core/options.hpp)

# <module>: the modules whose public headers (backplane/<module>/...) it may include.
set(allowed_core core sdk)
set(allowed_loader core sdk loader)
set(allowed_watcher core sdk watcher)
set(allowed_scheduler core sdk scheduler)
set(allowed_onnx core sdk onnx)
set(allowed_registry core sdk loader watcher registry)
set(allowed_runtime core sdk loader scheduler onnx registry runtime)
set(allowed_server core sdk loader watcher scheduler onnx registry runtime)
set(modules core loader watcher scheduler onnx registry runtime server)

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
