# Debian packages with CPack (`cpack` in a build tree; scripts/package.sh builds them from a fresh `package`
# preset build). One package per install component (cmake/GradscopeInstallFunctions.cmake):
#
#   gradscope       runtime  the command, gradscope-bench, gradscope-mpi, the agent and its extensions, the
#                            NCCL plugins, the sample jobs, the environment-modules file, the docs; no Qt
#   gradscope-gui   gui      the viewer
#   gradscope-dev   dev      headers, static libraries, the CMake package
#
# Version, Debian revision and maintainer come from packaging/debian/changelog, whose latest entry must be
# the project's version. Depends are what dpkg-shlibdeps reads from the binaries, plus what they load at
# run time without linking it (below). Included at the end of the top-level CMakeLists.txt.
include_guard(GLOBAL)

file(STRINGS ${PROJECT_SOURCE_DIR}/packaging/debian/changelog _gs_changelog_head LIMIT_COUNT 1)
file(STRINGS ${PROJECT_SOURCE_DIR}/packaging/debian/changelog _gs_changelog_trailer REGEX "^ -- " LIMIT_COUNT 1)
if(NOT _gs_changelog_head MATCHES "^gradscope \\(([^-]+)-([^)]+)\\) "
   OR NOT _gs_changelog_trailer MATCHES "^ -- (.+ <[^>]+>)  ")
  message(FATAL_ERROR "packaging/debian/changelog: the first entry must start 'gradscope (VERSION-REVISION) ' "
                      "and end with ' -- NAME <EMAIL>  DATE' (Debian policy 4.4)")
endif()
string(REGEX MATCH "^gradscope \\(([^-]+)-([^)]+)\\)" _gs_match "${_gs_changelog_head}")
set(_gs_changelog_version ${CMAKE_MATCH_1})
set(_gs_debian_revision ${CMAKE_MATCH_2})
string(REGEX MATCH "^ -- (.+ <[^>]+>)  " _gs_match "${_gs_changelog_trailer}")
set(_gs_maintainer ${CMAKE_MATCH_1})
if(NOT _gs_changelog_version STREQUAL PROJECT_VERSION)
  # A warning here, so that a version bump still builds; cpack refuses (GradscopeCPackProjectConfig.cmake).
  message(WARNING "packaging/debian/changelog's latest entry is ${_gs_changelog_version}, the project is "
                  "${PROJECT_VERSION}: add an entry for ${PROJECT_VERSION} before building packages")
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME gradscope)
set(CPACK_PACKAGE_VENDOR "gradscope")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# Empty: CPack would put the project's description above each package's own first line (its synopsis).
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "")
set(CPACK_PACKAGE_CONTACT "${_gs_maintainer}")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${_gs_maintainer}")
set(CPACK_DEBIAN_PACKAGE_RELEASE ${_gs_debian_revision})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_STRIP_FILES ON)
# Installed as into /usr, under DESTDIR: the environment-modules file is written at install time with the
# prefix it is installed to (packaging/modulefile.cmake.in), which must be /usr, not CPack's staging folder.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  message(STATUS "packages: CMAKE_INSTALL_PREFIX is ${CMAKE_INSTALL_PREFIX}, not /usr: the packages will put "
                 "libraries in /usr/${CMAKE_INSTALL_LIBDIR} (configure with -DCMAKE_INSTALL_PREFIX=/usr, as the "
                 "package and ci presets do, for Debian's multiarch directory)")
endif()

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL ${GRADSCOPE_RUNTIME_COMPONENT} ${GRADSCOPE_DEV_COMPONENT})
if(GRADSCOPE_HAVE_GUI)
  list(APPEND CPACK_COMPONENTS_ALL ${GRADSCOPE_GUI_COMPONENT})
endif()
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)

string(TOUPPER ${GRADSCOPE_RUNTIME_COMPONENT} _gs_runtime)
string(TOUPPER ${GRADSCOPE_GUI_COMPONENT} _gs_gui)
string(TOUPPER ${GRADSCOPE_DEV_COMPONENT} _gs_dev)

# gradscope. The agent links neither MPI, NCCL nor CUDA; gradscope-bench, gradscope-mpi, the MPI extension and
# the samples link Open MPI (shlibdeps finds libopenmpi3). mpirun is only a Recommends: jobs launched by srun or
# torchrun need none.
set(CPACK_DEBIAN_${_gs_runtime}_PACKAGE_NAME gradscope)
set(CPACK_DEBIAN_${_gs_runtime}_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_${_gs_runtime}_PACKAGE_RECOMMENDS "openmpi-bin")
set(_gs_suggests "")
if(GRADSCOPE_HAVE_GUI)
  list(APPEND _gs_suggests gradscope-gui)
