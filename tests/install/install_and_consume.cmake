# cmake -P script of the test install.find_package (variables from
# CMakeLists.txt beside it):
#   1. cmake --install BUILD_DIR --component dev into PREFIX (emptied first)
#      and check the prefix holds the headers, the library and the package
#      files, and nothing else;
#   2. configure CONSUMER_SOURCE with CMAKE_PREFIX_PATH=PREFIX (same generator,
#      compiler, flags and build type) and check find_package took the package
#      from PREFIX;
#   3. build it and run it: it checks results of the public API itself.
cmake_minimum_required(VERSION 3.24)

# Runs a command; on failure ends the test with its output.
function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${what} failed (${result}):\n${ARGN}\n${output}")
  endif()
  set(step_output "${output}" PARENT_SCOPE)
endfunction()

set(config_args)
if(CONFIG)
  set(config_args --config ${CONFIG})
endif()

# 1. Install.
file(REMOVE_RECURSE "${PREFIX}" "${CONSUMER_BUILD}")
step("cmake --install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${PREFIX}" --component dev ${config_args})
set(expected
  "${INCLUDEDIR}/dsa/dsa.hpp"
  "${LIBDIR}/${LIBRARY_NAME}"
  "${CMAKEDIR}/dsa_indexerConfig.cmake"
  "${CMAKEDIR}/dsa_indexerConfigVersion.cmake"
  "${CMAKEDIR}/dsa_indexerTargets.cmake")
foreach(file IN LISTS expected)
  if(NOT EXISTS "${PREFIX}/${file}")
    message(FATAL_ERROR "cmake --install did not install ${file}:\n${step_output}")
  endif()
endforeach()
file(GLOB_RECURSE installed RELATIVE "${PREFIX}" "${PREFIX}/*")
foreach(file IN LISTS installed)
  if(NOT file MATCHES "^${INCLUDEDIR}/dsa/[a-z_]+\\.hpp$" AND NOT file IN_LIST expected
     AND NOT file MATCHES "^${CMAKEDIR}/dsa_indexerTargets-[a-z]+\\.cmake$")
    message(FATAL_ERROR "the component dev installed ${file}, which is not part of the C++ package")
  endif()
endforeach()

# 2. Configure the consumer.
set(configure_args -S "${CONSUMER_SOURCE}" -B "${CONSUMER_BUILD}" -G "${GENERATOR}"
    "-DCMAKE_PREFIX_PATH=${PREFIX}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
    "-DREQUIRED_VERSION=${VERSION}")
foreach(option IN ITEMS GENERATOR_PLATFORM:-A GENERATOR_TOOLSET:-T)
  string(REPLACE ":" ";" option "${option}")
  list(GET option 0 variable)
  list(GET option 1 flag)
  if(${variable})
    list(APPEND configure_args ${flag} "${${variable}}")
  endif()
endforeach()
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CONFIG)
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${CONFIG}")
endif()
if(WITH_CUDA)
  list(APPEND configure_args "-DCUDAToolkit_ROOT=${CUDA_ROOT}")
endif()
step("configuring the consumer" ${CMAKE_COMMAND} ${configure_args})
file(STRINGS "${CONSUMER_BUILD}/CMakeCache.txt" found_dir REGEX "^dsa_indexer_DIR:")
string(REGEX REPLACE "^[^=]*=" "" found_dir "${found_dir}")
if(NOT found_dir STREQUAL "${PREFIX}/${CMAKEDIR}")
  message(FATAL_ERROR "find_package(dsa_indexer) took '${found_dir}', not the package in ${PREFIX}/${CMAKEDIR}")
endif()

# 3. Build and run.
step("building the consumer" ${CMAKE_COMMAND} --build "${CONSUMER_BUILD}" ${config_args})
set(program "${CONSUMER_BUILD}/dsa_consumer${EXE_SUFFIX}")
if(CONFIG AND EXISTS "${CONSUMER_BUILD}/${CONFIG}/dsa_consumer${EXE_SUFFIX}")
  set(program "${CONSUMER_BUILD}/${CONFIG}/dsa_consumer${EXE_SUFFIX}")  # multi-config generators
endif()
step("running the consumer" "${program}")
message(STATUS "${step_output}")
