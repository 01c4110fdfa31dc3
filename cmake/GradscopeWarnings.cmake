# One place for compiler warnings; GRADSCOPE_WERROR (on in the presets CI uses) makes them errors.
add_library(gradscope_warnings INTERFACE)
target_compile_options(gradscope_warnings INTERFACE
  $<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wconversion -Wsign-conversion
    -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough>
  $<$<AND:$<BOOL:${GRADSCOPE_WERROR}>,$<COMPILE_LANGUAGE:CXX>>:-Werror>)

# Applies project warnings to a target we own (never to third-party code).
function(gradscope_target_defaults target)
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:gradscope_warnings>)
endfunction()
