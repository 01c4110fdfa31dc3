# Package export: lib/cmake/gradscope/{gradscopeConfig,gradscopeConfigVersion,gradscopeTargets}.cmake, so
# that another CMake project can `find_package(gradscope)` and link gradscope::common, gradscope::storage...
# Included at the END of the top-level CMakeLists.txt, after every part has added its targets to the
# gradscopeTargets export set with gradscope_install_library() (cmake/GradscopeInstallFunctions.cmake).
# tests/install/check_install.sh installs a build and compiles a consumer project against it.
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Where gradscopeConfig.cmake is installed, relative to the prefix: <libdir>/cmake/gradscope, unless
# GRADSCOPE_CMAKE_PACKAGE_DIR says otherwise. Not a cached default: the library directory changes with the
# prefix (lib/x86_64-linux-gnu under /usr on Debian, lib elsewhere), and the package must follow it.
set(GRADSCOPE_CMAKE_PACKAGE_DIR "" CACHE STRING
    "Where gradscopeConfig.cmake is installed, relative to the prefix; empty: <libdir>/cmake/gradscope")
mark_as_advanced(GRADSCOPE_CMAKE_PACKAGE_DIR)
set(GRADSCOPE_INSTALL_CMAKEDIR "${GRADSCOPE_CMAKE_PACKAGE_DIR}")
if(NOT GRADSCOPE_INSTALL_CMAKEDIR)
  set(GRADSCOPE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/gradscope")
endif()

get_property(_gs_exported GLOBAL PROPERTY GRADSCOPE_EXPORTED_TARGETS)
if(NOT _gs_exported)
  # install(EXPORT) of an empty set is a configure error; say what is missing instead.
  message(WARNING "No library called gradscope_install_library(); no CMake package will be installed")
  return()
endif()

install(EXPORT gradscopeTargets
  NAMESPACE gradscope::
  FILE gradscopeTargets.cmake
  DESTINATION ${GRADSCOPE_INSTALL_CMAKEDIR}
  COMPONENT ${GRADSCOPE_DEV_COMPONENT})

get_property(_gs_extra_dependencies GLOBAL PROPERTY GRADSCOPE_EXTRA_DEPENDENCIES)
list(JOIN _gs_extra_dependencies "\n" GRADSCOPE_EXTRA_DEPENDENCIES)
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/gradscopeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/gradscopeConfig.cmake
  INSTALL_DESTINATION ${GRADSCOPE_INSTALL_CMAKEDIR})
# A consumer asking for 1.2 accepts any 1.x >= 1.2 (and, before 1.0, any 0.x >= the version asked for).
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/gradscopeConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/gradscopeConfig.cmake
  ${PROJECT_BINARY_DIR}/gradscopeConfigVersion.cmake
  DESTINATION ${GRADSCOPE_INSTALL_CMAKEDIR}
  COMPONENT ${GRADSCOPE_DEV_COMPONENT})

set(_gs_exported_names "")
foreach(_gs_target IN LISTS _gs_exported)
  get_target_property(_gs_name ${_gs_target} EXPORT_NAME)
  if(NOT _gs_name)
    set(_gs_name ${_gs_target})
  endif()
  list(APPEND _gs_exported_names "gradscope::${_gs_name}")
endforeach()
list(JOIN _gs_exported_names ", " _gs_exported_names)
message(STATUS "gradscope package exports: ${_gs_exported_names}")
unset(_gs_exported)
unset(_gs_exported_names)
unset(_gs_target)
unset(_gs_name)
unset(_gs_extra_dependencies)
