# Flyt's libnvidia-ml.so.1 (docs/nvml.md): NVML answered from the tenant's view,
# through Flyt's libcuda.so.1. Built into lib/flyt/ beside libcuda.so.1, so that
# `flyt run` puts both first on LD_LIBRARY_PATH.
#
# Owns: the target flyt_nvml. Links nothing of NVIDIA's (the GPU host's real
# NVML is read by flyt-server, src/server/session_nvml.cc).
add_library(flyt_nvml SHARED ${CMAKE_CURRENT_LIST_DIR}/nvml.cc)
target_link_libraries(flyt_nvml PRIVATE flyt_common Threads::Threads ${CMAKE_DL_LIBS}
  -static-libstdc++ -static-libgcc
  -Wl,--version-script=${CMAKE_CURRENT_LIST_DIR}/libnvidia-ml.map -Wl,--no-undefined)
set_target_properties(flyt_nvml PROPERTIES
  OUTPUT_NAME nvidia-ml SOVERSION 1 VERSION 1
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib/flyt
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
  LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/libnvidia-ml.map)
install(TARGETS flyt_nvml LIBRARY DESTINATION lib/flyt NAMELINK_SKIP COMPONENT client)

if(FLYT_BUILD_TESTS)
  # nvml_test drives the library through a stand-in libcuda.so.1 whose snapshots it chooses.
  add_library(nvml_fake_libcuda SHARED ${CMAKE_SOURCE_DIR}/tests/unit/nvml_fake_libcuda.cc)
  set_target_properties(nvml_fake_libcuda PROPERTIES
    OUTPUT_NAME cuda SOVERSION 1 VERSION 1
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/nvml_fake_driver)
  add_executable(nvml_test ${CMAKE_SOURCE_DIR}/tests/unit/nvml_test.cc)
  target_link_libraries(nvml_test PRIVATE nvml_fake_libcuda GTest::gtest_main Threads::Threads
                                          ${CMAKE_DL_LIBS})
  target_include_directories(nvml_test PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(nvml_test PRIVATE FLYT_NVML_LIB="$<TARGET_FILE:flyt_nvml>")
  add_dependencies(nvml_test flyt_nvml)
  gtest_discover_tests(nvml_test)
endif()
