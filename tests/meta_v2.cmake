# Format-v2 index (storage/meta_v2.h): encoding, the summary, opening an Index over the tables'
# image, every validation failure, reading the tables from a data file. No MPI launch.
h5ckpt_unit_test_binary(test_meta_v2 test_meta_v2.cpp)
target_link_libraries(test_meta_v2 PRIVATE nlohmann_json::nlohmann_json)
h5ckpt_add_unit_test(test_meta_v2 LABELS metadata)