endif()
set(_gs_runtime_description
  "profiler and tuner of gradient aggregation in MPI and NCCL jobs
gradscope records every collective and point-to-point call of an unmodified
parallel job (LD_PRELOAD agent), times every way of aggregating its gradients
on copies of its own buffers, recommends the best one and can apply it.
.
This package has the gradscope command, the agent and its extensions, the
NCCL tuner and profiler plugins, sample MPI jobs and an environment-modules
file (module load gradscope). It needs no Qt; the viewer is gradscope-gui.")
if(GRADSCOPE_HAVE_CUDA)
  # The CUDA parts link NCCL (and CUDA's runtime statically): NVIDIA's libraries, not Debian's. They are
  # used only by jobs that have NCCL loaded already (the NCCL extension, the NCCL sample) or by
  # `gradscope bench --backend nccl`, so they are no dependency; shlibdeps must find them to ignore them.
  get_filename_component(_gs_nccl_dir "${GRADSCOPE_NCCL_LIBRARY}" DIRECTORY)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${_gs_nccl_dir} ${CUDAToolkit_LIBRARY_DIR})
  list(APPEND _gs_suggests libnccl2)
  string(APPEND _gs_runtime_description "
.
Built with CUDA ${CUDAToolkit_VERSION}: profiling NCCL jobs and gradscope-bench
need NVIDIA's NCCL (libnccl2 from NVIDIA's CUDA repository), which Debian does
not ship; MPI jobs need neither.")
endif()
list(JOIN _gs_suggests ", " CPACK_DEBIAN_${_gs_runtime}_PACKAGE_SUGGESTS)
set(CPACK_DEBIAN_${_gs_runtime}_DESCRIPTION "${_gs_runtime_description}")

# gradscope-gui. Qt loads its platform plugins (xcb, wayland, offscreen) at run time: shlibdeps cannot see
# them, and without one the viewer cannot start.
set(CPACK_DEBIAN_${_gs_gui}_PACKAGE_NAME gradscope-gui)
set(CPACK_DEBIAN_${_gs_gui}_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_${_gs_gui}_PACKAGE_DEPENDS "qt6-qpa-plugins")
set(CPACK_DEBIAN_${_gs_gui}_PACKAGE_RECOMMENDS "gradscope (= ${PROJECT_VERSION}-${_gs_debian_revision})")
set(CPACK_DEBIAN_${_gs_gui}_DESCRIPTION
  "trace viewer of gradscope, the gradient aggregation profiler
The Qt 6 desktop viewer of gradscope's traces: timeline, calls, step
breakdown, communication matrix, method comparison charts, the
recommendation, and a live view of a running job.")

# gradscope-dev. Static libraries: nothing for shlibdeps; its Depends are what gradscopeConfig.cmake's
# find_dependency() lines need, each mapped to the Debian package that provides it.
set(CPACK_DEBIAN_${_gs_dev}_PACKAGE_NAME gradscope-dev)
set(CPACK_DEBIAN_${_gs_dev}_PACKAGE_SECTION libdevel)
set(_gs_dev_depends libfmt-dev libsqlite3-dev nlohmann-json3-dev)  # the config's fixed find_dependency lines
get_property(_gs_extra_dependencies GLOBAL PROPERTY GRADSCOPE_EXTRA_DEPENDENCIES)
set(_gs_dev_not_debian "")
foreach(_gs_line IN LISTS _gs_extra_dependencies)
  if(_gs_line MATCHES "^find_dependency\\(Protobuf")
    list(APPEND _gs_dev_depends libprotobuf-dev)
  elseif(_gs_line MATCHES "^find_dependency\\(MPI")
    list(APPEND _gs_dev_depends libopenmpi-dev)
  elseif(_gs_line MATCHES "^find_dependency\\(CUDAToolkit")
    set(_gs_dev_not_debian "
.
gradscope::comm needs the CUDA Toolkit ${CUDAToolkit_VERSION} with NCCL (NVIDIA's, not
in Debian).")
  else()
    message(FATAL_ERROR "cmake/GradscopePackaging.cmake: no Debian package known for '${_gs_line}' of "
                        "gradscopeConfig.cmake; add it to gradscope-dev's Depends here")
  endif()
endforeach()
list(REMOVE_DUPLICATES _gs_dev_depends)
list(JOIN _gs_dev_depends ", " CPACK_DEBIAN_${_gs_dev}_PACKAGE_DEPENDS)
set(CPACK_DEBIAN_${_gs_dev}_DESCRIPTION
  "development files of gradscope, the gradient aggregation profiler
Headers, static libraries and the CMake package of gradscope, to read and
write its SQLite traces and use its tuner and aggregation methods in another
program: find_package(gradscope), then link gradscope::storage,
gradscope::tuner and the others.${_gs_dev_not_debian}")

# Checks cpack makes before packaging (a version bump without a changelog entry; an install rule without a
# component).
set(GRADSCOPE_UNASSIGNED_COMPONENT_FOR_CPACK ${GRADSCOPE_UNASSIGNED_COMPONENT})
set(GRADSCOPE_CHANGELOG_VERSION ${_gs_changelog_version})
configure_file(${CMAKE_CURRENT_LIST_DIR}/GradscopeCPackProjectConfig.cmake.in
               ${PROJECT_BINARY_DIR}/GradscopeCPackProjectConfig.cmake @ONLY)
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_BINARY_DIR}/GradscopeCPackProjectConfig.cmake)

include(CPack)
