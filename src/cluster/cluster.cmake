# The cluster manager: placement index, state and decisions, and its daemon.
include(src/cluster/placement.cmake)
add_library(flyt_cluster STATIC src/cluster/cluster_manager.cc)
target_link_libraries(flyt_cluster PUBLIC flyt_control flyt_store flyt_placement)
add_executable(flyt-cluster-manager src/cluster/main.cc)
target_link_libraries(flyt-cluster-manager PRIVATE flyt_cluster -static-libstdc++ -static-libgcc)
install(TARGETS flyt-cluster-manager RUNTIME DESTINATION bin)
