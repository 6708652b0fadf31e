# One crash scenario of test_commit_safety, as three jobs (cmake -P):
#   1. CrashDriverPrepare saves step-1 and step-2 into DIR;
#   2. CrashDriverSave saves again with H5CKPT_TEST_CRASH_AT=CRASH_AT: the coordinator _exits at
#      that point, so the job must fail, saying it crashed there;
#   3. CrashDriverCheck loads DIR: it must select WANT ("NAME:VERSION") and load it bit-exactly,
#      then a next save must commit.
# Variables: MPIEXEC, PREFLAGS ('|'-separated), NP, BIN, DIR, CRASH_AT, SCENARIO, WANT, EXTRA_ENV.
string(REPLACE "|" ";" _preflags "${PREFLAGS}")
set(_job ${MPIEXEC} -n ${NP} ${_preflags} --timeout 100 ${BIN})

function(run_phase name expect_success)
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env H5CKPT_CS_DIR=${DIR} ${ARGN} ${_job} --gtest_filter=CommitSafety.CrashDriver${name}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("---- ${name} (exit ${rc})\n${out}${err}")
  if(expect_success AND NOT rc EQUAL 0)
    message(FATAL_ERROR "phase ${name} failed")
  endif()
  if(NOT expect_success)
    if(rc EQUAL 0)
      message(FATAL_ERROR "phase ${name} was expected to crash, but succeeded")
    endif()
    string(FIND "${out}${err}" "H5CKPT_TEST_CRASH_AT=${CRASH_AT}: exiting" _at)
    if(_at EQUAL -1)
      message(FATAL_ERROR "phase ${name} failed, but not at the crash point '${CRASH_AT}'")
    endif()
  endif()
endfunction()

run_phase(Prepare TRUE)
run_phase(Save FALSE H5CKPT_CS_SCENARIO=${SCENARIO} H5CKPT_TEST_CRASH_AT=${CRASH_AT} ${EXTRA_ENV})
run_phase(Check TRUE H5CKPT_CS_WANT=${WANT})
file(REMOVE_RECURSE ${DIR})
