# Retention (keep_last / keep_every, prune), what a directory load selects, the save lock and the
# overwrite publish with its crash windows (storage/retention.h, storage/commit.h). No MPI launch.
h5ckpt_unit_test_binary(test_retention test_retention.cpp)
h5ckpt_add_unit_test(test_retention LABELS retention)
