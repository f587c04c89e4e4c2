# Build rules for the generated driver-API table, stubs, cuGetProcAddress lookup and the
# traced wrappers of CUPTI's driver API domain.
#
# Owns: running gen_driver_api.py at build time over the CUDA toolkit's headers, and the
# OBJECT library `flyt_driver_api` (proc_address.cc, driver_trace.cc + the generated
# driver_stubs.cc, driver_api_pointers.cc and driver_trace_wrappers.cc). Must not touch
# other targets' settings or anything in the source tree.
#
# Use (from src/client/CMakeLists.txt):
#   include(${CMAKE_CURRENT_SOURCE_DIR}/driver_api.cmake)
#   target_link_libraries(flyt_client PRIVATE flyt_driver_api)   # objects go in directly
#   flyt_check_driver_api_exports(flyt_client)                    # optional, recommended
# The consumer also links the implementation of common/log.h.
#
# Link the objects straight into the shared library (an OBJECT library, as here, or plain
# sources), never through a static archive: the linker does not pull an archive member to
# replace a weak stub that is already defined, so real entry points in an archive would
# silently lose to their stubs. Real entry points must be default-visible (the target uses
# -fvisibility=hidden): a hidden strong definition hides the symbol from the export table.
#
# Inputs:
#   FLYT_CUDA_INCLUDE_DIR       cache path; defaults to CUDAToolkit_INCLUDE_DIRS, then
#                               /usr/local/cuda/include
#   FLYT_DRIVER_API_GRAPHICS    option (ON): also cover cudaGL/cudaEGL/cudaVDPAU entry
#                               points, which the real driver exports and resolves
# Outputs:
#   FLYT_DRIVER_API_INCLUDE_DIR directory holding driver_api_table.inc and
#                               driver_impl_names.h (the traced symbols' internal names,
#                               which client/client.h includes)
#   FLYT_DRIVER_API_SOURCES     the three generated .cc files
#   FLYT_DRIVER_API_REPORT      counts and naming-rule exceptions (driver_api_report.txt)
#   FLYT_DRIVER_API_HEADER_ARGS the generator's `--api TYPEDEFS_H API_H` arguments, one pair
#                               per header read (for gen_entry_point_list.py)
#   target flyt_driver_api_gen  custom target that runs the generator
#   flyt_check_driver_api_exports(<shared lib target>)  post-link check that the library
#                               exports every table symbol (see the visibility note above)

if(TARGET flyt_driver_api)
  return()
endif()

find_package(Python3 REQUIRED COMPONENTS Interpreter)

