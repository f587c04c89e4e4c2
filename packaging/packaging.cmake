# Debian packages (CPack) and the daemons' systemd units.
#
# Owns: the install components and the three packages built from them:
#   flyt-client   the `flyt` launcher, Flyt's libcuda.so.1, libnvidia-ml.so.1,
#                 libcupti.so.13 and libnccl.so.2 (in /usr/lib/flyt, never on the loader's default path) and
#                 flyt-client-manager with its unit: what a VM without a GPU installs;
#   flyt-server   flyt-server and flyt-node-manager with its unit: for GPU hosts;
#   flyt-manager  flyt-cluster-manager with its unit, and flytctl.
# Dependencies come from dpkg-shlibdeps. `cpack --config BUILD/CPackConfig.cmake -G DEB`
# writes them; tests/packaging/package_test.sh installs them into a fresh Debian root.
# Must not change how targets build: only where they install.
set(_units ${CMAKE_SOURCE_DIR}/packaging/systemd)
install(FILES ${_units}/flyt-client-manager.service DESTINATION lib/systemd/system
        COMPONENT client)
install(FILES ${_units}/flyt-node-manager.service DESTINATION lib/systemd/system
        COMPONENT server)
install(FILES ${_units}/flyt-cluster-manager.service DESTINATION lib/systemd/system
        COMPONENT manager)
foreach(_c client server manager)
  install(FILES ${CMAKE_SOURCE_DIR}/README.md ${CMAKE_SOURCE_DIR}/etc/flyt.example.toml
          DESTINATION share/doc/flyt-${_c} COMPONENT ${_c})
endforeach()

set(CPACK_PACKAGE_NAME flyt)
set(CPACK_PACKAGE_VENDOR "Flyt")
set(CPACK_PACKAGE_CONTACT "Flyt maintainers <flyt@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Remote and shared GPUs for unmodified CUDA programs")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL client server manager)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_CLIENT_PACKAGE_NAME flyt-client)
set(CPACK_DEBIAN_SERVER_PACKAGE_NAME flyt-server)
set(CPACK_DEBIAN_MANAGER_PACKAGE_NAME flyt-manager)
# The client library loads libssl.so.3 only to dial tls:// (client/tls_client.h).
set(CPACK_DEBIAN_CLIENT_PACKAGE_RECOMMENDS libssl3)
set(CPACK_COMPONENT_CLIENT_DESCRIPTION
    "Flyt client: run CUDA programs on a remote GPU (flyt run), libraries and client manager")
set(CPACK_COMPONENT_SERVER_DESCRIPTION
    "Flyt GPU host: flyt-server and the node manager that starts one per tenant")
set(CPACK_COMPONENT_MANAGER_DESCRIPTION
    "Flyt cluster manager (placement, dashboard, Prometheus metrics) and flytctl")
include(CPack)
