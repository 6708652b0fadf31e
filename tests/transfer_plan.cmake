# Transfer planning without MPI: who sends which piece, replica balance, rounds under a bound, errors.
h5ckpt_unit_test_binary(test_transfer_plan LINK h5ckpt_planner test_transfer_plan.cpp)
h5ckpt_add_unit_test(test_transfer_plan LABELS transfer)
