# TLS on flyt-server's data plane (transport/tls_server.h): OpenSSL linked statically,
# so the GPU host needs nothing beyond flyt-server. The client library loads libssl.so.3
# at run time instead (client/tls_client.h): Debian's static OpenSSL is not PIC.
find_library(FLYT_CRYPTO_STATIC NAMES libcrypto.a REQUIRED)
find_library(FLYT_SSL_STATIC NAMES libssl.a REQUIRED)
add_library(flyt_tls_server STATIC ${CMAKE_CURRENT_LIST_DIR}/tls_server.cc
                                   ${CMAKE_CURRENT_LIST_DIR}/tls_dial.cc)
target_link_libraries(flyt_tls_server PUBLIC flyt_common
                      PRIVATE ${FLYT_SSL_STATIC} ${FLYT_CRYPTO_STATIC} ${CMAKE_DL_LIBS}
                              Threads::Threads)

if(FLYT_BUILD_TESTS)
  add_executable(tls_record_test ${CMAKE_SOURCE_DIR}/tests/unit/tls_record_test.cc)
  target_link_libraries(tls_record_test PRIVATE flyt_tls_server ${FLYT_SSL_STATIC}
                        ${FLYT_CRYPTO_STATIC} ${CMAKE_DL_LIBS} GTest::gtest_main
                        Threads::Threads)
  gtest_discover_tests(tls_record_test DISCOVERY_TIMEOUT 30)
endif()
