# commstack: a scheduling change, passed as CMAKE_PROJECT_INCLUDE; it changes no output.
#
# NVSHMEM's src/CMakeLists.txt says add_dependencies(nvshmem_host nvshmem_device_project-build).
# CMake's Ninja generator turns a target dependency into an order-only dependency of every
# object of nvshmem_host, so its 66 host sources (the slowest takes ~110 s on an H200
# host) wait for the device library's build (~60 s for one source) before starting. The
# host objects read nothing that step writes. The link still waits for it: the step
# declares libnvshmem_device.a as a byproduct, and nvshmem_host links that file.
#
# Redefining a built-in command keeps the original as _add_dependencies (what vcpkg's
# toolchain relies on too). Only this one edge is dropped; each drop is logged, and the
# recipe records it in the build report.
# Included once: a second definition would make _add_dependencies the first override.
include_guard(GLOBAL)
function(add_dependencies target)
  if(target STREQUAL "nvshmem_host" AND "${ARGN}" STREQUAL "nvshmem_device_project-build")
    message(STATUS "commstack-schedule: dropped ${target} -> ${ARGN}")
    return()
  endif()
  _add_dependencies(${target} ${ARGN})
endfunction()
