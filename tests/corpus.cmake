# Hostile and broken inputs (label `corpus`, issue "never hang, never lose"):
#  - corpus_*: a corrupt-checkpoint corpus made from a real checkpoint (corpus/make_corpus.py:
#    byte flips and truncations of every file, re-signed metadata that lies, bad `latest`
#    pointers); `h5ckpt inspect|verify` (corpus/run_corpus.py) and a verified MPI load at 1 and 2
#    ranks (corpus/corpus_load.cpp) must give a clean error or the original data, never a crash,
#    a hang or wrong data
#  - corpus_hints_np*: MPI-IO hints that crash Open MPI are refused on every rank
#  - corpus_trainer_*: the trainer's size checks and out-of-memory path
#  - test_hostile_inputs: unit tests of the hint checks and their config paths
h5ckpt_unit_test_binary(test_hostile_inputs corpus/test_hostile_inputs.cpp)
h5ckpt_add_unit_test(test_hostile_inputs LABELS corpus)

add_executable(corpus_load ${CMAKE_CURRENT_SOURCE_DIR}/corpus/corpus_load.cpp)
target_link_libraries(corpus_load PRIVATE h5ckpt nlohmann_json::nlohmann_json)  # public API only

# The generator needs only the standard library and libxxhash (ctypes).
find_package(Python3 COMPONENTS Interpreter)
set(_corpus_python "")
foreach(_py IN ITEMS /usr/bin/python3 ${Python3_EXECUTABLE})
  execute_process(COMMAND ${_py} -c "import ctypes, json; ctypes.CDLL('libxxhash.so.0')"
                  RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
  if(_rc EQUAL 0)
    set(_corpus_python ${_py})
    break()
  endif()
endforeach()

set(_corpus_root ${CMAKE_CURRENT_BINARY_DIR}/corpus)
if(_corpus_python)
  # The CLI tests' fixture maker, built here too when the CLI tests are not registered.
  if(NOT TARGET cli_make_fixture)
    add_executable(cli_make_fixture ${CMAKE_CURRENT_SOURCE_DIR}/cli/make_fixture.cpp)
    target_link_libraries(cli_make_fixture PRIVATE h5ckpt)
  endif()
  add_test(NAME corpus_fixture
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 110
            $<TARGET_FILE:cli_make_fixture> ${_corpus_root}/fixture)
  set_tests_properties(corpus_fixture PROPERTIES FIXTURES_SETUP corpus_fixture LABELS "corpus;mpi" PROCESSORS 2
    TIMEOUT 120 ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
  add_test(NAME corpus_generate
    COMMAND ${_corpus_python} ${CMAKE_CURRENT_SOURCE_DIR}/corpus/make_corpus.py
            --fixture ${_corpus_root}/fixture --out ${_corpus_root}/cases)
  set_tests_properties(corpus_generate PROPERTIES FIXTURES_REQUIRED corpus_fixture FIXTURES_SETUP corpus_cases
    LABELS corpus TIMEOUT 120)
  add_test(NAME corpus_cli
    COMMAND ${_corpus_python} ${CMAKE_CURRENT_SOURCE_DIR}/corpus/run_corpus.py
            --h5ckpt $<TARGET_FILE:h5ckpt-cli> --corpus ${_corpus_root}/cases --timeout 60)
  set_tests_properties(corpus_cli PROPERTIES FIXTURES_REQUIRED corpus_cases LABELS corpus TIMEOUT 600)
  foreach(n 1 2)
    add_test(NAME corpus_load_np${n}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 590
              $<TARGET_FILE:corpus_load> load ${_corpus_root}/fixture/ckpts/step-20
              ${_corpus_root}/cases/manifest.json)
    set_tests_properties(corpus_load_np${n} PROPERTIES FIXTURES_REQUIRED corpus_cases LABELS "corpus;mpi"
      PROCESSORS ${n} TIMEOUT 600 ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
  endforeach()
else()
  message(WARNING "no python3 that loads libxxhash.so.0 (apt-get install libxxhash0): corpus tests not registered")
endif()

foreach(n 1 2)
  add_test(NAME corpus_hints_np${n}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 110
            $<TARGET_FILE:corpus_load> hints ${_corpus_root}/hints_np${n})
  set_tests_properties(corpus_hints_np${n} PROPERTIES LABELS "corpus;mpi" PROCESSORS ${n} TIMEOUT 120
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
endforeach()

if(TARGET h5ckpt-train AND _corpus_python)
  set(_train ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 100
             $<TARGET_FILE:h5ckpt-train> --steps 1)
  # tp*dp = 2^32 wrapped to 0 in int ("launch with mpiexec -n 0").
  add_test(NAME corpus_trainer_world_overflow
    COMMAND ${_corpus_python} ${CMAKE_CURRENT_SOURCE_DIR}/corpus/check_cmd.py --rc 2
            --expect "more ranks than MPI can address" --reject "mpiexec -n 0" -- ${_train} --tp 65536 --dp 65536)
  # A model that cannot be allocated (2^40 parameters): a message and status 1, not an abort.
  add_test(NAME corpus_trainer_out_of_memory
    COMMAND ${_corpus_python} ${CMAKE_CURRENT_SOURCE_DIR}/corpus/check_cmd.py --rc 1
            --expect "out of memory building the model|exceed the largest possible buffer"
            -- ${_train} --hidden 1048576 --heads 1 --kv-heads 1 --ffn 1048576 --vocab 1048576 --layers 1)
  set_tests_properties(corpus_trainer_world_overflow corpus_trainer_out_of_memory PROPERTIES
    LABELS "corpus;mpi" TIMEOUT 120 ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
  # Damaged checkpoints are never trained over or overwritten (issue 25): the trainer refuses, and
  # with --start-fresh never writes over what it could not read.
  foreach(n 1 2)
    add_test(NAME corpus_trainer_damaged_dir_np${n}
      COMMAND ${_corpus_python} ${CMAKE_CURRENT_SOURCE_DIR}/corpus/check_trainer_damage.py
              --work ${CMAKE_CURRENT_BINARY_DIR}/trainer_damage_np${n} --
              ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 200
              $<TARGET_FILE:h5ckpt-train> --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 128
              --dp ${n})
    set_tests_properties(corpus_trainer_damaged_dir_np${n} PROPERTIES LABELS "corpus;mpi" PROCESSORS ${n}
      TIMEOUT 600 ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
  endforeach()
endif()
