# CLI tests (label `cli`): make_fixture writes checkpoints under MPI, then cli/cli_checks.py
# runs `h5ckpt` subcommands on them and checks the results against values it computes itself
# (closed formula, raw bytes at recorded offsets, h5py, its own safetensors parser).
# The checks need numpy (h5py optional): take the first python3 that imports it (a pyenv shim
# first in PATH may lack the Debian packages that /usr/bin/python3 has).
find_package(Python3 COMPONENTS Interpreter)
set(_cli_python "")
foreach(_py IN ITEMS ${H5CKPT_TEST_PYTHON} ${Python3_EXECUTABLE} /usr/bin/python3)
  execute_process(COMMAND ${_py} -c "import numpy" RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
  if(_rc EQUAL 0)
    set(_cli_python ${_py})
    break()
  endif()
endforeach()
if(NOT _cli_python)
  message(WARNING "no python3 with numpy (apt-get install python3-numpy python3-h5py): CLI tests not registered")
  return()
endif()

add_executable(cli_make_fixture ${CMAKE_CURRENT_SOURCE_DIR}/cli/make_fixture.cpp)
target_link_libraries(cli_make_fixture PRIVATE h5ckpt)  # public API only: the shared library

set(_cli_root ${CMAKE_CURRENT_BINARY_DIR}/cli_fixture)
string(REPLACE ";" " " _cli_mpiflags "${H5CKPT_MPIEXEC_PREFLAGS}")

add_test(NAME cli_fixture
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 110
          $<TARGET_FILE:cli_make_fixture> ${_cli_root})
set_tests_properties(cli_fixture PROPERTIES FIXTURES_SETUP cli_ckpt LABELS "cli;mpi" PROCESSORS 2 TIMEOUT 120)

# check name -> ranks it uses at most (for ctest's PROCESSORS)
foreach(_check help:1 inspect_dir:1 inspect_checkpoint:1 verify:3 diff:1 export:1 reshard:4 prune:1)
  string(REPLACE ":" ";" _pair ${_check})
  list(GET _pair 0 _name)
  list(GET _pair 1 _procs)
  add_test(NAME cli_${_name}
    COMMAND ${_cli_python} ${CMAKE_CURRENT_SOURCE_DIR}/cli/cli_checks.py
            --h5ckpt $<TARGET_FILE:h5ckpt-cli> --root ${_cli_root}
            --work ${CMAKE_CURRENT_BINARY_DIR}/cli_work/${_name}
            --mpiexec ${MPIEXEC_EXECUTABLE} "--mpiflags=${_cli_mpiflags}" ${_name})
  set_tests_properties(cli_${_name} PROPERTIES FIXTURES_REQUIRED cli_ckpt LABELS cli PROCESSORS ${_procs}
    TIMEOUT 300 ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
endforeach()
