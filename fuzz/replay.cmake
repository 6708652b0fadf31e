# Without libFuzzer (the default gcc build, tests on): every fuzz target linked to
# fuzz/replay_main.cpp, which runs its seeds and then seeded mutations of them for
# H5CKPT_FUZZ_REPLAY_SECONDS, as CTest tests (label `fuzz_replay`), so that the targets' oracles
# run in every test run. Compiling them here also keeps their sources in step with the library.
set(H5CKPT_FUZZ_REPLAY_SECONDS 8 CACHE STRING "Seconds each fuzz target's replay test mutates its seeds")
set(_replay_dir ${PROJECT_BINARY_DIR}/fuzz-replay)
add_executable(fuzz_make_seeds fuzz/make_seeds.cpp)
target_link_libraries(fuzz_make_seeds PRIVATE h5ckpt_internal h5ckpt_extras)
add_test(NAME fuzz_replay_seeds COMMAND fuzz_make_seeds ${_replay_dir}/seeds)
set_tests_properties(fuzz_replay_seeds PROPERTIES FIXTURES_SETUP fuzz_replay_seeds LABELS "fuzz_replay" TIMEOUT 60)
math(EXPR _replay_timeout "${H5CKPT_FUZZ_REPLAY_SECONDS} * 3 + 60")
foreach(t metadata meta_v2 loader_state wire index_records)
  add_executable(fuzz_replay_${t} fuzz/fuzz_${t}.cpp fuzz/replay_main.cpp)
  target_link_libraries(fuzz_replay_${t} PRIVATE h5ckpt_internal)
  if(t STREQUAL "metadata")
    set(_seed_dir ${PROJECT_SOURCE_DIR}/fuzz/seeds/metadata)
  else()
    set(_seed_dir ${_replay_dir}/seeds/${t})
    file(MAKE_DIRECTORY ${_seed_dir})  # index_records has none: the driver starts from random inputs
  endif()
  add_test(NAME fuzz_replay_${t}
    COMMAND fuzz_replay_${t} -seconds=${H5CKPT_FUZZ_REPLAY_SECONDS} -crash=${_replay_dir}/crash-${t} ${_seed_dir})
  set_tests_properties(fuzz_replay_${t} PROPERTIES FIXTURES_REQUIRED fuzz_replay_seeds LABELS "fuzz_replay"
    TIMEOUT ${_replay_timeout} PASS_REGULAR_EXPRESSION "no crash")
endforeach()
