# The cluster manager: placement index, state and decisions, and its daemon.
include(src/cluster/placement.cmake)
add_library(flyt_cluster STATIC src/cluster/cluster_manager.cc src/cluster/metrics_text.cc)
if(FLYT_BUILD_TESTS)
  add_executable(metrics_text_test tests/unit/metrics_text_test.cc)
  target_link_libraries(metrics_text_test PRIVATE flyt_cluster GTest::gtest_main)
  gtest_discover_tests(metrics_text_test)
endif()
target_link_libraries(flyt_cluster PUBLIC flyt_control flyt_store flyt_placement)
# The HTTP endpoint uses Debian's cpp-httplib (libcpp-httplib-dev), a shared C++ library
# there: the daemon links the shared libstdc++ too, so that both use one copy.
find_library(FLYT_CPP_HTTPLIB cpp-httplib REQUIRED)
add_executable(flyt-cluster-manager src/cluster/main.cc src/cluster/http_endpoint.cc
                                    src/cluster/dashboard_page.cc)
target_link_libraries(flyt-cluster-manager PRIVATE flyt_cluster ${FLYT_CPP_HTTPLIB})
install(TARGETS flyt-cluster-manager RUNTIME DESTINATION bin COMPONENT manager)
