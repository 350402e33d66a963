# Install rules of the C++ package (component "dev"; the Python wheel installs
# only the component "python", the tool is the component "tool"):
#   <prefix>/include/dsa/*.hpp                      public headers
#   <prefix>/<libdir>/libdsa_indexer.a              the static library
#   <prefix>/<libdir>/cmake/dsa_indexer/            config, version and exported targets
# so that another project can
#   find_package(dsa_indexer REQUIRED)
#   target_link_libraries(app PRIVATE dsa::indexer)

include(CMakePackageConfigHelpers)

set(DSA_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/dsa_indexer"
    CACHE STRING "Where the CMake package files go, relative to the install prefix")
mark_as_advanced(DSA_INSTALL_CMAKEDIR)

install(TARGETS dsa_indexer EXPORT dsa_indexerTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/dsa
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev
        FILES_MATCHING PATTERN "*.hpp")
install(EXPORT dsa_indexerTargets
        FILE dsa_indexerTargets.cmake
        NAMESPACE dsa::
        DESTINATION ${DSA_INSTALL_CMAKEDIR} COMPONENT dev)

configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/dsa_indexerConfig.cmake.in
  ${PROJECT_BINARY_DIR}/dsa_indexerConfig.cmake
  INSTALL_DESTINATION ${DSA_INSTALL_CMAKEDIR}
  NO_SET_AND_CHECK_MACRO)
# Before 1.0 a new minor version may change the API: 0.1.x accepts a request
# for 0.1 or 0.1.y (y <= x), not for 0.2.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/dsa_indexerConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dsa_indexerConfig.cmake
              ${PROJECT_BINARY_DIR}/dsa_indexerConfigVersion.cmake
        DESTINATION ${DSA_INSTALL_CMAKEDIR} COMPONENT dev)
