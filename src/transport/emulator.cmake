# Network emulator (src/transport/emulated_transport.h, docs/emulator.md).
# Included from the top CMakeLists.txt after flyt_common exists: the emulator is
# part of flyt_common, so the client library and flyt-server link it.
target_sources(flyt_common PRIVATE ${CMAKE_CURRENT_LIST_DIR}/emulated_transport.cc)

# Validation benchmark over real loopback TCP (not a test: it runs ~15 s).
add_executable(flyt-emulator-validation ${CMAKE_SOURCE_DIR}/bench/emulator_validation.cc)
target_link_libraries(flyt-emulator-validation PRIVATE flyt_common Threads::Threads)

if(FLYT_BUILD_TESTS)
  add_executable(emulated_transport_test ${CMAKE_SOURCE_DIR}/tests/unit/emulated_transport_test.cc)
  target_link_libraries(emulated_transport_test PRIVATE flyt_common GTest::gtest_main
                                                        Threads::Threads)
  gtest_discover_tests(emulated_transport_test)
endif()
