# UCX transport (ucx://, src/transport/ucx_transport.h). Only UCX's headers are needed to
# build it: the libraries are loaded at run time (transport/ucx_api.h), so binaries built
# here start on hosts without UCX. Without the headers, ucx:// answers that this build
# has no UCX (ucx_stub.cc) and the ucx tests are skipped.
find_path(FLYT_UCX_INCLUDE_DIR ucp/api/ucp.h)
if(FLYT_UCX_INCLUDE_DIR)
  set(FLYT_HAVE_UCX ON)
  target_sources(flyt_common PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ucx_api.cc
                                     ${CMAKE_CURRENT_LIST_DIR}/ucx_transport.cc
                                     ${CMAKE_CURRENT_LIST_DIR}/ucx_rma.cc)
  target_include_directories(flyt_common PRIVATE ${FLYT_UCX_INCLUDE_DIR})
  target_link_libraries(flyt_common PUBLIC ${CMAKE_DL_LIBS})
else()
  set(FLYT_HAVE_UCX OFF)
  message(WARNING "UCX headers (ucp/api/ucp.h, Debian: libucx-dev) not found: ucx:// is not "
                  "built and its tests are skipped")
  target_sources(flyt_common PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ucx_stub.cc)
endif()

if(FLYT_BUILD_TESTS AND FLYT_HAVE_UCX)
  add_executable(ucx_transport_test ${CMAKE_SOURCE_DIR}/tests/unit/ucx_transport_test.cc)
  target_include_directories(ucx_transport_test PRIVATE ${FLYT_UCX_INCLUDE_DIR})
  target_link_libraries(ucx_transport_test PRIVATE flyt_common GTest::gtest_main Threads::Threads)
  # Once over UCX's TCP transport, once over its shared-memory transports.
  gtest_discover_tests(ucx_transport_test TEST_PREFIX ucx_tcp. DISCOVERY_TIMEOUT 30
                       PROPERTIES ENVIRONMENT "UCX_TLS=tcp" TIMEOUT 120)
  gtest_discover_tests(ucx_transport_test TEST_PREFIX ucx_sm. DISCOVERY_TIMEOUT 30
                       PROPERTIES ENVIRONMENT "UCX_TLS=sm,self" TIMEOUT 120)
  # One-sided access (transport/ucx_rma.h); its own main: `--rma-peer URL` is the client
  # process that one case kills.
  add_executable(ucx_rma_test ${CMAKE_SOURCE_DIR}/tests/unit/ucx_rma_test.cc)
  target_include_directories(ucx_rma_test PRIVATE ${FLYT_UCX_INCLUDE_DIR})
  target_link_libraries(ucx_rma_test PRIVATE flyt_common GTest::gtest Threads::Threads)
  gtest_discover_tests(ucx_rma_test TEST_PREFIX ucx_rma_tcp. DISCOVERY_TIMEOUT 30
                       PROPERTIES ENVIRONMENT "UCX_TLS=tcp" TIMEOUT 120)
  gtest_discover_tests(ucx_rma_test TEST_PREFIX ucx_rma_sm. DISCOVERY_TIMEOUT 30
                       PROPERTIES ENVIRONMENT "UCX_TLS=sm,self" TIMEOUT 120)
endif()
