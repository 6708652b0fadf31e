# Commit safety: fail-closed selection of what a directory load reads, the per-directory save
# lock, retention, and overwrites that keep `latest` valid, also across crashes.
h5ckpt_mpi_test_binary(test_commit_safety test_commit_safety.cpp)
target_link_libraries(test_commit_safety PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_commit_safety LABELS commit_safety RANKS 1 2 4 TIMEOUT 300)

# Crash scenarios (name, crash point, driver scenario, expected "checkpoint:version", extra env):
# the coordinator _exits at the point; a later job must load the expected checkpoint.
string(REPLACE ";" "|" _cs_preflags "${H5CKPT_MPIEXEC_PREFLAGS}")
foreach(_case
    "overwrite_exchange|publish|overwrite|step-2:3|"
    "overwrite_fallback|publish|overwrite|step-1:1|H5CKPT_TEST_NO_RENAME_EXCHANGE=1"
    "before_latest|latest|next|step-2:2|"
    "before_retention|retention|next|step-3:3|")
  string(REPLACE "|" ";" _f "${_case}")
  list(LENGTH _f _n)
  list(GET _f 0 _name)
  list(GET _f 1 _at)
  list(GET _f 2 _scenario)
  list(GET _f 3 _want)
  set(_extra "")
  if(_n GREATER 4)
    list(GET _f 4 _extra)
  endif()
  add_test(NAME commit_safety_crash_${_name}
    COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${MPIEXEC_EXECUTABLE} "-DPREFLAGS=${_cs_preflags}" -DNP=2
            -DBIN=$<TARGET_FILE:test_commit_safety> -DDIR=${CMAKE_CURRENT_BINARY_DIR}/commit_safety_crash/${_name}
            -DCRASH_AT=${_at} -DSCENARIO=${_scenario} -DWANT=${_want} "-DEXTRA_ENV=${_extra}"
            -P ${CMAKE_CURRENT_SOURCE_DIR}/commit_safety/crash.cmake)
  set_tests_properties(commit_safety_crash_${_name} PROPERTIES
    PROCESSORS 2 TIMEOUT 300 LABELS "mpi;commit_safety" ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
endforeach()
