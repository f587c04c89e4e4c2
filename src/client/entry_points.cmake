# Build rules for the list of every reachable entry point, served or refused
# (docs/compatibility.md, "Entry points").
#
# Owns: the custom target flyt_entry_points, which runs gen_entry_point_list.py after
# libcuda.so.1 (flyt_client), libnvidia-ml.so.1 (flyt_nvml) and libcupti.so.13
# (flyt_cupti) are linked and writes
# ${CMAKE_BINARY_DIR}/entry_points.tsv, and FLYT_ENTRY_POINT_LIST_COMMAND, the same
# command for tests/CMakeLists.txt (the ctest regenerates the list from the built
# libraries before checking the document). Must not touch either library's settings.
#
# Needs: driver_api.cmake (FLYT_DRIVER_API_INCLUDE_DIR, FLYT_DRIVER_API_HEADER_ARGS),
# cupti.cmake (FLYT_CUPTI_STUBS) and the targets flyt_client, flyt_nvml and flyt_cupti,
# defined before this file is included.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(FLYT_ENTRY_POINT_LIST "${CMAKE_BINARY_DIR}/entry_points.tsv")
set(_flyt_ep_script "${CMAKE_CURRENT_LIST_DIR}/gen_entry_point_list.py")
set(_flyt_ep_nm "${CMAKE_NM}")
if(NOT _flyt_ep_nm)
  set(_flyt_ep_nm nm)
endif()
set(FLYT_ENTRY_POINT_LIST_COMMAND
    "${Python3_EXECUTABLE}" "${_flyt_ep_script}" --out "${FLYT_ENTRY_POINT_LIST}"
    --table "${FLYT_DRIVER_API_INCLUDE_DIR}/driver_api_table.inc"
    ${FLYT_DRIVER_API_HEADER_ARGS}
    --libcuda "$<TARGET_FILE:flyt_client>" --nvml-lib "$<TARGET_FILE:flyt_nvml>"
    --nvml-unsupported "${CMAKE_CURRENT_LIST_DIR}/../nvml/nvml_unsupported.inc"
    --cupti-lib "$<TARGET_FILE:flyt_cupti>" --cupti-unsupported "${FLYT_CUPTI_STUBS}"
    --nm "${_flyt_ep_nm}")
add_custom_command(
  OUTPUT "${FLYT_ENTRY_POINT_LIST}"
  COMMAND ${FLYT_ENTRY_POINT_LIST_COMMAND}
  DEPENDS "${_flyt_ep_script}" "${CMAKE_CURRENT_LIST_DIR}/gen_driver_api.py"
          "${CMAKE_CURRENT_LIST_DIR}/../nvml/nvml_unsupported.inc"
          "${FLYT_DRIVER_API_INCLUDE_DIR}/driver_api_table.inc" flyt_client flyt_nvml
          flyt_cupti
  COMMENT "Listing the served and refused entry points of libcuda.so.1, libnvidia-ml.so.1 and libcupti.so.13"
  VERBATIM)
add_custom_target(flyt_entry_points ALL DEPENDS "${FLYT_ENTRY_POINT_LIST}")
