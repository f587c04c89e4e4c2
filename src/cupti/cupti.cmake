# Flyt's libcupti.so.13 (src/cupti/cupti.cc): CUPTI's activity API for programs
# run through Flyt, preloaded by `flyt run` next to libcuda.so.1.
set(FLYT_CUPTI_STUBS ${FLYT_GEN_DIR}/cupti_unsupported.cc)
add_custom_command(
  OUTPUT ${FLYT_CUPTI_STUBS}
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/src/cupti/gen_cupti_stubs.py
          ${FLYT_CUDA_INCLUDE_DIR} ${CMAKE_SOURCE_DIR}/src/cupti/cupti.cc ${FLYT_CUPTI_STUBS}
  DEPENDS src/cupti/gen_cupti_stubs.py src/cupti/cupti.cc ${FLYT_CUDA_INCLUDE_DIR}/cupti.h
  COMMENT "Generating the CUPTI entry points Flyt refuses"
  VERBATIM)
# cuptiGetCallbackName's names of the runtime and driver callback ids.
set(FLYT_CUPTI_CBID_NAMES ${FLYT_GEN_DIR}/cupti_cbid_names.inc)
add_custom_command(
  OUTPUT ${FLYT_CUPTI_CBID_NAMES}
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/src/cupti/gen_cupti_cbid_names.py
          ${FLYT_CUDA_INCLUDE_DIR} ${FLYT_CUPTI_CBID_NAMES}
  DEPENDS src/cupti/gen_cupti_cbid_names.py ${FLYT_CUDA_INCLUDE_DIR}/cupti_runtime_cbid.h
          ${FLYT_CUDA_INCLUDE_DIR}/cupti_driver_cbid.h
  COMMENT "Generating the names of CUPTI's callback ids"
  VERBATIM)
add_library(flyt_cupti SHARED src/cupti/cupti.cc ${FLYT_CUPTI_STUBS} ${FLYT_CUPTI_CBID_NAMES})
target_include_directories(flyt_cupti PRIVATE src ${FLYT_CUDA_INCLUDE_DIR} ${FLYT_GEN_DIR})
target_link_libraries(flyt_cupti PRIVATE ${CMAKE_DL_LIBS} Threads::Threads
  -static-libstdc++ -static-libgcc
  -Wl,--version-script=${CMAKE_SOURCE_DIR}/src/cupti/libcupti.map)
set_target_properties(flyt_cupti PROPERTIES
  OUTPUT_NAME cupti SOVERSION 13 VERSION 13
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib/flyt
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
  LINK_DEPENDS ${CMAKE_SOURCE_DIR}/src/cupti/libcupti.map)
install(TARGETS flyt_cupti LIBRARY DESTINATION lib/flyt NAMELINK_SKIP COMPONENT client)
