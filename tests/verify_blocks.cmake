# Verification blocks (storage/verify_blocks.h) and verified region reads: every delivered byte
# checked, relabelled or moved bytes refused. No MPI launch: a raw data file written here.
h5ckpt_unit_test_binary(test_verify_blocks test_verify_blocks.cpp)
h5ckpt_add_unit_test(test_verify_blocks LABELS unit)
