# Flyt's libnccl.so.2 (src/nccl/nccl.cc): NCCL calls run by the GPU servers,
# preloaded by `flyt run` next to libcuda.so.1 and libcupti.so.13.
add_library(flyt_nccl SHARED src/nccl/nccl.cc)
target_include_directories(flyt_nccl PRIVATE src ${FLYT_CUDA_INCLUDE_DIR})
# Driver entry points (cuInit, cuMemAlloc, contexts) resolve to Flyt's libcuda.so.1 at run time.
target_link_libraries(flyt_nccl PRIVATE ${CMAKE_DL_LIBS} Threads::Threads
  -static-libstdc++ -static-libgcc
  -Wl,--version-script=${CMAKE_SOURCE_DIR}/src/nccl/libnccl.map)
set_target_properties(flyt_nccl PROPERTIES
  OUTPUT_NAME nccl SOVERSION 2 VERSION 2
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib/flyt
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
  LINK_DEPENDS ${CMAKE_SOURCE_DIR}/src/nccl/libnccl.map)
install(TARGETS flyt_nccl LIBRARY DESTINATION lib/flyt NAMELINK_SKIP COMPONENT client)
