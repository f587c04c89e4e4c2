# Shared-memory transport (docs/shared_memory.md): the SPSC ring, the segments
# it lives in and the shm:// transport are part of flyt_common (top
# CMakeLists.txt), so the client library and flyt-server speak shm://.
# flyt_shm stays as a name for the tests that link the building blocks.
add_library(flyt_shm INTERFACE)
target_link_libraries(flyt_shm INTERFACE flyt_common)

if(FLYT_BUILD_TESTS)
  add_executable(shm_ring_test ${CMAKE_SOURCE_DIR}/tests/unit/shm_ring_test.cc)
  target_link_libraries(shm_ring_test PRIVATE flyt_shm GTest::gtest_main Threads::Threads)
  gtest_discover_tests(shm_ring_test DISCOVERY_TIMEOUT 30)
  add_executable(shm_transport_test ${CMAKE_SOURCE_DIR}/tests/unit/shm_transport_test.cc)
  target_link_libraries(shm_transport_test PRIVATE flyt_shm GTest::gtest_main Threads::Threads)
  gtest_discover_tests(shm_transport_test DISCOVERY_TIMEOUT 30)
endif()
