# Checked-in checkpoints of older formats (tests/fixtures/): format v1 must keep loading.
#  - test_v1_fixture_np{1,2}: read_checkpoint_info, CheckpointReader and a verified collective load
#    of tests/fixtures/v1-checkpoint, every element against the formula it was written from
#  - fixture_v2_rewrite: the same content written by today's library (write_v1_fixture, 4 ranks)
#    and the same checks on it, as format v2
# An MPI gtest binary (mpi_tests/ defines its helpers later: the targets are named here directly).
add_executable(test_v1_fixture ${CMAKE_CURRENT_SOURCE_DIR}/test_v1_fixture.cpp)
target_include_directories(test_v1_fixture PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/fixtures ${PROJECT_SOURCE_DIR}/src
                                                   ${PROJECT_SOURCE_DIR}/mpi_tests)
target_link_libraries(test_v1_fixture PRIVATE h5ckpt_test_support h5ckpt_mpi_gtest_main)
target_compile_definitions(test_v1_fixture PRIVATE H5CKPT_V1_FIXTURE_DIR="${CMAKE_CURRENT_SOURCE_DIR}/fixtures/v1-checkpoint")
h5ckpt_add_mpi_test(test_v1_fixture LABELS "fixture;load" RANKS 1 2 TIMEOUT 120)

# The program that wrote the v1 fixture (public API only), kept buildable as its reference.
add_executable(write_v1_fixture ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/write_v1_fixture.cpp)
target_include_directories(write_v1_fixture PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/fixtures)
target_link_libraries(write_v1_fixture PRIVATE h5ckpt)

set(_v2_rewrite ${CMAKE_CURRENT_BINARY_DIR}/fixtures/v2-rewrite)
add_test(NAME fixture_v2_rewrite_write
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 110
          $<TARGET_FILE:write_v1_fixture> ${_v2_rewrite})
set_tests_properties(fixture_v2_rewrite_write PROPERTIES FIXTURES_SETUP fixture_v2_rewrite LABELS "fixture;mpi"
  PROCESSORS 4 TIMEOUT 120 ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
add_test(NAME fixture_v2_rewrite
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 110
          $<TARGET_FILE:test_v1_fixture>)
set_tests_properties(fixture_v2_rewrite PROPERTIES FIXTURES_REQUIRED fixture_v2_rewrite LABELS "fixture;mpi"
  PROCESSORS 2 TIMEOUT 120
  ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;H5CKPT_FIXTURE_DIR=${_v2_rewrite};H5CKPT_FIXTURE_FORMAT=2")
