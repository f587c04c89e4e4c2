# Shared-memory transport building blocks (docs/shared_memory.md): the SPSC
# ring and the segments it lives in. Not yet wired into client or server.
add_library(flyt_shm STATIC ${CMAKE_CURRENT_LIST_DIR}/shm_ring.cc
                            ${CMAKE_CURRENT_LIST_DIR}/shm_segment.cc)
target_link_libraries(flyt_shm PUBLIC flyt_common)

if(FLYT_BUILD_TESTS)
  add_executable(shm_ring_test ${CMAKE_SOURCE_DIR}/tests/unit/shm_ring_test.cc)
  target_link_libraries(shm_ring_test PRIVATE flyt_shm GTest::gtest_main Threads::Threads)
  gtest_discover_tests(shm_ring_test DISCOVERY_TIMEOUT 30)
endif()
