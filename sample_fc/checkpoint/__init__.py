"""Training checkpoints: layout.py owns the files of one (names, the COMPLETE test, reading
and checking them, no Horovod needed); save_restore.py writes and restores them; checksums.py
sums each file as it is written and checks it when read; bank_shard.py is one rank's bank shard
on disk (its rows and metadata). The layout is described in
docs/DESIGN.md, "Checkpoints"."""
from .layout import (COMPLETE_FILE, MODEL_PREFIX, OPTIMIZER_FILE, PARTIAL_SUFFIX, PATTERN, STATE_FILE, aux_path,
                     OtherNetworkError, bank_shard_files, check_sound, checkpoint_bytes, checkpoint_path,
                     find_checkpoint, is_complete, list_checkpoints, model_prefix, models_root_of, optimizer_path,
                     param_differences, params_path, previous_checkpoint, rank_state_path, read_complete,
                     read_rank_state, read_state, state_path, symbol_path, verify_files)
from .save_restore import (CheckpointError, check_space, compatible_state, free_bytes,
                           load_optimizer_states, restore_checkpoint, save_checkpoint,
                           save_optimizer_states)
