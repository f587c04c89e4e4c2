# The client manager daemon (one per client VM).
add_executable(flyt-client-manager src/client_manager/client_manager.cc src/client_manager/main.cc)
target_link_libraries(flyt-client-manager PRIVATE flyt_control -static-libstdc++ -static-libgcc)
install(TARGETS flyt-client-manager RUNTIME DESTINATION bin COMPONENT client)
