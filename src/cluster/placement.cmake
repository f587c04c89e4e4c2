# Placement index of the cluster manager (src/cluster/placement.h), its unit test and the
# control-plane scale benchmark. Included from src/cluster/cluster.cmake, after the store.
add_library(flyt_placement STATIC src/cluster/placement.cc)
target_link_libraries(flyt_placement PUBLIC flyt_common)

if(FLYT_BUILD_TESTS)
  add_executable(placement_test tests/unit/placement_test.cc)
  target_link_libraries(placement_test PRIVATE flyt_placement GTest::gtest_main)
  gtest_discover_tests(placement_test)
endif()

# Benchmark, not a test: bin/flyt-control-scale [--store sqlite:PATH] (see bench/results/).
add_executable(flyt-control-scale bench/control_scale.cc)
target_link_libraries(flyt-control-scale PRIVATE flyt_placement)
if(TARGET flyt_store)
  target_link_libraries(flyt-control-scale PRIVATE flyt_store)
  target_compile_definitions(flyt-control-scale PRIVATE FLYT_BENCH_HAVE_STORE=1)
endif()
