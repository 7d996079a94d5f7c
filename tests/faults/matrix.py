"""The fault matrix (issue 25, item 1): every stage against every fault, with the outcome a test proves.

One table, two uses (a cell may be proven by several tests, each listed, with one outcome): `tests/faults/test_matrix.py` checks that every cell names a test that exists, and
`python -m tests.faults.matrix` renders `docs/recovery.md` from it (a test fails when the file is stale), so the
documentation cannot drift from what is tested. A cell no test proves yet is rendered as such, not guessed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "recovery.md"

STAGES = (
    "clean",
    "dedup",
    "train-tokenizer",
    "tokenize",
    "train",
    "export",
    "finetune",
    "transfer",
    "continue",
    "decay",
    "ladder",
    "mixture",
    "evaluate",
    "launch",
)
FAULTS = (
    "SIGKILL",
    "SIGINT / SIGTERM",
    "full disk",
    "damaged input",
    "damaged output of the previous stage",
    "changed setting on rerun",
    "bad path or host in the config",
    "existing output folder",
    "read-only run folder",
    "another world size on resume",
    # issue 64: the faults of the capabilities added since (spike rollback, the watchdog, init_from, continue)
    "a trigger that recurs",
    "suspension of the whole job",
    "a hung rank",
    "hostile input",
)
OUTCOMES = ("resumed exactly", "redone", "refused")


@dataclass(frozen=True)
class Cell:
    stage: str
    fault: str
    outcome: str  # one of OUTCOMES
    what: str  # what the user sees
    test: str  # path::test_name that proves it


CELLS: tuple[Cell, ...] = (
    # --- train
    Cell(
        "train",
        "SIGKILL",
        "resumed exactly",
        "an FP8 run (model.float8, torchao; Llama and GPT-2 emulated on 2 CPU ranks) killed after a checkpoint "
        "resumes bit-exact: "
        "its weights and loss trace are the uninterrupted FP8 run's (float8 scales are recomputed each step: no "
        "state to restore)",
        "tests/pretrain/test_float8.py::test_fp8_trains_like_bf16_resumes_exactly_and_exports_as_a_bf16_run_does",
    ),
    Cell(
        "train",
        "hostile input",
        "refused",
        "model.float8 where it cannot hold (a family without declared FP8 linears, fp16, ZeRO-3, a width not a "
        "multiple of 16) is "
        "refused at load naming the key; on a GPU below compute capability 8.9, or CPU without emulation, before "
        "anything is built",
        "tests/pretrain/test_float8.py::test_bad_float8_configs_are_refused_at_load_naming_the_key",
    ),
    Cell(
        "train",
        "SIGKILL",
        "resumed exactly",
        "every family resumes from the newest complete checkpoint, bit-exact: weights and loss trace of "
        "ModernBERT, ELECTRA, T5, GPT-2 and Llama after 3 kills (one mid-checkpoint); RoBERTa after 20 kills in "
        "tests/pretrain/test_chaos.py",
        "tests/pretrain/test_exact_resume.py::test_sigkill_anywhere_then_resume_is_bit_exact",
    ),
    Cell(
        "train",
        "SIGKILL",
        "resumed exactly",
        "killed while a checkpoint is hashed and marked complete in the background (training already past it): "
        "the previous complete checkpoint is still `latest`, the resume is bit-exact",
        "tests/pretrain/test_async_checkpoint.py::test_kill_during_background_hashing_keeps_latest_and_resumes_exactly",
    ),
    Cell(
        "train",
        "SIGKILL",
        "resumed exactly",
        "a remote run killed while a checkpoint is uploaded in the background: the bucket's `latest` is still the "
        "previous complete checkpoint, from which a fresh node resumes",
        "tests/pretrain/test_async_checkpoint.py::test_kill_during_upload_keeps_the_previous_checkpoint_in_the_bucket",
    ),
    Cell(
        "train",
        "SIGINT / SIGTERM",
        "resumed exactly",
        "checkpoint at the next step end, exit 75; `launch run` exits 75 only when a checkpoint was written",
        "tests/faults/test_launch_faults.py::test_exit_75_only_when_a_checkpoint_was_written_at_the_signal",
    ),
    Cell(
        "train",
        "full disk",
        "refused",
        "the path and free space named, the partial folder removed, exit 65",
        "tests/pretrain/test_resume_safety.py::test_disk_full_names_the_path_and_removes_the_partial_folder",
    ),
    Cell(
        "train",
        "damaged output of the previous stage",
        "refused",
        "a token shard whose size, sha256 or ids disagree with the manifest: the file named, rerun tokenize",
        "tests/faults/test_token_shards.py::test_bytes_changed_inside_a_bin_are_caught_by_sha256",
    ),
    Cell(
        "train",
        "damaged input",
        "redone",
        "a damaged newest checkpoint is skipped with a warning naming the file; the previous one is used",
        "tests/pretrain/test_resume_safety.py::test_damaged_checkpoints_fall_back_then_stop_without_requeue",
    ),
    Cell(
        "train",
        "changed setting on rerun",
        "refused",
        "run.seed / tokenizer / data sources / packing: the key named, a new output folder or --reset-data-order",
        "tests/faults/test_resume_data_order.py::"
        "test_train_refuses_a_changed_seed_then_resets_the_data_order_on_request",
    ),
    Cell(
        "train",
        "bad path or host in the config",
        "refused",
        "`plan` and `train`: bad resume path, fp16 on CPU, unwritable output, checkpoint.dir under a file",
        "tests/faults/test_plan_checks.py::test_plan_refuses_what_train_refuses",
    ),
    Cell(
        "train",
        "SIGKILL",
        "resumed exactly",
        "killed as a spike rollback starts (the spike named, the checkpoint being reloaded): the restart meets the "
        "same spike at the same step, rolls back the same way, and ends with the same weights and rollback record "
        "as the run that was not killed",
        "tests/pretrain/test_spikes_ranks.py::test_a_kill_during_a_rollback_resumes_exactly",
    ),
    Cell(
        "train",
        "a trigger that recurs",
        "refused",
        "a spike (or non-finite loss) that comes back after each rollback: after spikes.max_rollbacks rollbacks to "
        "the same checkpoint every rank exits 79 naming the step and the checkpoint, which is kept; it used to "
        "reload that checkpoint for ever",
        "tests/pretrain/test_spikes_ranks.py::test_a_spike_that_recurs_after_each_rollback_stops_the_run",
    ),
    Cell(
        "train",
        "existing output folder",
        "resumed exactly",
        "a step folder that is a link (to another run's checkpoint) among the old ones: pruning removes the link "
        "alone, names it, and the other run's checkpoint keeps its COMPLETE and every file",
        "tests/faults/test_linked_checkpoints.py::test_training_past_a_linked_old_checkpoint_leaves_the_other_run_resumable",
    ),
    Cell(
        "train",
        "suspension of the whole job",
        "resumed exactly",
        "torchrun and every rank SIGSTOPped past watchdog.hang_timeout_s, then continued (scontrol suspend, "
        "Ctrl-Z, a paused VM): one line per rank says how long it was not running, and the run finishes every "
        "step, exit 0, no hang report",
        "tests/pretrain/test_hang_suspend.py::test_a_whole_job_suspended_past_the_hang_limit_goes_on_and_finishes",
    ),
    Cell(
        "train",
        "suspension of the whole job",
        "resumed exactly",
        "one process stopped past the limit and continued is not hung; one that stays without progress after "
        "SIGCONT is, counted from SIGCONT",
        "tests/pretrain/test_watchdog_suspend.py::test_a_process_stopped_past_the_hang_limit_is_not_hung",
    ),
    Cell(
        "train",
        "a hung rank",
        "refused",
        "one rank SIGSTOPped while the others wait in the step's reduction: report.txt names that rank as "
        "stopped at the step and phase it froze in, and the run ends (exit 69) within hang_timeout_s + 3 "
        "heartbeats + 5 s",
        "tests/pretrain/test_hang_suspend.py::test_one_rank_stopped_is_named_at_its_step_and_the_run_ends_within_the_grace",
    ),
    Cell(
        "export",
        "existing output folder",
        "refused",
        "a folder or link named `.<out>.staging` beside the target that no export made: named, nothing written "
        "or removed (only a staging folder an export marked is cleared)",
        "tests/faults/test_export_target.py::test_a_staging_name_beside_the_target_that_is_not_ours_is_refused_untouched",
    ),
    Cell(
        "clean",
        "damaged input",
        "refused",
        "a blocklist entry that could never match (a path in a domain list, a wildcard inside a name, spaces, an "
        "invalid label) at load, naming the key, file, line and entry and the form expected; URLs, `*.` and `.` "
        "wildcards, trailing dots, ports, hosts-file and adblock lines and either IDN form are read as their domain",
        "tests/data_pipeline/test_hygiene.py::test_blocklist_entry_that_could_never_match_is_refused_naming_file_line_entry",
    ),
    Cell(
        "clean",
        "damaged input",
        "refused",
        "a binary or non-UTF-8 blocklist at load, naming the file",
        "tests/data_pipeline/test_hygiene.py::test_binary_blocklist_is_refused_naming_the_file",
    ),
    Cell(
        "clean",
        "damaged input",
        "refused",
        "an empty, binary or non-UTF-8 evaluation file for decontamination, named when clean starts, before any "
        "shard",
        "tests/data_pipeline/test_decontaminate.py::test_empty_or_non_utf8_eval_file_is_refused_naming_it",
    ),
    Cell(
        "clean",
        "bad path or host in the config",
        "refused",
        "a directory given as a blocklist or evaluation file is said to be a directory, not missing",
        "tests/data_pipeline/test_hygiene.py::test_blocklist_directory_is_reported_as_a_directory",
    ),
    Cell(
        "train",
        "hostile input",
        "refused",
        "a model.init_from export whose weights changed after export (one flipped bit): refused at load, as adapt "
        "refuses it",
        "tests/runconfig/test_init_from.py::test_an_export_whose_weights_changed_since_export_is_refused_at_load",
    ),
    Cell(
        "train",
        "hostile input",
        "refused",
        "eval.tasks naming no local task (the close match and the local ones listed), on an encoder or "
        "text-to-text family, or at ZeRO-3: refused at load, naming the key",
        "tests/runconfig/test_eval_tasks_config.py::test_refused_at_load_naming_the_key",
    ),
    Cell(
        "train",
        "hostile input",
        "refused",
        "an eval.tasks data file gone from <run>/eval_tasks: before the first step every rank stops with one line "
        "naming the file (CANNOT_CONTINUE), none waits for rank 0 at the first eval",
        "tests/pretrain/test_eval_signal.py::test_a_task_file_gone_stops_every_rank_in_one_line",
    ),
    Cell(
        "train",
        "hostile input",
        "refused",
        "a truncated model.safetensors in model.init_from: one line naming the file, at load and at plan, before "
        "any rank starts",
        "tests/runconfig/test_init_from.py::test_a_truncated_safetensors_is_refused_at_load_and_plan_naming_the_file",
    ),
    Cell(
        "train",
        "changed setting on rerun",
        "refused",
        "a tokenizer (init_from or tokenizer.pretrained_path) that gives tokens other ids than the run's "
        "tokenizer/, which tokens/ were made with: both folders and one moved id named",
        "tests/runconfig/test_init_from.py::test_a_tokenizer_whose_ids_differ_from_the_runs_tokenizer_is_refused",
    ),
    Cell(
        "finetune",
        "bad path or host in the config",
        "refused",
        "`--model` a missing folder or a hub name: one line naming it; nothing is downloaded",
        "tests/adapt/test_messages.py::test_a_missing_model_folder_is_one_line_naming_it_and_no_hub_lookup",
    ),
    Cell(
        "continue",
        "SIGKILL",
        "redone",
        "`adapt continue` killed mid-pretraining: its trainer checkpoints at the signal and stops with it; the "
        "rerun reuses the baseline and continues the continued run from its last checkpoint to the full step count",
        "tests/faults/test_continue_faults.py::test_a_killed_adapt_continue_resumes_its_continued_run_on_rerun",
    ),
    Cell(
        "continue",
        "changed setting on rerun",
        "refused",
        "a continued/ folder that continues another export or other task text (continued/source.json): named, "
        "never resumed into a mix",
        "tests/faults/test_continue_faults.py::test_a_continued_folder_of_another_export_is_refused_not_resumed",
    ),
    Cell(
        "train",
        "hostile input",
        "refused",
        "a pickle payload (`__reduce__` calling os.system) planted in a checkpoint's model states, an optimizer "
        "shard or an RNG file, COMPLETE recomputed to match: every pickle is scanned before DeepSpeed or lmstack "
        "loads it, on resume, before the universal conversion at another world size, and on a spike rollback; one "
        "line names the file and the global, exit 65, the payload never runs (docs/security.md)",
        "tests/pretrain/test_checkpoint_pickles.py::test_a_payload_planted_in_any_checkpoint_file_is_refused_and_never_runs",
    ),
    Cell(
        "train",
        "hostile input",
        "refused",
        "a planted checkpoint reloaded by a spike rollback: refused, naming the file; the payload never runs",
        "tests/pretrain/test_safe_load.py::test_a_rollback_reload_refuses_a_planted_checkpoint",
    ),
    Cell(
        "export",
        "hostile input",
        "refused",
        "a pickle payload in parity_probe.pt, the model states or an optimizer shard: one line naming the file and "
        "the global, exit 65, no export written, the payload never runs",
        "tests/pretrain/test_checkpoint_pickles.py::test_a_payload_planted_in_any_checkpoint_file_is_refused_and_never_runs",
    ),
    Cell(
        "launch",
        "hostile input",
        "refused",
        "a hostfile line `-oProxyCommand=... slots=2`: refused at load naming the hostfile, line and host (a host "
        "is a host name or an IP address); every ssh gets `--` before the host, so nothing runs",
        "tests/faults/test_launch_faults.py::test_a_hostfile_host_is_never_passed_to_ssh_as_an_option",
    ),
    # --- tokenize
    Cell(
        "tokenize",
        "damaged output of the previous stage",
        "refused",
        "a cleaned or deduplicated shard cut, changed or copied over (size, sha256 against its stage's marker): "
        "the file named and the stage to rerun, which rewrites it",
        "tests/faults/test_data_stage_faults.py::test_tokenizer_and_tokenize_refuse_a_damaged_deduplicated_shard",
    ),
    Cell(
        "tokenize",
        "changed setting on rerun",
        "redone",
        "a new tokenizer (its sha256: e.g. tokenizer.vocab_size changed and retrained), splitter or input: those "
        "shards written again, the rest kept; a token shard damaged since it was written is written again too",
        "tests/faults/test_data_stage_faults.py::test_changed_settings_on_rerun_redo_what_they_affect",
    ),
    Cell(
        "tokenize",
        "SIGKILL",
        "resumed exactly",
        "finished shards kept, the rest redone, temporary files removed: the same bytes as an uninterrupted run",
        "tests/faults/test_data_stage_faults.py::test_stage_stopped_while_writing_then_rerun_gives_the_same_bytes",
    ),
    # --- clean
    Cell(
        "clean",
        "damaged input",
        "refused",
        "cut WARC / zstd inputs reported with the last good offset, good records kept",
        "tests/data_pipeline/test_readers_damage.py::test_truncated_compressed_jsonl_is_reported_with_last_good_offset",
    ),
    Cell(
        "clean",
        "bad path or host in the config",
        "refused",
        "a source name that would leave run.output_dir (separator, '..', absolute) refused at load",
        "tests/faults/test_path_components.py::test_source_name_that_leaves_its_folder_is_refused",
    ),
    Cell(
        "clean",
        "SIGKILL",
        "redone",
        "orphaned temporary files of an interrupted write removed on the next run",
        "tests/data_pipeline/test_empty_stage.py::test_orphaned_shard_temp_files_are_removed_on_the_next_run",
    ),
    # --- data stages (issue 25 items 1-2): clean, dedup, train-tokenizer, tokenize
    Cell(
        "clean",
        "SIGINT / SIGTERM",
        "resumed exactly",
        "exit 130 / 143 with one line naming the signal and the command to rerun; workers finish the shard in "
        "hand; the rerun does the rest: the same bytes as an uninterrupted run",
        "tests/faults/test_data_stage_faults.py::test_stage_stopped_while_writing_then_rerun_gives_the_same_bytes",
    ),
    Cell(
        "clean",
        "changed setting on rerun",
        "redone",
        "a changed cleaning setting or filter code redoes the finished shards of the sources it applies to, naming "
        "the keys (`clean: redoing 3 finished shard(s) of news: settings changed: min_chars`)",
        "tests/faults/test_data_stage_faults.py::test_changed_settings_on_rerun_redo_what_they_affect",
    ),
    Cell(
        "dedup",
        "SIGKILL",
        "resumed exactly",
        "finished tasks kept, the rest redone, the killed writes' temporary files removed: the same bytes as an "
        "uninterrupted run",
        "tests/faults/test_data_stage_faults.py::test_stage_stopped_while_writing_then_rerun_gives_the_same_bytes",
    ),
    Cell(
        "dedup",
        "SIGINT / SIGTERM",
        "resumed exactly",
        "exit 130 / 143 with one line; tasks in hand finish with their markers; the rerun does the rest, same bytes",
        "tests/faults/test_data_stage_faults.py::test_stage_stopped_while_writing_then_rerun_gives_the_same_bytes",
    ),
    Cell(
        "dedup",
        "damaged input",
        "refused",
        "a file of its own work folder that vanished between stages: the task and the file named",
        "tests/data_pipeline/test_dedup_sharded.py::test_vanished_intermediate_file_is_named",
    ),
    Cell(
        "dedup",
        "damaged output of the previous stage",
        "refused",
        "a cleaned shard cut, changed or copied over (size, sha256 against clean's marker; "
        "data.verify_checksums=false: size only): the file named, rerun clean, which rewrites it",
        "tests/faults/test_data_stage_faults.py::test_dedup_refuses_a_damaged_cleaned_shard_and_clean_rewrites_it",
    ),
    Cell(
        "dedup",
        "changed setting on rerun",
        "redone",
        "a changed data.dedup setting or cleaned input: every task redone in a new work folder; a deduplicated "
        "shard damaged since it was written is written again",
        "tests/faults/test_data_stage_faults.py::test_changed_settings_on_rerun_redo_what_they_affect",
    ),
    Cell(
        "train-tokenizer",
        "SIGKILL",
        "redone",
        "trained again; the killed save's staging folder removed: the same bytes as an uninterrupted run",
        "tests/faults/test_data_stage_faults.py::test_stage_stopped_while_writing_then_rerun_gives_the_same_bytes",
    ),
    Cell(
        "train-tokenizer",
        "SIGINT / SIGTERM",
        "redone",
        "exit 130 / 143 with one line, no staging folder left; the rerun trains again, same bytes",
        "tests/faults/test_data_stage_faults.py::test_stage_stopped_while_writing_then_rerun_gives_the_same_bytes",
    ),
    Cell(
        "train-tokenizer",
        "damaged output of the previous stage",
        "refused",
        "a deduplicated (or cleaned) shard cut, changed or copied over: the file named, rerun dedup (or clean)",
        "tests/faults/test_data_stage_faults.py::test_tokenizer_and_tokenize_refuse_a_damaged_deduplicated_shard",
    ),
    Cell(
        "train-tokenizer",
        "changed setting on rerun",
        "redone",
        "always trains again, so tokenizer.* changes apply; tokenize then rewrites every shard (new tokenizer sha256)",
        "tests/faults/test_data_stage_faults.py::test_changed_settings_on_rerun_redo_what_they_affect",
    ),
    Cell(
        "tokenize",
        "SIGINT / SIGTERM",
        "resumed exactly",
        "exit 130 / 143 with one line; shards in hand finish; the rerun does the rest, same bytes",
        "tests/faults/test_data_stage_faults.py::test_stage_stopped_while_writing_then_rerun_gives_the_same_bytes",
    ),
    Cell(
        "tokenize",
        "damaged input",
        "refused",
        "a tokenizer that gives a token id outside its vocabulary: shard, document and offset named",
        "tests/faults/test_token_shards.py::test_token_id_outside_the_vocabulary_is_named_at_tokenize",
    ),
    Cell(
        "train-tokenizer",
        "damaged input",
        "refused",
        "input that yields no text (a 1-byte WARC: the clean stage kept nothing): the stage and its shards named, "
        "no tokenizer written",
        "tests/data_pipeline/test_empty_stage.py::test_one_byte_warc_is_reported_and_empty_corpus_stops_tokenizer",
    ),
    *(
        Cell(
            stage,
            "full disk",
            "refused",
            "one line naming the run folder and its free space (exit 65, as checkpoint and export); every shard "
            "with a marker matches it and the stage is not marked done; with space again the rerun ends with the "
            "same bytes as an uninterrupted run",
            "tests/faults/test_data_stage_faults.py::test_full_disk_is_named_and_nothing_partial_is_kept_as_done",
        )
        for stage in ("clean", "dedup", "train-tokenizer", "tokenize")
    ),
    # --- export
    Cell(
        "export",
        "SIGKILL",
        "redone",
        "the previous export stays whole; the next export clears the staging folder",
        "tests/faults/test_export_faults.py::test_export_is_staged_bound_to_its_weights_and_names_its_step",
    ),
    Cell(
        "export",
        "SIGINT / SIGTERM",
        "redone",
        "the 20-kill soak: every stage from clean to export SIGKILLed or SIGTERMed (also mid-write) and rerun; "
        "shards, tokenizer and tokens byte-equal and exported weights bit-equal to an uninterrupted run's, "
        "no temporary file left",
        "tests/faults/test_soak.py::test_twenty_kills_over_every_stage_then_same_outputs",
    ),
    Cell(
        "export",
        "full disk",
        "refused",
        "the folder and free space named, exit 65; the staging folder removed, the previous export left whole",
        "tests/faults/test_export_disk_full.py::test_export_on_a_full_disk_is_named_and_keeps_the_previous_export",
    ),
    Cell(
        "export",
        "damaged input",
        "refused",
        "a swapped tokenizer: the checkpoint and the tokenizer folder named with both sizes",
        "tests/faults/test_swapped_tokenizer.py::test_swapped_tokenizer_is_named_on_resume_and_export",
    ),
    Cell(
        "export",
        "damaged output of the previous stage",
        "redone",
        "`latest` names an incomplete step: the export says so and takes the newest complete one",
        "tests/faults/test_export_faults.py::test_export_is_staged_bound_to_its_weights_and_names_its_step",
    ),
    Cell(
        "export",
        "changed setting on rerun",
        "redone",
        "another checkpoint or a changed export.* key: the folder is written again with them (the card shows "
        "the new license) and the earlier weights' results are not carried over",
        "tests/faults/test_export_faults.py::test_export_is_staged_bound_to_its_weights_and_names_its_step",
    ),
    Cell(
        "export",
        "existing output folder",
        "refused",
        "`--out` (or <run>/export) that exists and is not an export of ours (a user's folder, the run's "
        "checkpoints, the run folder, a file): named, exit 2, before any work, nothing in it touched; a "
        "user's own `<out>.old` beside it is never touched either",
        "tests/faults/test_export_target.py::test_export_refuses_a_target_that_is_not_one_of_ours",
    ),
    Cell(
        "export",
        "read-only run folder",
        "refused",
        "without `--out`: one line naming the unwritable folder and `--out`, exit 2; with `--out` a writable "
        "folder the export is written, the run's unwritable log file said once on stderr",
        "tests/faults/test_export_target.py::"
        "test_export_of_a_read_only_run_without_out_is_one_line_naming_the_folder",
    ),
    # --- finetune (`adapt finetune`; `adapt transfer` reads its labelled data the same way)
    Cell(
        "finetune",
        "damaged input",
        "refused",
        "bytes that are not UTF-8: the task key, file and line named before any training; rows with empty, "
        "whitespace-only or null text skipped, counted and named per split, never trained on or scored",
        "tests/adapt/test_finetune.py::test_bad_text_is_named_or_skipped_by_name",
    ),
    Cell(
        "finetune",
        "bad path or host in the config",
        "refused",
        "a missing task file or column, labels only in test, an empty split: one line naming the task key, "
        "exit 2, no traceback",
        "tests/adapt/test_finetune.py::test_bad_labelled_data_is_one_line_with_the_usage_exit_code",
    ),
    # --- transfer
    Cell(
        "transfer",
        "changed setting on rerun",
        "refused",
        "results measured on other weights are left off the card (bound to the weight hash)",
        "tests/faults/test_export_faults.py::test_export_is_staged_bound_to_its_weights_and_names_its_step",
    ),
    Cell(
        "transfer",
        "full disk",
        "refused",
        "one line naming the file and the free space (exit 65); the previous transfer.json stays whole",
        "tests/faults/test_transfer_disk_full.py::test_a_report_that_does_not_fit_keeps_the_previous_one",
    ),
    Cell(
        "transfer",
        "bad path or host in the config",
        "refused",
        "a task name that would leave its folder refused at load",
        "tests/faults/test_path_components.py::test_run_and_task_names_that_leave_their_folder_are_refused",
    ),
    Cell(
        "transfer",
        "SIGKILL",
        "redone",
        "every fine-tune is run again; the previous transfer.json stays whole in the export and the output "
        "folder, nothing temporary is left, and the rerun reports what an uninterrupted run reports",
        "tests/faults/test_transfer_faults.py::test_a_killed_transfer_keeps_the_previous_report_and_the_rerun_"
        "reports_the_same",
    ),
    Cell(
        "transfer",
        "SIGINT / SIGTERM",
        "redone",
        "as SIGKILL: the previous transfer.json stays whole; the rerun gives the uninterrupted run's report",
        "tests/faults/test_transfer_faults.py::test_a_killed_transfer_keeps_the_previous_report_and_the_rerun_"
        "reports_the_same",
    ),
    Cell(
        "transfer",
        "damaged input",
        "refused",
        "a missing task file, a missing text or label column, labels only in the test split: the task key named "
        "before any training",
        "tests/adapt/test_finetune.py::test_bad_tasks_are_named_before_any_training",
    ),
    Cell(
        "transfer",
        "damaged output of the previous stage",
        "refused",
        "an export whose weights differ from the hash in its COMPLETE, or one of ours without COMPLETE: the "
        "folder named, export again; nothing trained or written (a plain HF folder is used as given)",
        "tests/faults/test_transfer_faults.py::test_an_export_changed_since_it_was_written_is_refused_before_any_"
        "training",
    ),
    Cell(
        "train",
        "another world size on resume",
        "resumed exactly",
        "a ZeRO checkpoint of another world size loads through DeepSpeed's universal checkpoint: the same samples "
        "in the same global order and the uninterrupted run's loss curve (ZeRO-2 2→1→2 ranks within 1e-5 "
        "relative, tests/pretrain/test_world_size_model.py; ZeRO-3 2→1 with Adam's step count per sub-group, "
        "which DeepSpeed 0.19.8 shared between them)",
        "tests/pretrain/test_world_size_model.py::test_zero3_two_to_one_rank_matches_uninterrupted_run",
    ),
    # --- launch
    Cell(
        "launch",
        "bad path or host in the config",
        "refused",
        "unreachable hosts named within launch.ssh_connect_timeout_s, an unreachable master within "
        "deepspeed.comm_timeout_s, a master port held by another service at its first answer; a loopback "
        "multi-node hostfile refused",
        "tests/faults/test_launch_faults.py::test_unreachable_hosts_are_named_within_the_connect_timeout",
    ),
    Cell(
        "launch",
        "SIGKILL",
        "resumed exactly",
        "torchrun gets a parent-death signal (SIGTERM) and shuts its ranks down, which checkpoint at the step "
        "end; nothing is left training or holding the master port, and the rerun resumes from that checkpoint",
        "tests/launch/test_run_integration.py::test_sigkill_of_launch_run_takes_torchrun_and_the_ranks_down",
    ),
    Cell(
        "launch",
        "SIGINT / SIGTERM",
        "refused",
        "Ctrl-C before any checkpoint: the ranks' exit code and a line saying no checkpoint was written, not 75",
        "tests/faults/test_launch_faults.py::test_exit_75_only_when_a_checkpoint_was_written_at_the_signal",
    ),
    # --- issue 65: the run's contract (callbacks, one checkpoint manager, steps and methods declared once)
    Cell(
        "train",
        "SIGKILL",
        "resumed exactly",
        "a callback's state (an outside callback counting steps) rides in every checkpoint: the run resumed from "
        "step 3 holds, at step 6, the state of the uninterrupted run",
        "tests/pretrain/test_callbacks.py::test_a_callback_s_state_round_trips_through_a_checkpoint_exactly",
    ),
    Cell(
        "train",
        "a trigger that recurs",
        "refused",
        "an outside package's guard (one file, one entry point) stops a real run at its condition: every rank "
        "exits with the guard's code, one line naming its setting",
        "tests/test_extending_guide.py::test_guide_callback_stops_a_real_run_with_its_exit_code",
    ),
    Cell(
        "train",
        "hostile input",
        "refused",
        "an outside callback's misspelled setting, a setting of the wrong type or an unknown callback name stops "
        "the load in one line naming the valid keys or the registered names",
        "tests/test_extending_guide.py::test_guide_callback_settings_are_checked_at_load",
    ),
    Cell(
        "train",
        "hostile input",
        "refused",
        "μP with a base width above the model's, without a base width, or on a family that does not declare it "
        "is refused at load naming the key",
        "tests/pretrain/test_mup.py::test_bad_mup_settings_are_refused_at_load",
    ),
    Cell(
        "train",
        "changed setting on rerun",
        "refused",
        "a removed key (a former bench knob) set to anything but its former default stops the load naming the "
        "key and what to do instead; at its former default (an old resolved config) it loads",
        "tests/runconfig/test_removed_keys.py::test_a_removed_key_set_otherwise_is_refused_naming_what_to_do",
    ),
    Cell(
        "clean",
        "hostile input",
        "refused",
        "a cleaning step's setting of the wrong type, misspelt, or removed (the PII placeholders) is refused at "
        "load in one line naming the key, with a close match or the replacement",
        "tests/data_pipeline/test_chain_steps.py::test_removed_and_mistyped_step_settings_are_refused_at_load_in_one_line",
    ),
    Cell(
        "clean",
        "hostile input",
        "refused",
        "an outside step's parameter of the wrong type or misspelt is refused when clean starts, before any "
        "shard, naming data.clean.filters.N.params.<key>",
        "tests/data_pipeline/test_chain_steps.py::test_an_outside_steps_params_are_typed_by_its_constructor",
    ),
    Cell(
        "finetune",
        "hostile input",
        "refused",
        "an unknown adaptation method, or a misspelled or removed finetune.<method> key, exits 2 at load naming "
        "the key and the registered methods or the method's keys, before any model is read",
        "tests/runconfig/test_finetune_methods.py::test_adapt_refuses_a_bad_method_at_load_in_one_line",
    ),
    Cell(
        "export",
        "hostile input",
        "refused",
        "`--merge-last K` with fewer than K complete checkpoints, or checkpoints of different tensors, is "
        "refused in one line naming what the folder holds",
        "tests/pretrain/test_merge.py::test_the_mean_and_the_tags",
    ),
    Cell(
        "decay",
        "SIGKILL",
        "resumed exactly",
        "a cool-down branch killed after its first checkpoint resumes from its own checkpoint, not the run's; "
        "its losses equal an independent WSD run of the same length within 1e-4",
        "tests/pretrain/test_decay.py::test_a_killed_branch_resumes_and_equals_an_independent_wsd_run",
    ),
    Cell(
        "decay",
        "hostile input",
        "refused",
        "a run without WSD, a step in the warmup or the decay phase, a step with no complete checkpoint (the "
        "stable-phase ones listed) or no steps is refused in one line naming the flag",
        "tests/pretrain/test_decay.py::test_bad_branches_are_refused_naming_the_flag",
    ),
    Cell(
        "ladder",
        "SIGKILL",
        "redone",
        "a killed ladder keeps its finished rungs (rung.json untouched) and reruns the others, the unfinished "
        "rung from its own latest checkpoint",
        "tests/pretrain/test_ladder.py::test_a_killed_ladder_reruns_only_unfinished_rungs",
    ),
    Cell(
        "ladder",
        "SIGINT / SIGTERM",
        "redone",
        "Ctrl-C, SIGTERM or SIGUSR1 on `pretrain ladder` is passed to the training rung's ranks, which checkpoint; "
        "the ladder waits for them and exits 75 naming the rung, no rank left running, and a rerun resumes that "
        "rung from its checkpoint (mixture's proxy runs are started the same way, by the same function)",
        "tests/pretrain/test_ladder.py::test_ctrl_c_on_a_ladder_checkpoints_the_rung_exits_75_and_a_rerun_resumes_it",
    ),
    Cell(
        "ladder",
        "changed setting on rerun",
        "redone",
        "a rung whose settings differ from its rung.json's (another --hparams, --tokens-per-param or config "
        "override) is trained again, not kept",
        "tests/pretrain/test_ladder.py::test_a_killed_ladder_reruns_only_unfinished_rungs",
    ),
    Cell(
        "ladder",
        "changed setting on rerun",
        "redone",
        "a rung killed under other settings (its started.json's) starts over in its cleared folder, not from "
        "the other settings' checkpoint; one killed under the same settings resumes its own",
        "tests/pretrain/test_ladder.py::test_a_rung_killed_at_other_settings_starts_over_not_from_its_checkpoints",
    ),
    Cell(
        "ladder",
        "hostile input",
        "refused",
        "a rung that would not fit a rank's memory is refused before any rung trains, naming it and the memory",
        "tests/pretrain/test_ladder.py::test_a_rung_that_would_not_fit_is_refused_before_any_trains",
    ),
    Cell(
        "ladder",
        "hostile input",
        "refused",
        "a rung the config refuses (e.g. narrower than model.mup_base_width) or an unknown --hparams rule is "
        "refused naming the flag and the rung, not a validation traceback",
        "tests/pretrain/test_ladder.py::test_rungs_scale_batch_and_lr_from_the_configs_own_model",
    ),
    Cell(
        "mixture",
        "SIGKILL",
        "redone",
        "a killed mixture search keeps its finished proxy runs (run.json untouched) and reruns the others",
        "tests/pretrain/test_mixture.py::test_a_killed_search_reruns_only_unfinished_runs",
    ),
    Cell(
        "mixture",
        "changed setting on rerun",
        "redone",
        "a proxy run finished or killed at other overrides (another --seed's mixture, --steps, a config "
        "override) starts over in its cleared folder (the links to the run's data kept), not from the other "
        "mixture's checkpoints; a finished one at the same overrides is kept, a killed one resumes its own",
        "tests/pretrain/test_mixture.py::test_a_run_at_other_settings_starts_over_in_its_folder_not_from_its_checkpoints",
    ),
    Cell(
        "mixture",
        "hostile input",
        "refused",
        "a search over one source, or with fewer runs than the fit needs, is refused naming the key",
        "tests/pretrain/test_mixture.py::test_one_source_or_too_few_runs_is_refused",
    ),
    Cell(
        "mixture",
        "hostile input",
        "refused",
        "a source too small to fill its share without repeating it more than --max-epochs times is capped (sampled "
        "and proposed mixtures alike); runs too long for all the sources together are refused before any trains",
        "tests/pretrain/test_mixture.py::test_a_killed_search_reruns_only_unfinished_runs",
    ),
    Cell(
        "evaluate",
        "hostile input",
        "refused",
        "an encoder export, an unknown task (the local ones listed, a close match named), a task file that is "
        "gone and a few-shot count above the task's pool are refused in one line before any model loads",
        "tests/adapt/test_evaluate.py::test_bad_input_is_refused_before_any_model_loads",
    ),
    Cell(
        "launch",
        "a hung rank",
        "refused",
        "a node whose ranks end with lmstack's codes exits with the most telling one (69 after a hang, 79, 65), "
        "in one line saying how each rank ended, not torchrun's 1 and traceback",
        "tests/launch/test_rank_exit_codes.py::test_a_rank_s_lmstack_code_is_the_node_s_exit_code",
    ),
    Cell(
        "launch",
        "bad path or host in the config",
        "refused",
        "`pipeline-ray --address` where nothing listens (host:port or ray://) is refused in one line naming "
        "data.ray.address before any stage, not minutes of Ray's reconnect warnings",
        "tests/launch/test_pipeline_ray.py::test_an_address_with_nothing_listening_is_refused_in_one_line",
    ),
)


# Cells that have no meaning, and why: rendered as "n/a", never counted as untested.
NOT_APPLICABLE: dict[tuple[str, str], str] = {
    ("clean", "damaged output of the previous stage"): "clean is the first stage: its input is the raw data",
    **{
        (s, "another world size on resume"): "a data stage has no world size: its tasks are planned from the "
        "inputs, whatever the number of workers that run them"
        for s in ("clean", "dedup", "train-tokenizer", "tokenize")
    },
    **{
        (s, "another world size on resume"): "it runs in one process and reads the consolidated weights"
        for s in ("export", "finetune", "transfer")
    },
    ("launch", "another world size on resume"): "launch starts train with the new world size: the train cell",
    **{
        (s, "a hung rank"): "one process: there is no collective for a rank to hang in"
        for s in ("train-tokenizer", "export", "finetune", "transfer")
    },
    ("launch", "suspension of the whole job"): "the ranks are train's: the train cell",
}


def render() -> str:
    """docs/recovery.md: the grid (a cell per stage and fault) and the list of cells with their tests."""
    by = {(c.stage, c.fault): c for c in CELLS}
    lines = [
        "# Recovery: what happens when a stage meets a fault",
        "",
        "Generated from `tests/faults/matrix.py` by `python -m tests.faults.matrix`; "
        "`tests/faults/test_matrix.py` fails when this file is stale. A cell reads *resumed exactly*, "
        "*redone* or *refused* (with a message naming the file, key or host) and is proven by the test listed "
        "below; `—` marks a cell no test proves yet, `n/a` one that has no meaning. What each fault looks like "
        "from the command line, stage by stage, "
        "and what you do about it: [recovery-details.md](recovery-details.md).",
        "",
        "| stage | " + " | ".join(FAULTS) + " |",
        "|---|" + "---|" * len(FAULTS),
    ]
    for s in STAGES:
        lines.append(
            f"| {s} | "
            + " | ".join(
                by[(s, f)].outcome if (s, f) in by else "n/a" if (s, f) in NOT_APPLICABLE else "—"
                for f in FAULTS
            )
            + " |"
        )
    lines += ["", "## Cells", ""]
    for c in CELLS:
        lines.append(f"- **{c.stage} × {c.fault}: {c.outcome}.** {c.what}. Test: `{c.test}`")
    lines += [f"- **{s} × {f}: n/a.** {why}." for (s, f), why in NOT_APPLICABLE.items()]
    missing = sum((s, f) not in by and (s, f) not in NOT_APPLICABLE for s in STAGES for f in FAULTS)
    lines += ["", f"{missing} of {len(STAGES) * len(FAULTS)} cells are not covered by a test yet.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(render())
    print(DOC, file=sys.stderr)
