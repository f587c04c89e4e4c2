# The cluster manager: placement index, state and decisions, and its daemon.
include(src/cluster/placement.cmake)
add_library(flyt_cluster STATIC src/cluster/cluster_manager.cc src/cluster/migration.cc
                               src/cluster/gpu_group.cc src/cluster/metrics_text.cc)
target_link_libraries(flyt_cluster PUBLIC flyt_control flyt_store flyt_placement)
if(FLYT_BUILD_TESTS)
  add_executable(metrics_text_test tests/unit/metrics_text_test.cc)
  target_link_libraries(metrics_text_test PRIVATE flyt_cluster GTest::gtest_main)
  gtest_discover_tests(metrics_text_test)
  add_executable(gpu_group_test tests/unit/gpu_group_test.cc)
  target_link_libraries(gpu_group_test PRIVATE flyt_cluster GTest::gtest_main)
  gtest_discover_tests(gpu_group_test)
  # The cluster manager against fake node managers (control listeners on loopback) and an
  # in-memory SQLite store.
  add_executable(cluster_manager_test tests/unit/cluster_manager_test.cc)
  target_link_libraries(cluster_manager_test PRIVATE flyt_cluster GTest::gtest_main)
  gtest_discover_tests(cluster_manager_test TEST_PREFIX "cluster_manager.")
endif()
# The HTTP endpoint uses Debian's cpp-httplib (libcpp-httplib-dev), a shared C++ library
# there: the daemon links the shared libstdc++ too, so that both use one copy.
find_library(FLYT_CPP_HTTPLIB cpp-httplib REQUIRED)
add_executable(flyt-cluster-manager src/cluster/main.cc src/cluster/http_endpoint.cc
                                    src/cluster/dashboard_page.cc)
target_link_libraries(flyt-cluster-manager PRIVATE flyt_cluster ${FLYT_CPP_HTTPLIB})
install(TARGETS flyt-cluster-manager RUNTIME DESTINATION bin COMPONENT manager)
