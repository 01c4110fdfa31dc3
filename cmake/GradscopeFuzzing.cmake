# libFuzzer targets (tests/fuzz/, docs/reliability.md): GRADSCOPE_BUILD_FUZZERS=ON with clang.
#
# Included by the top-level CMakeLists.txt after the dependencies are found and before any part is added:
# with fuzzers on, every C and C++ file of the build is compiled with libFuzzer's coverage instrumentation
# (-fsanitize=fuzzer-no-link) and ASan + UBSan, so that the libraries a fuzz target links (storage, the
# recommendation parser, the agent's configuration...) guide the fuzzer and are checked, not only the
# target's own file. Such a build is for the fuzz targets alone (the `fuzz` preset builds only the
# `gradscope_fuzzers` target); the ordinary presets leave the option off.
#
#   gradscope_add_fuzzer(NAME name SOURCES fuzz.cc LIBRARIES lib...)
#     with fuzzers on: gradscope_fuzz_<name>, linked with libFuzzer's main, part of gradscope_fuzzers;
#     with tests on (any compiler): gradscope_fuzz_<name>_replay, the same LLVMFuzzerTestOneInput driven
#     by tests/fuzz/replay_main.cc over tests/fuzz/<name>/corpus, as the ctest fuzz.<name>.corpus.
include_guard(GLOBAL)

option(GRADSCOPE_BUILD_FUZZERS "Build the libFuzzer targets (needs clang)" OFF)
set(GRADSCOPE_HAVE_FUZZERS FALSE)
if(GRADSCOPE_BUILD_FUZZERS)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    set(GRADSCOPE_HAVE_FUZZERS TRUE)
    # UBSan findings abort (a finding, not a line in the log the fuzzer would run past).
    add_compile_options(
      "$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link,address,undefined;-fno-sanitize-recover=undefined;-fno-omit-frame-pointer>")
    add_link_options(-fsanitize=address,undefined)
    add_custom_target(gradscope_fuzzers)
  else()
    message(WARNING "GRADSCOPE_BUILD_FUZZERS=ON needs clang (CMAKE_CXX_COMPILER_ID is ${CMAKE_CXX_COMPILER_ID}); "
                    "no fuzz targets. Configure with the fuzz preset (cmake --preset fuzz).")
  endif()
endif()

function(gradscope_add_fuzzer)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;LIBRARIES" ${ARGN})
  set(corpus ${PROJECT_SOURCE_DIR}/tests/fuzz/${ARG_NAME}/corpus)
  if(NOT IS_DIRECTORY ${corpus})
    message(FATAL_ERROR "fuzz target ${ARG_NAME}: no corpus at ${corpus}")
  endif()
  if(GRADSCOPE_HAVE_FUZZERS)
    add_executable(gradscope_fuzz_${ARG_NAME} ${ARG_SOURCES})
    target_link_libraries(gradscope_fuzz_${ARG_NAME} PRIVATE ${ARG_LIBRARIES})
    target_link_options(gradscope_fuzz_${ARG_NAME} PRIVATE -fsanitize=fuzzer)
    gradscope_target_defaults(gradscope_fuzz_${ARG_NAME})
    add_dependencies(gradscope_fuzzers gradscope_fuzz_${ARG_NAME})
  endif()
  if(GRADSCOPE_BUILD_TESTS)
    add_executable(gradscope_fuzz_${ARG_NAME}_replay ${ARG_SOURCES} ${PROJECT_SOURCE_DIR}/tests/fuzz/replay_main.cc)
    target_link_libraries(gradscope_fuzz_${ARG_NAME}_replay PRIVATE ${ARG_LIBRARIES})
    gradscope_target_defaults(gradscope_fuzz_${ARG_NAME}_replay)
    add_test(NAME fuzz.${ARG_NAME}.corpus COMMAND gradscope_fuzz_${ARG_NAME}_replay ${corpus})
    set_tests_properties(fuzz.${ARG_NAME}.corpus PROPERTIES LABELS fuzz TIMEOUT 300)
  endif()
endfunction()
