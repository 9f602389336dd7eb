# Compile flags shared by every minititan target: warnings on, optional sanitizers.
add_library(mt_flags INTERFACE)
target_compile_options(mt_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-sign-compare -Wno-unused-parameter>)
if(MT_SANITIZE)
  target_compile_options(mt_flags INTERFACE "$<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=address,undefined;-fno-sanitize-recover=undefined;-fno-omit-frame-pointer>")
  target_link_options(mt_flags INTERFACE -fsanitize=address,undefined)
endif()
