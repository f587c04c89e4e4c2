# The node manager: GPU inventory, MPS, the flyt-servers of one GPU host, and its daemon.
add_library(flyt_node STATIC src/node/process.cc src/node/gpu_inventory.cc
                             src/node/mps_daemon.cc src/node/server_supervisor.cc
                             src/node/node_manager.cc)
target_link_libraries(flyt_node PUBLIC flyt_control ${CMAKE_DL_LIBS})
add_executable(flyt-node-manager src/node/main.cc)
target_link_libraries(flyt-node-manager PRIVATE flyt_node -static-libstdc++ -static-libgcc)
install(TARGETS flyt-node-manager RUNTIME DESTINATION bin COMPONENT server)

if(FLYT_BUILD_TESTS)
  # A stand-in flyt-server with a control socket whose behaviour the tests choose.
  add_executable(node_fake_server tests/unit/node_fake_server.cc)
  target_link_libraries(node_fake_server PRIVATE flyt_control)
  foreach(t node_inventory_test node_process_test node_mps_test node_supervisor_test
            node_manager_test)
    add_executable(${t} tests/unit/${t}.cc)
    target_link_libraries(${t} PRIVATE flyt_node GTest::gtest_main)
    target_compile_definitions(${t} PRIVATE
      FLYT_FAKE_SERVER="$<TARGET_FILE:node_fake_server>"
      FLYT_REAL_SERVER="$<TARGET_FILE:flyt-server>")
    add_dependencies(${t} node_fake_server flyt-server)
    gtest_discover_tests(${t} DISCOVERY_TIMEOUT 30)
  endforeach()
endif()
