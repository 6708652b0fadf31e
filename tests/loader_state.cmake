# Data-loader state: walk, reshard (split/merge over DP), exactly-once, serialization. Not pure:
# LoaderCheckpoint and the extra states (src/extras) stage items for a CheckpointInfo (storage).
h5ckpt_unit_test_binary(test_loader_state LINK h5ckpt_extras test_loader_state.cpp)
h5ckpt_add_unit_test(test_loader_state)
