# nvcc-built test images and the unit tests of common/cuda_image and server/sim_kernels.
#
# Owns: the library target flyt_sim_kernels (server/sim_kernels.cc with libzstd and
# liblz4 linked in statically when the .a files exist), the custom target
# flyt_sim_kernels_data that compiles tests/unit/data/sim_kernels.cu with nvcc into
# ${CMAKE_BINARY_DIR}/sim_kernels_data/, and the tests cuda_image_test and
# sim_kernels_test. Must not touch: other targets' settings.
#
# Include it from the top-level CMakeLists.txt after enable_testing() and
# find_package(GTest):
#   include(tests/unit/sim_kernels.cmake)
# If the top level already builds log.cc into a library, set FLYT_LOG_TARGET to it
# before the include; otherwise src/common/log.cc is compiled into the tests here.
# Without nvcc the library is still built and the two tests are left out.

set(_flyt_root ${CMAKE_CURRENT_LIST_DIR}/../..)
cmake_path(NORMAL_PATH _flyt_root)

# --- libzstd / liblz4 (Debian: libzstd-dev, liblz4-dev) ------------------------------
find_path(FLYT_ZSTD_INCLUDE zstd.h REQUIRED)
find_path(FLYT_LZ4_INCLUDE lz4.h REQUIRED)
find_library(FLYT_ZSTD_LIB NAMES libzstd.a zstd REQUIRED)
find_library(FLYT_LZ4_LIB NAMES liblz4.a lz4 REQUIRED)

if(NOT TARGET flyt_sim_kernels)
  add_library(flyt_sim_kernels STATIC ${_flyt_root}/src/server/sim_kernels.cc)
  target_include_directories(flyt_sim_kernels PUBLIC ${_flyt_root}/src
                             PRIVATE ${FLYT_ZSTD_INCLUDE} ${FLYT_LZ4_INCLUDE})
  target_link_libraries(flyt_sim_kernels PRIVATE ${FLYT_ZSTD_LIB} ${FLYT_LZ4_LIB})
  set_target_properties(flyt_sim_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)
  if(DEFINED FLYT_LOG_TARGET)
    target_link_libraries(flyt_sim_kernels PUBLIC ${FLYT_LOG_TARGET})
  endif()
endif()

# --- test images -------------------------------------------------------------------
find_program(FLYT_NVCC nvcc PATHS /usr/local/cuda/bin $ENV{CUDA_HOME}/bin)
if(NOT FLYT_NVCC)
  message(STATUS "nvcc not found: cuda_image_test and sim_kernels_test are not built")
  return()
endif()

set(_flyt_sk_src ${_flyt_root}/tests/unit/data/sim_kernels.cu)
set(_flyt_sk_dir ${CMAKE_BINARY_DIR}/sim_kernels_data)
file(MAKE_DIRECTORY ${_flyt_sk_dir})
set(_flyt_sk_images)

# flyt_sim_kernels_image(<output file> <nvcc options>...)
function(flyt_sim_kernels_image out)
  add_custom_command(
    OUTPUT ${_flyt_sk_dir}/${out}
    COMMAND ${FLYT_NVCC} ${ARGN} -o ${_flyt_sk_dir}/${out} ${_flyt_sk_src}
    DEPENDS ${_flyt_sk_src}
    COMMENT "nvcc: test image ${out}"
    VERBATIM)
  set(_flyt_sk_images ${_flyt_sk_images} ${_flyt_sk_dir}/${out} PARENT_SCOPE)
endfunction()

# Default: ELF stored plain, PTX zstd-compressed (flag 0x8000).
flyt_sim_kernels_image(kernels.fatbin -arch=sm_90 -fatbin)
# Every entry zstd-compressed.
flyt_sim_kernels_image(kernels_zstd.fatbin -arch=sm_90 -fatbin -Xfatbin=-compress-all)
# Every entry LZ4-compressed (flag 0x2000), as older toolkits did by default.
flyt_sim_kernels_image(kernels_lz4.fatbin -arch=sm_90 -fatbin -Xfatbin=-compress-all
                       -Xfatbin=-compress-mode=speed)
# Nothing compressed.
flyt_sim_kernels_image(kernels_plain.fatbin -arch=sm_90 -fatbin -Xfatbin=-compress=false)
# Several architectures: sm_80 writes valueless .nv.info records, sm_100 and sm_120 use a
# 0x70-byte ELF entry header and order their .nv.info records differently.
flyt_sim_kernels_image(
  kernels_multi.fatbin -fatbin -gencode=arch=compute_75,code=sm_75
  -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90
  -gencode=arch=compute_90,code=compute_90 -gencode=arch=compute_100,code=sm_100
  -gencode=arch=compute_120,code=sm_120)
# PTX only.
flyt_sim_kernels_image(kernels_ptx.fatbin -arch=compute_90 -fatbin)
# Relocatable device code: non-kernel functions keep symbols.
flyt_sim_kernels_image(kernels_rdc.fatbin -arch=sm_90 -rdc=true -fatbin)
# Device debug info: 0x48/0x80-byte entry headers with a name, compressed ELF.
flyt_sim_kernels_image(kernels_debug.fatbin -arch=sm_90 -G -fatbin)
flyt_sim_kernels_image(kernels.cubin -arch=sm_90 -cubin)
flyt_sim_kernels_image(kernels.ptx -arch=sm_90 -ptx)
# An executable: .nv_fatbin holds cudart's fatbin and ours; .nvFatBinSegment the wrappers.
flyt_sim_kernels_image(kernels_exe -arch=sm_90)

add_custom_target(flyt_sim_kernels_data DEPENDS ${_flyt_sk_images})

# --- tests -------------------------------------------------------------------------
set(_flyt_sk_log)
if(NOT DEFINED FLYT_LOG_TARGET)
  set(_flyt_sk_log ${_flyt_root}/src/common/log.cc)
endif()

add_executable(cuda_image_test ${_flyt_root}/tests/unit/cuda_image_test.cc
                               ${_flyt_root}/src/common/cuda_image.cc)
add_executable(sim_kernels_test ${_flyt_root}/tests/unit/sim_kernels_test.cc ${_flyt_sk_log})
target_link_libraries(sim_kernels_test PRIVATE flyt_sim_kernels)
foreach(t cuda_image_test sim_kernels_test)
  target_include_directories(${t} PRIVATE ${_flyt_root}/src ${_flyt_root}/tests/unit)
  target_compile_definitions(${t} PRIVATE FLYT_TEST_DATA_DIR="${_flyt_sk_dir}")
  target_link_libraries(${t} PRIVATE GTest::gtest_main)
  add_dependencies(${t} flyt_sim_kernels_data)
  add_test(NAME ${t} COMMAND ${t})
endforeach()
