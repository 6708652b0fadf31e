# Pure planning of node-local loads (planner/local_reads.h): the pieces of saved rank files a
# wanted shard needs, checked element by element against an independent index computation. No MPI.
h5ckpt_unit_test_binary(test_local_reads LINK h5ckpt_planner test_local_reads.cpp)
h5ckpt_add_unit_test(test_local_reads TIMEOUT 60)
