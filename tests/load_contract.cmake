# The load contract's pure part: problems per item, merging ranks' findings, the wire form, the
# one error message. No MPI (the collective part: mpi_tests/test_load_contract.cpp).
h5ckpt_unit_test_binary(test_load_contract_unit LINK h5ckpt_planner test_load_contract_unit.cpp)
h5ckpt_add_unit_test(test_load_contract_unit)
