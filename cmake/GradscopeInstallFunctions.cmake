# Install helpers each part's CMakeLists.txt calls on the targets it owns. Included near the top of the
# top-level CMakeLists.txt (before any add_subdirectory) so that the functions exist when parts call them;
# GradscopeInstall.cmake, included at the end, writes the export set, the package config and its version.
#
#   gradscope_install_library(gradscope_storage)   # also joins the export set: gradscope::storage
#   gradscope_install_executable(gradscope_cli)    # bin/, not exported
#   gradscope_install_dependency(MPI COMPONENTS C) # only if an exported target's interface needs it
#
# Every library in the export set that links another of our targets must have that target in the set too
# (CMake refuses the export otherwise), so install internal static helpers with gradscope_install_library
# or link them as $<BUILD_INTERFACE:...>.
include_guard(GLOBAL)
include(GNUInstallDirs)

set(GRADSCOPE_RUNTIME_COMPONENT runtime)  # package gradscope: the command, the agent, the NCCL plugins, samples
set(GRADSCOPE_GUI_COMPONENT gui)          # package gradscope-gui: the Qt viewer
set(GRADSCOPE_DEV_COMPONENT dev)          # package gradscope-dev: headers, static libraries, the CMake package
set(GRADSCOPE_UNASSIGNED_COMPONENT unassigned)
set(CMAKE_INSTALL_DEFAULT_COMPONENT_NAME ${GRADSCOPE_UNASSIGNED_COMPONENT})

# What only gradscope loads or runs — the agent, its extensions, the NCCL plugins, the sample jobs — lives
# in a directory of its own under the library directory (Debian's place for a package's private files:
# /usr/lib/x86_64-linux-gnu/gradscope), not in the library directory itself: nothing links against them,
# and the linker's search path has no business finding them. `gradscope run` finds the agent and the
# plugins there from its own location (cli/src/run.cc).
set(GRADSCOPE_INSTALL_PKGLIBDIR "${CMAKE_INSTALL_LIBDIR}/gradscope")
set(GRADSCOPE_INSTALL_SAMPLESDIR "${GRADSCOPE_INSTALL_PKGLIBDIR}/samples")

# Installed binaries find our shared libraries next to themselves, and libraries outside the system
# directories that they were linked against (CUDA in /usr/local/cuda, for example) where they were found.
# Not in a system install (prefix /usr: the Debian packages): there Debian's libraries are where the loader
# looks anyway (Open MPI's libmpi.so.40 too), a search path of the build machine's is wrong on another
# (lintian: custom-library-search-path), and NVIDIA's NCCL is found as every CUDA program finds it
# (LD_LIBRARY_PATH, or /etc/ld.so.conf.d as NVIDIA's packages set it).
if(NOT DEFINED CMAKE_INSTALL_RPATH_USE_LINK_PATH)
  if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
    set(CMAKE_INSTALL_RPATH_USE_LINK_PATH OFF)
  else()
    set(CMAKE_INSTALL_RPATH_USE_LINK_PATH ON)
  endif()
endif()

# Adds a library (STATIC, SHARED, MODULE or INTERFACE) to the gradscopeTargets export set and installs it.
# Its public headers are the part's own business (install(DIRECTORY include/gradscope ...)).
function(gradscope_install_library target)
  if(NOT TARGET ${target})
    message(FATAL_ERROR "gradscope_install_library: no target named '${target}'")
  endif()
  get_target_property(rpath ${target} INSTALL_RPATH)
  if(NOT rpath)
    set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN")
  endif()
  install(TARGETS ${target} EXPORT gradscopeTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT ${GRADSCOPE_DEV_COMPONENT}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT ${GRADSCOPE_RUNTIME_COMPONENT}
      NAMELINK_COMPONENT ${GRADSCOPE_DEV_COMPONENT}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ${GRADSCOPE_RUNTIME_COMPONENT}
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  set_property(GLOBAL APPEND PROPERTY GRADSCOPE_EXPORTED_TARGETS ${target})
  # A stripping install (cmake --install --strip; cpack, CPACK_STRIP_FILES) strips executables and shared
  # libraries only; a static library keeps its debug information, half of gradscope-dev's size. Strip it
  # as Debian's dh_strip does: debug sections only, so that it still links.
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "STATIC_LIBRARY" AND CMAKE_STRIP)
    install(CODE "if(CMAKE_INSTALL_DO_STRIP)
  execute_process(COMMAND \"${CMAKE_STRIP}\" --strip-debug --enable-deterministic-archives
    \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/$<TARGET_FILE_NAME:${target}>\"
    COMMAND_ERROR_IS_FATAL ANY)
endif()" COMPONENT ${GRADSCOPE_DEV_COMPONENT})
  endif()
endfunction()

# Installs an executable into bin/ with an RPATH that finds our shared libraries in lib/. COMPONENT
# defaults to the runtime one (package gradscope).
function(gradscope_install_executable target)
  if(NOT TARGET ${target})
    message(FATAL_ERROR "gradscope_install_executable: no target named '${target}'")
  endif()
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "COMPONENT" "")
  if(NOT arg_COMPONENT)
    set(arg_COMPONENT ${GRADSCOPE_RUNTIME_COMPONENT})
  endif()
  get_target_property(rpath ${target} INSTALL_RPATH)
  if(NOT rpath)
    file(RELATIVE_PATH to_libdir "/${CMAKE_INSTALL_BINDIR}" "/${CMAKE_INSTALL_LIBDIR}")
    set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/${to_libdir}")
  endif()
  install(TARGETS ${target} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ${arg_COMPONENT})
endfunction()

# Installs a shared or module library (the agent, an extension, an NCCL plugin) or a sample job into the
# private directory GRADSCOPE_INSTALL_PKGLIBDIR (or DESTINATION: the samples' folder in it), in the runtime
# component.
function(gradscope_install_private target)
  if(NOT TARGET ${target})
    message(FATAL_ERROR "gradscope_install_private: no target named '${target}'")
  endif()
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "DESTINATION" "")
  set(destination ${GRADSCOPE_INSTALL_PKGLIBDIR})
  if(arg_DESTINATION)
    set(destination ${arg_DESTINATION})
  endif()
  install(TARGETS ${target}
    LIBRARY DESTINATION ${destination} COMPONENT ${GRADSCOPE_RUNTIME_COMPONENT}
    RUNTIME DESTINATION ${destination} COMPONENT ${GRADSCOPE_RUNTIME_COMPONENT})
endfunction()

# Records one extra find_dependency() line for gradscopeConfig.cmake, beyond the fixed ones (fmt, SQLite3,
# nlohmann_json, Threads): pass the find_dependency arguments, e.g. gradscope_install_dependency(MPI COMPONENTS C).
function(gradscope_install_dependency)
  list(JOIN ARGN " " line)
  set_property(GLOBAL APPEND PROPERTY GRADSCOPE_EXTRA_DEPENDENCIES "find_dependency(${line})")
endfunction()
