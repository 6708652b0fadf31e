# Helpers that register test binaries with CTest.
find_package(GTest REQUIRED)

# mpirun as root on a small machine needs these; they live here, not in the user's environment.
set(H5CKPT_MPIEXEC_PREFLAGS --oversubscribe --bind-to none CACHE STRING "Flags passed to mpiexec by tests")
execute_process(COMMAND id -u OUTPUT_VARIABLE _h5ckpt_uid OUTPUT_STRIP_TRAILING_WHITESPACE)
if(_h5ckpt_uid STREQUAL "0")
  list(APPEND H5CKPT_MPIEXEC_PREFLAGS --allow-run-as-root)
endif()
set(H5CKPT_MPI_TEST_RANKS 1 2 4 8 CACHE STRING "Rank counts every MPI test runs at")
# Sanitizer builds run several times slower (scripts/sanitize.sh sets 5): every helper-registered
# test's deadline is multiplied by this factor.
set(H5CKPT_TEST_TIMEOUT_SCALE 1 CACHE STRING "Factor on the timeouts of tests registered by these helpers")

# h5ckpt_add_mpi_test(<target> [RANKS n...] [LABELS l...] [TIMEOUT s] [ARGS a...])
# Registers <target>_np<n> for each rank count; mpiexec --timeout ends a hang.
function(h5ckpt_add_mpi_test target)
  cmake_parse_arguments(T "" "TIMEOUT" "RANKS;LABELS;ARGS" ${ARGN})
  if(NOT T_RANKS)
    set(T_RANKS ${H5CKPT_MPI_TEST_RANKS})
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  math(EXPR T_TIMEOUT "${T_TIMEOUT} * ${H5CKPT_TEST_TIMEOUT_SCALE}")
  math(EXPR _mpi_timeout "${T_TIMEOUT} - 10")
  foreach(n IN LISTS T_RANKS)
    add_test(NAME ${target}_np${n}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${H5CKPT_MPIEXEC_PREFLAGS}
              --timeout ${_mpi_timeout} $<TARGET_FILE:${target}> ${T_ARGS})
    set_tests_properties(${target}_np${n} PROPERTIES
      PROCESSORS ${n} TIMEOUT ${T_TIMEOUT} LABELS "mpi;${T_LABELS}"
      ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
  endforeach()
endfunction()

# h5ckpt_add_unit_test(<target> [LABELS l...]) — a plain (no MPI) googletest binary.
function(h5ckpt_add_unit_test target)
  cmake_parse_arguments(T "" "TIMEOUT" "LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  math(EXPR T_TIMEOUT "${T_TIMEOUT} * ${H5CKPT_TEST_TIMEOUT_SCALE}")
  add_test(NAME ${target} COMMAND $<TARGET_FILE:${target}>)
  set_tests_properties(${target} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "unit;${T_LABELS}")
endfunction()

# h5ckpt_own_mpi_session_dirs() — at the end of a directory that adds tests: each of its tests'
# mpirun keeps its session directory (shared-memory files, the PMIx socket) under a base of its
# own. In the shared /tmp/ompi.<host>.<uid>, a job ending removes the directory when it is empty,
# and another test's mpirun creating its own there at that moment fails to start ("orte_session_dir
# failed", seen under ctest -j 2). The base is short: the socket's path must stay under 108 bytes.
function(h5ckpt_own_mpi_session_dirs)
  get_property(_tests DIRECTORY PROPERTY TESTS)
  foreach(t IN LISTS _tests)
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "OMPI_MCA_orte_tmpdir_base=/tmp/h5o/${t}")
  endforeach()
endfunction()
