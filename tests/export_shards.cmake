# `h5ckpt export --max-shard-size` (Hugging Face sharded layout, rename map) on the CLI fixture,
# checked by an independent parser against the fixture's formulas. Needs cli.cmake's python and
# fixture (included before this file).
if(_cli_python)
  add_test(NAME cli_export_shards
    COMMAND ${_cli_python} ${CMAKE_CURRENT_SOURCE_DIR}/cli/check_export_shards.py
            --h5ckpt $<TARGET_FILE:h5ckpt-cli> --root ${_cli_root} --work ${CMAKE_CURRENT_BINARY_DIR}/cli_work/export_shards)
  set_tests_properties(cli_export_shards PROPERTIES FIXTURES_REQUIRED cli_ckpt LABELS "cli;transfer" TIMEOUT 120)
endif()
