# Control-plane messaging and configuration shared by the daemons and flytctl.
find_path(FLYT_JSON_INCLUDE_DIR nlohmann/json.hpp REQUIRED)
find_path(FLYT_TOML_INCLUDE_DIR toml.hpp REQUIRED)
find_library(FLYT_CRYPTO_STATIC NAMES libcrypto.a REQUIRED)
find_library(FLYT_SSL_STATIC NAMES libssl.a REQUIRED)
add_library(flyt_control STATIC src/control/channel.cc src/control/config.cc src/control/tls.cc)
target_include_directories(flyt_control PUBLIC ${FLYT_JSON_INCLUDE_DIR} ${FLYT_TOML_INCLUDE_DIR})
target_link_libraries(flyt_control PUBLIC flyt_common Threads::Threads
                      PRIVATE ${FLYT_SSL_STATIC} ${FLYT_CRYPTO_STATIC} ${CMAKE_DL_LIBS})
if(FLYT_BUILD_TESTS)
  add_executable(control_channel_test tests/unit/control_channel_test.cc)
  target_link_libraries(control_channel_test PRIVATE flyt_control GTest::gtest_main)
  gtest_discover_tests(control_channel_test)
endif()