if(NOT FLYT_CUDA_INCLUDE_DIR)
  if(NOT CUDAToolkit_FOUND)
    find_package(CUDAToolkit QUIET)
  endif()
  set(_flyt_cuda_default "/usr/local/cuda/include")
  foreach(_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    if(EXISTS "${_dir}/cudaTypedefs.h")
      set(_flyt_cuda_default "${_dir}")
      break()
    endif()
  endforeach()
  set(FLYT_CUDA_INCLUDE_DIR "${_flyt_cuda_default}" CACHE PATH
      "Directory holding cuda.h and cudaTypedefs.h")
endif()
option(FLYT_DRIVER_API_GRAPHICS "Cover the GL/EGL/VDPAU interop entry points too" ON)

if(NOT EXISTS "${FLYT_CUDA_INCLUDE_DIR}/cudaTypedefs.h")
  message(FATAL_ERROR "cudaTypedefs.h not found in FLYT_CUDA_INCLUDE_DIR=${FLYT_CUDA_INCLUDE_DIR}")
endif()

# (typedef header, API header) pairs, flattened; cuda.h's is required, the rest are taken
# when present.
set(_flyt_api_pairs cudaTypedefs.h cuda.h cudaProfilerTypedefs.h cudaProfiler.h)
if(FLYT_DRIVER_API_GRAPHICS)
  list(APPEND _flyt_api_pairs cudaGLTypedefs.h cudaGL.h cudaEGLTypedefs.h cudaEGL.h
       cudaVDPAUTypedefs.h cudaVDPAU.h)
endif()
set(_flyt_api_args)
set(_flyt_api_headers)
list(LENGTH _flyt_api_pairs _flyt_n)
math(EXPR _flyt_last "${_flyt_n} - 1")
foreach(_flyt_i RANGE 0 ${_flyt_last} 2)
  math(EXPR _flyt_j "${_flyt_i} + 1")
  list(GET _flyt_api_pairs ${_flyt_i} _flyt_typedefs)
  list(GET _flyt_api_pairs ${_flyt_j} _flyt_api)
  set(_flyt_typedefs "${FLYT_CUDA_INCLUDE_DIR}/${_flyt_typedefs}")
  set(_flyt_api "${FLYT_CUDA_INCLUDE_DIR}/${_flyt_api}")
  if(EXISTS "${_flyt_typedefs}" AND EXISTS "${_flyt_api}")
    list(APPEND _flyt_api_args --api "${_flyt_typedefs}" "${_flyt_api}")
    list(APPEND _flyt_api_headers "${_flyt_typedefs}" "${_flyt_api}")
  endif()
endforeach()

set(FLYT_DRIVER_API_HEADER_ARGS ${_flyt_api_args})

set(FLYT_DRIVER_API_INCLUDE_DIR "${CMAKE_CURRENT_BINARY_DIR}/driver_api_gen")
set(FLYT_DRIVER_API_SOURCES "${FLYT_DRIVER_API_INCLUDE_DIR}/driver_stubs.cc"
                            "${FLYT_DRIVER_API_INCLUDE_DIR}/driver_api_pointers.cc"
                            "${FLYT_DRIVER_API_INCLUDE_DIR}/driver_trace_wrappers.cc")
set(FLYT_DRIVER_API_REPORT "${FLYT_DRIVER_API_INCLUDE_DIR}/driver_api_report.txt")
set(_flyt_gen_script "${CMAKE_CURRENT_LIST_DIR}/gen_driver_api.py")

# The traced wrappers (gen_driver_trace.py) take their prototypes from cuda.h and
# cudaProfiler.h as the compiler reads them, every legacy ABI included (and, to know which
# need the legacy types, as the client's files that do not ask for them read them).
set(_flyt_trace_c "${FLYT_DRIVER_API_INCLUDE_DIR}/driver_api_internal.c")
set(_flyt_trace_i "${FLYT_DRIVER_API_INCLUDE_DIR}/driver_api_internal.i")
set(_flyt_trace_public_i "${FLYT_DRIVER_API_INCLUDE_DIR}/driver_api_public.i")
file(MAKE_DIRECTORY "${FLYT_DRIVER_API_INCLUDE_DIR}")
file(CONFIGURE OUTPUT "${_flyt_trace_c}" CONTENT "#include <cuda.h>\n#include <cudaProfiler.h>\n")
set(_flyt_trace_headers "${FLYT_CUDA_INCLUDE_DIR}/cupti_driver_cbid.h"
                        "${FLYT_CUDA_INCLUDE_DIR}/generated_cuda_meta.h")

add_custom_command(
  OUTPUT ${FLYT_DRIVER_API_SOURCES} "${FLYT_DRIVER_API_INCLUDE_DIR}/driver_api_table.inc"
         "${FLYT_DRIVER_API_INCLUDE_DIR}/driver_impl_names.h" "${FLYT_DRIVER_API_REPORT}"
  COMMAND "${CMAKE_C_COMPILER}" -E -P -D__CUDA_API_VERSION_INTERNAL=1
          "-I${FLYT_CUDA_INCLUDE_DIR}" "${_flyt_trace_c}" -o "${_flyt_trace_i}"
  COMMAND "${CMAKE_C_COMPILER}" -E -P "-I${FLYT_CUDA_INCLUDE_DIR}" "${_flyt_trace_c}"
          -o "${_flyt_trace_public_i}"
  COMMAND "${Python3_EXECUTABLE}" "${_flyt_gen_script}" --out-dir "${FLYT_DRIVER_API_INCLUDE_DIR}"
          ${_flyt_api_args} --report "${FLYT_DRIVER_API_REPORT}"
          --trace "${_flyt_trace_i}" "${_flyt_trace_public_i}" ${_flyt_trace_headers}
  DEPENDS "${_flyt_gen_script}" "${CMAKE_CURRENT_LIST_DIR}/gen_driver_trace.py"
          "${CMAKE_CURRENT_LIST_DIR}/gen_entry_points.py" ${_flyt_api_headers}
          ${_flyt_trace_headers}
  COMMENT "Generating the driver-API table and traced wrappers from ${FLYT_CUDA_INCLUDE_DIR}"
  VERBATIM)
add_custom_target(flyt_driver_api_gen
  DEPENDS ${FLYT_DRIVER_API_SOURCES} "${FLYT_DRIVER_API_INCLUDE_DIR}/driver_api_table.inc"
          "${FLYT_DRIVER_API_INCLUDE_DIR}/driver_impl_names.h")

set_property(GLOBAL PROPERTY FLYT_DRIVER_API_GEN_SCRIPT "${_flyt_gen_script}")
set_property(GLOBAL PROPERTY FLYT_DRIVER_API_INCLUDE_DIR "${FLYT_DRIVER_API_INCLUDE_DIR}")

get_filename_component(_flyt_src_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
add_library(flyt_driver_api OBJECT "${CMAKE_CURRENT_LIST_DIR}/proc_address.cc"
            "${CMAKE_CURRENT_LIST_DIR}/driver_trace.cc" ${FLYT_DRIVER_API_SOURCES})
add_dependencies(flyt_driver_api flyt_driver_api_gen)
set_target_properties(flyt_driver_api PROPERTIES
  POSITION_INDEPENDENT_CODE ON
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON)
target_compile_features(flyt_driver_api PRIVATE cxx_std_20)
# PUBLIC: consumers include client/proc_address.h (which includes cuda.h) and the .inc.
target_include_directories(flyt_driver_api
  PUBLIC "${_flyt_src_root}" "${FLYT_DRIVER_API_INCLUDE_DIR}" "${FLYT_CUDA_INCLUDE_DIR}")

# Adds a post-link check to the shared library `target`: every symbol of the table must be
# in its dynamic export table (a real entry point left hidden would drop out silently).
function(flyt_check_driver_api_exports target)
  if(NOT CMAKE_NM)
    message(WARNING "CMAKE_NM unset: no export check for ${target}")
    return()
  endif()
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  get_property(script GLOBAL PROPERTY FLYT_DRIVER_API_GEN_SCRIPT)
  get_property(gen_dir GLOBAL PROPERTY FLYT_DRIVER_API_INCLUDE_DIR)
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND "${Python3_EXECUTABLE}" "${script}" --out-dir "${gen_dir}"
            --check-exports "$<TARGET_FILE:${target}>"
            --nm "${CMAKE_NM}"
    COMMENT "Checking the driver entry points exported by ${target}"
    VERBATIM)
endfunction()
